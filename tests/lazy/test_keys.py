"""Graph keys: interned node signatures and bounded caches (spmdtorch.lazy.keys)."""

import copy
import pickle

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.lazy import caches, keys
from spmdtorch.lazy.graph import Slot
from spmdtorch.tensor import dispatch


def test_equal_content_same_sig_different_content_different_sig():
    a = keys.node_sig("op", ((Slot(0), 1), ()))
    assert keys.node_sig("op", ((Slot(0), 1), ())) == a
    assert keys.node_sig("op", ((Slot(0), 2), ())) != a
    assert keys.node_sig("other", ((Slot(0), 1), ())) != a
    # A slot never stands for the number with its index.
    assert keys.node_sig("op", ((Slot(1),), ())) != keys.node_sig("op", ((1,), ()))


def test_unhashable_static_key_gets_a_fresh_sig_every_time():
    assert keys.node_sig("op", ([1],)) != keys.node_sig("op", ([1],))


def test_a_full_table_never_hands_an_old_sig_to_new_content(monkeypatch):
    monkeypatch.setattr(keys, "SIG_TABLE_MAX", 2)
    seen = {}
    for i in range(10):
        for content in (("a", i), ("b", i)):
            sig = keys.node_sig(*content)
            assert seen.setdefault(sig, content) == content  # one content per sig, ever


def test_slots_are_interned_and_survive_copies():
    assert Slot(3) is Slot(3)
    assert Slot(3) != Slot(4) and Slot(3) != 3
    assert copy.deepcopy(Slot(5)) is Slot(5)
    assert pickle.loads(pickle.dumps((Slot(2), 1))) == (Slot(2), 1)
    with pytest.raises(TypeError, match="non-negative int"):
        Slot(-1)
    with pytest.raises(TypeError, match="non-negative int"):
        Slot("0")


def test_bounded_cache_stays_bounded_and_keeps_the_newest():
    c = caches.BoundedCache(8)
    for i in range(100):
        c.put(i, i)
        assert len(c) <= 8
    assert c.get(99) == 99 and c.get(0) is None
    with pytest.raises(ValueError, match="maxsize must be a positive int"):
        caches.BoundedCache(0)


def test_meta_cache_is_bounded_and_results_stay_right(monkeypatch):
    cache = dispatch.META_CACHE
    cache.clear()  # only a cache: emptied so that the smaller bound applies from here
    monkeypatch.setattr(cache, "maxsize", 4)
    x = torch.arange(64.0).reshape(8, 8)
    xx = x.to("xla")
    outs = []
    for k in range(1, 13):  # a new static argument every time: a new cache key
        outs.append(torch.roll(xx, k, 0))
        assert len(cache) <= 4
    spmdtorch.sync()  # one program for all twelve
    for k, got in enumerate(outs, 1):
        torch.testing.assert_close(got.cpu(), torch.roll(x, k, 0))


def _run(fn, x):
    out = fn(x.to("xla"))
    spmdtorch.sync()
    return out.cpu()


def test_programs_differing_only_in_a_static_argument_never_share(monkeypatch):
    # With a table of one entry every sig is forgotten at once: if an id were
    # ever reused, the second program would run the first one's reduction.
    monkeypatch.setattr(keys, "SIG_TABLE_MAX", 1)
    x = torch.arange(16.0).reshape(4, 4)
    for _ in range(2):
        torch.testing.assert_close(_run(lambda t: (t * 2).sum(0), x), (x * 2).sum(0))
        torch.testing.assert_close(_run(lambda t: (t * 2).sum(1), x), (x * 2).sum(1))


def test_cache_hits_after_a_shape_dtype_or_sharding_change_stay_right(devices8):
    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    def f(t):
        return (t * 3 + 1).cumsum(0)

    mesh = Mesh(np.arange(8), (8,), ("x",))
    cases = [
        ("f32 8x4", torch.arange(32.0).reshape(8, 4), None),
        ("f32 4x8", torch.arange(32.0).reshape(4, 8), None),
        ("f64 8x4", torch.arange(32.0, dtype=torch.float64).reshape(8, 4), None),
        ("sharded 8x4", torch.arange(32.0).reshape(8, 4), ("x", None)),
        ("f32 8x4 again", torch.arange(32.0).reshape(8, 4) - 5, None),
    ]
    for _ in range(2):  # the second round runs every case from the cache
        hits = debug.counter_value("CachedCompile")
        for name, x, spec in cases:
            xx = x.to("xla")
            if spec is not None:
                xx = mark_sharding(xx, mesh, spec)
            spmdtorch.sync()
            out = f(xx)
            spmdtorch.sync()
            torch.testing.assert_close(out.cpu(), f(x), msg=name)
    assert debug.counter_value("CachedCompile") - hits >= len(cases)


