"""One cache helper (spmdtorch.lazy.caches): every per-process cache bounded, registered, counted.

Design decision 10 says every cache is bounded and ``clear_caches()`` empties
all of them. These tests hold the package to it by reading its source: a
``functools.cache`` / ``lru_cache`` or a module-level dict that is neither a
registered cache nor a documented table fails here, naming file and line.
"""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug, ops
from spmdtorch.lazy import caches
from spmdtorch.lazy._engine import ENGINE

PKG = pathlib.Path(spmdtorch.__file__).resolve().parent

# Module-level dicts that are tables, not caches: emptying one would lose
# meaning, not just time. Each with why (a new entry here is a design decision).
TABLES = {
    ("runtime/faults.py", "_ACTIVITIES"): "what each thread is doing now, for the watchdog's report",
    ("checkpoint/manager.py", "_held"): "writer locks this process holds",
    ("compat/_dynamo.py", "_TORCH_FNS"): "torch's own backends, put back by uninstall()",
    ("dtensor/_fsdp.py", "_FSDP_CLASSES"): "one FSDP<Class> per module class (as torch's FSDP2 keeps): "
    "evicting one would make a second class of the same name, and isinstance between the two would fail",
    ("compat/_metrics.py", "_DATA_SINCE"): "PyTorch/XLA's metric baselines since the last clear_metrics()",
    ("lazy/metrics.py", "timers"): "the metrics themselves",
    ("lazy/metrics.py", "samples"): "the metrics themselves",
    ("models/_scan_decoder.py", "_CLASSES"): "one generated class per decoder class: identity must hold",
    ("ops/registry.py", "LOWERINGS"): "the op table",
    ("ops/registry.py", "_BRANCHES"): "the op table's host-side branches",
    ("ops/views.py", "VIEW_INVERSES"): "the view table",
    ("sharding/_in_graph.py", "_ANNOTATIONS"): "keys recorded into traced graphs: dropping one breaks a graph",
    ("sharding/_in_graph.py", "_KEYS"): "the reverse of _ANNOTATIONS",
    ("sharding/_marking.py", "CLEARED_AT"): "which tensors clear_sharding reset, weakly held",
    ("tensor/_router.py", "_SPECIAL"): "the router's special-op table",
    ("tensor/_router.py", "PATHS"): "the router's paths",
    ("tensor/_router.py", "_FACTS_BY_ID"): "registered as tensor.dispatch.op_facts (a reset function)",
    ("tensor/dispatch/_functions.py", "FUNCTION_OVERRIDES"): "the torch-function override table",
    ("tensor/multihost.py", "_HOST_PLACED"): "arrays placed from host data, weakly held until freed",
    ("tensor/optim_hooks.py", "_SWITCHED"): "optimizers whose step was switched, weakly held",
    ("tensor/optim_hooks.py", "_OTHER_TYPES"): "parameter types registered at import (XlaDTensor), one entry each",
    ("tensor/xla_tensor.py", "_STAND_INS"): "storage stand-ins: identity must hold while the storage lives",
    ("lazy/rewrite.py", "_INPUT_VIEWS"): "registered with a bound (weakly held per live input)",
    ("compat/_spmd.py", "_OP_SHARDINGS"): "registered with maxsize (PyTorch/XLA's per-mesh cache)",
}
_DICT_FACTORIES = {"dict", "OrderedDict", "WeakKeyDictionary", "WeakValueDictionary", "defaultdict"}


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path.relative_to(PKG).as_posix(), ast.parse(path.read_text(), str(path))


def _is_empty_dict(value: ast.expr) -> bool:
    if isinstance(value, ast.Dict):
        return not value.keys
    if isinstance(value, ast.Call):
        name = getattr(value.func, "id", None) or getattr(value.func, "attr", None)
        return name in _DICT_FACTORIES
    return False


def test_no_module_level_dict_is_an_unregistered_cache():
    found = set()
    for rel, tree in _modules():
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                name, value = node.target.id, node.value
            else:
                continue
            if _is_empty_dict(value):
                found.add((rel, name))
    unknown = sorted(found - set(TABLES))
    assert not unknown, (
        f"module-level dicts {unknown}: a cache must come from spmdtorch.lazy.caches.bounded/memoize "
        "(bounded, registered); a table goes in TABLES here with the reason it is not a cache"
    )
    stale = sorted(set(TABLES) - found)
    assert not stale, f"TABLES names dicts that no longer exist: {stale}"


def _memo_decorators(fn: ast.FunctionDef | ast.AsyncFunctionDef):
    for dec in fn.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = getattr(target, "attr", None) or getattr(target, "id", None)
        if name in {"cache", "lru_cache"}:
            yield dec