def test_node_sig_tells_equal_numbers_of_other_types_apart():
    """Python's ``2 == 2.0 == True`` and ``0.0 == -0.0`` must not give two static keys one signature."""
    from spmdtorch.lazy.keys import node_sig

    sigs = {node_sig("full", ((2,), v)) for v in (1, 1.0, True, 0, 0.0, -0.0, False)}
    assert len(sigs) == 7
    assert node_sig("full", ((2,), -0.0)) == node_sig("full", ((2,), -0.0))
    assert node_sig("full", ((2,), (1.5,))) == node_sig("full", ((2,), (1.5,)))


def _plan_key(fn, x):
    """The PlanKey of the graph ``fn`` records on a fresh xla copy of ``x`` (the graph is then run)."""
    from spmdtorch.lazy import executor

    out = fn(x.to("xla"))
    key = executor._Plan([read_value(out)]).key
    spmdtorch.sync()
    return key


def read_value(t):
    return dispatch.read_value(t)


def test_plan_keys_are_flat_ints_equal_exactly_for_equal_graphs():
    from spmdtorch.lazy import executor

    x = torch.arange(16.0).reshape(4, 4)
    a = _plan_key(lambda t: (t * 2).sum(0), x)
    b = _plan_key(lambda t: (t * 2).sum(0), x + 1)  # other values, same graph
    c = _plan_key(lambda t: (t * 2).sum(1), x)  # another static argument
    d = _plan_key(lambda t: (t * 2 + t).sum(0), x)  # other wiring
    assert a == b and hash(a) == hash(b)
    assert len({a, c, d}) == 3
    # Hashed and compared in C: every part is a flat tuple of ints (outputs: int pairs).
    assert all(type(e) is int for e in a.entries) and a.random_order == ()
    assert all(type(i) is int for o in a.outputs for i in o)
    # One record per node (sig, n, codes): mul reads the input leaf and the
    # scalar leaf, sum reads the mul node's output 0.
    starts = executor._node_starts(a.entries)
    assert len(starts) == 2 and a.entries[1:4] == (2, -1, -2) and a.entries[5:] == (1, 0, 0)


def test_the_random_draw_order_is_part_of_the_plan_key():
    from spmdtorch.lazy import executor

    spmdtorch.manual_seed(0)
    a = torch.rand(8, device="xla")
    b = torch.rand(8, device="xla")
    forward = executor._Plan([read_value(a), read_value(b)]).key
    swapped = executor._Plan([read_value(b), read_value(a)]).key
    spmdtorch.sync()
    assert forward.random_order and forward.random_order != swapped.random_order


def test_a_structure_change_is_logged_at_its_first_differing_op(caplog):
    from spmdtorch.lazy import executor

    x = torch.arange(20.0).reshape(4, 5)
    plans = []
    for fn in (lambda t: (t * 2).sum(0), lambda t: (t * 2).sum(1), lambda t: (t * 2).sum(1).neg()):
        out = fn(x.to("xla"))
        plans.append(executor._Plan([read_value(out)]))
        spmdtorch.sync()
    keys_ = [executor.ProgramKey(p.key, (), (), (), "highest") for p in plans]
    with caplog.at_level("WARNING", logger="spmdtorch.compile"):
        executor._log_recompile(keys_[0], keys_[1], plans[1])
        executor._log_recompile(keys_[1], keys_[2], plans[2])
    msgs = [r.getMessage() for r in caplog.records]
    assert "graph structure changed: 2 -> 2 ops, first difference at op 1 (aten.sum.dim_IntList)" in msgs[0]
    assert "graph structure changed: 2 -> 3 ops, first difference at op 2 (aten.neg.default)" in msgs[1]