def test_functools_caches_only_where_documented():
    """functools.cache/lru_cache only computes-once (no parameters), in ops.MEMOS, or config's settings."""
    memos = {(fn.__module__, fn.__name__) for fn in ops.MEMOS}
    bad = []
    for rel, tree in _modules():
        module = "spmdtorch." + rel[:-3].replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for _dec in _memo_decorators(node):
                a = node.args
                takes_args = a.args or a.posonlyargs or a.kwonlyargs or a.vararg or a.kwarg
                if not takes_args:
                    continue  # computed once: no key space to bound
                if (module, node.name) in memos or (module, node.name) == ("spmdtorch.config", "settings"):
                    continue
                bad.append(f"{rel}:{node.lineno} {node.name}")
    assert not bad, f"use spmdtorch.lazy.caches.memoize (bounded, registered) instead of functools caches: {bad}"


def test_every_registered_cache_is_bounded_and_said_how():
    import spmdtorch.checkpoint.placement  # noqa: F401  (owners register at import)

    stats = debug.cache_stats()
    assert set(stats) == set(debug.cache_sizes())
    for name, s in stats.items():
        assert (s.maxsize is not None and s.maxsize > 0) or s.bound, (name, s)
        if s.maxsize is not None and not name.startswith("test."):
            assert s.size <= s.maxsize, (name, s)
    for fn in ops.MEMOS:  # the ops layer's lru tables are listed under ops.*
        assert any(n.startswith("ops.") and n.endswith(fn.__name__.lstrip("_")) for n in stats), fn


def test_memoize_bounds_counts_bypasses_and_clears():
    calls = []

    @caches.memoize("test.memoize", maxsize=4)
    def f(*key):
        calls.append(key)
        return len(calls)

    try:
        assert f(1) == 1 and f(1) == 1  # a hit does not call
        for i in range(10):
            f(i, "x")
        s = debug.cache_stats()["test.memoize"]
        assert s.size <= 4 and s.evictions > 0 and s.bypasses == 0
        f([1, 2])  # unhashable: runs uncached, counted
        f([1, 2])
        assert debug.cache_stats()["test.memoize"].bypasses == 2
        assert calls[-2:] == [([1, 2],), ([1, 2],)]
        debug.clear_caches()
        assert debug.cache_sizes()["test.memoize"] == 0
        n = len(calls)
        f(1)
        assert len(calls) == n + 1  # recomputed after clear_caches
    finally:
        ENGINE._caches.pop("test.memoize", None)


def test_bounded_cache_put_evicts_oldest_quarter_only_for_new_keys():
    c = caches.BoundedCache(8)
    for i in range(8):
        c.put(i, i)
    c.put(3, "again")  # an existing key never evicts
    assert len(c) == 8 and c.evictions == 0
    c.put(8, 8)
    assert list(c)[:2] == [2, 3] and 8 in c and c.evictions == 2  # the oldest quarter: 0 and 1


def test_meta_cache_counts_unhashable_static_arguments_as_bypasses(devices8):
    from spmdtorch.tensor.dispatch import _meta, op_facts

    before = debug.cache_stats()["tensor.dispatch.meta_cache"].bypasses
    x = torch.ones(2, 3, device="xla")
    add = torch.ops.aten.add.Tensor
    # An argument signature holding a list cannot be a key: the shape is still right, uncached, counted.
    spec = _meta.meta_miss(add, (x, x), {}, op_facts(add), ("add", [1]))
    assert spec.specs[0].shape == (2, 3)
    assert debug.cache_stats()["tensor.dispatch.meta_cache"].bypasses == before + 1


def test_clear_caches_then_results_still_match_eager(devices8):
    a = torch.randn(5, 7)
    y0 = (a.to("xla") * 3 + 1).cpu()
    debug.clear_caches()
    assert all(v == 0 for k, v in debug.cache_sizes().items() if not k.startswith("test.")), debug.cache_sizes()
    y1 = (a.to("xla") * 3 + 1).cpu()
    np.testing.assert_allclose(y0.numpy(), (a * 3 + 1).numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y1.numpy(), y0.numpy())


def test_register_refuses_a_cache_with_no_bound():
    with pytest.raises(ValueError, match="give maxsize=, or bound="):
        caches.register("test.no_bound", {})
    assert "test.no_bound" not in debug.cache_sizes()


@pytest.mark.parametrize("bad", [0, -1, 2.0, None])
def test_bounded_cache_refuses_a_bad_maxsize(bad):
    with pytest.raises(ValueError, match="maxsize must be a positive int"):
        caches.BoundedCache(bad)


def test_memoize_keeps_the_function_name_and_doc():
    @caches.memoize("test.wraps", maxsize=2)
    def named(x):
        """Doc."""
        return x

    try:
        assert named.__name__ == "named" and named.__doc__ == "Doc."
        assert not hasattr(named, "cache_clear")  # not an lru_cache: cleared through the engine only
    finally:
        ENGINE._caches.pop("test.wraps", None)
