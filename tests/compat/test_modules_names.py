"""Every PyTorch/XLA 2.9 module imports under compat; its names behave as PyTorch/XLA's or fail by name when used.

Also: the distribution metadata compat presents (``importlib.metadata.version("torch_xla")``),
the name index generator (``tools/torch_xla_names.py``), ``torch_xla.core.xla_env_vars`` and
``torch_xla.utils.utils``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import spmdtorch.compat
from spmdtorch.compat import TorchXlaModuleNotProvidedError, TorchXlaNameError
from spmdtorch.compat._finder import ALIASES
from spmdtorch.compat._placeholders import is_placeholder
from spmdtorch.compat._upstream_names import MODULES

REPO = Path(__file__).resolve().parents[2]


# --- modules ---------------------------------------------------------------------------------------------------


def test_every_pytorch_xla_module_imports():
    failures = {}
    for name in sorted(MODULES):
        try:
            module = importlib.import_module(name)
        except Exception as e:  # noqa: BLE001  # collect every failure, report them all
            failures[name] = repr(e)
            continue
        assert module.__name__ == name
    assert not failures, failures
    assert len(MODULES) > 100  # the index covers the whole package, not a handful


@pytest.mark.parametrize(
    "statement",
    [
        # test/spmd, examples/, transformers, accelerate and Lightning's XLA code import these
        "import torch_xla.core.xla_env_vars as xenv",
        "import torch_xla.utils.utils as xu",
        "from torch_xla.distributed.spmd import XLAShardedTensor, Mesh, auto_policy",
        "from torch_xla.distributed.spmd.xla_sharding import MarkShardingFunction, XLAPatchedLinear",
        "from torch_xla.distributed.spmd.xla_sharding import wrap_as_sharded_tensor",
        "from torch_xla.distributed.spmd.api import convert_to_xla_mesh",
        "from torch_xla.experimental.custom_kernel import flash_attention",
        "from torch_xla._internal import tpu",
        "import torch_xla.test.test_utils",
        "from torch_xla.distributed.fsdp.utils import checkpoint_module",
        "import torch_xla.core.functions",
        "from torch_xla.utils.utils import getenv_as",
        "from torch_xla import __version__",
        "from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, CheckpointManager",
        "import torch_xla.debug.profiler",
        "import torch_xla._dynamo.dynamo_bridge",
    ],
)
def test_imports_programs_use_succeed(statement):
    exec(statement, {})


def _torch_xla_imports(package: str) -> set[tuple[str, str | None]]:
    """``(module, name)`` of every ``import torch_xla...`` / ``from torch_xla... import name`` in an installed package."""
    import ast

    root = Path(importlib.import_module(package).__file__).parent
    found: set[tuple[str, str | None]] = set()
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "torch_xla" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                found |= {(a.name, None) for a in node.names if a.name.split(".")[0] == "torch_xla"}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("torch_xla"):
                found |= {(node.module, a.name) for a in node.names if a.name != "*"}
    return found


@pytest.mark.parametrize("package", ["transformers", "accelerate"])
def test_every_torch_xla_import_of_hugging_face_resolves(package):
    imports = _torch_xla_imports(package)
    assert len(imports) > 5
    failures = []
    for module_name, name in sorted(imports, key=str):
        target = module_name if name is None else f"{module_name}.{name}"
        known = module_name in MODULES and (
            name is None or target in MODULES or any(name in ns for ns in MODULES[module_name].values())
        )
        if not known:
            # not in PyTorch/XLA 2.9 either (accelerate's TPU-pod launcher imports the removed xla_dist)
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(target)
            continue
        try:
            module = importlib.import_module(module_name)
            if name is not None and not hasattr(module, name):
                importlib.import_module(target)
        except Exception as e:  # noqa: BLE001  # report every failure at once
            failures.append(f"{target}: {e!r}")
    assert not failures, failures


def test_module_pytorch_xla_does_not_have_raises_module_not_found():
    with pytest.raises(TorchXlaModuleNotProvidedError, match=r"torch_xla\.experimental\.pjrt.*no such module"):
        importlib.import_module("torch_xla.experimental.pjrt")  # removed before 2.9 (Lightning's old-version path)
    with pytest.raises(ModuleNotFoundError):  # `try: import ... except ImportError` fallbacks still work
        importlib.import_module("torch_xla.distributed.xla_dist")


# --- names -----------------------------------------------------------------------------------------------------


def test_known_but_unprovided_function_imports_and_raises_when_called():
    from torch_xla.experimental.custom_kernel import paged_attention

    assert is_placeholder(paged_attention)
    with pytest.raises(TorchXlaNameError) as e:
        paged_attention(1, 2, 3)
    msg = str(e.value)
    assert "torch_xla.experimental.custom_kernel.paged_attention" in msg
    assert "scaled_dot_product_attention" in msg  # what to use instead
    with pytest.raises(TorchXlaNameError, match="reading .*paged_attention.__code__x"):
        paged_attention.__code__x  # noqa: B018
    with pytest.raises(TorchXlaNameError):
        bool(paged_attention)


def test_known_but_unprovided_class_is_a_class_that_refuses_instances():
    import torch_xla.experimental.custom_kernel as ck

    cls = ck.FlashAttention
    assert isinstance(cls, type) and is_placeholder(cls)
    assert not isinstance(object(), cls)

    class Sub(cls):  # defining a subclass (done at import time by libraries) works
        pass

    with pytest.raises(TorchXlaNameError, match="instantiating Sub.*custom_kernel.FlashAttention"):
        Sub()
    with pytest.raises(TorchXlaNameError, match="reading torch_xla.experimental.custom_kernel.FlashAttention.apply"):
        cls.apply  # noqa: B018


def test_unprovided_xlac_namespace_raises_on_use():
    import torch_xla

    with pytest.raises(TorchXlaNameError, match="reading torch_xla._XLAC.profiler.start_server: .* does not provide"):
        torch_xla._XLAC.profiler.start_server(9012)


def test_placeholder_identity_is_stable_and_hasattr_answers_as_pytorch_xla():
    import torch_xla.distributed.spmd as xs
    import torch_xla.experimental.custom_kernel as ck

    assert ck.paged_attention is ck.paged_attention  # made once, then kept on the module
    assert hasattr(xs, "apply_backward_optimization_barrier")  # in PyTorch/XLA 2.9
    assert not hasattr(xs, "not_a_pytorch_xla_name")
    with pytest.raises(TorchXlaNameError, match="nor does PyTorch/XLA 2.9"):
        xs.not_a_pytorch_xla_name  # noqa: B018


def test_implemented_names_win_over_placeholders():
    checked = 0
    for module_name, impl_name in ALIASES.items():
        if impl_name is None:
            continue
        module = importlib.import_module(module_name)
        impl = importlib.import_module(impl_name)
        for n in getattr(impl, "__all__", []):
            value = getattr(module, n)
            assert value is getattr(impl, n), (module_name, n)
            assert not is_placeholder(value), (module_name, n)
            checked += 1
    assert checked > 100


def test_star_import_binds_pytorch_xla_names():
    ns: dict[str, object] = {}
    exec("from torch_xla.distributed.spmd import *", ns)
    assert "Mesh" in ns and "mark_sharding" in ns
    assert "XLAPatchedLinear" in ns  # a PyTorch/XLA name, bound (a stand-in unless implemented)


def test_module_attributes_that_are_other_modules():
    import torch_xla
    import torch_xla._internal.tpu
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd.xla_sharding as xsh

    assert torch_xla.tpu is torch_xla._internal.tpu  # torch_xla/__init__ imports it as `tpu`
    assert xsh.xm is xm  # `import torch_xla.core.xla_model as xm` in xla_sharding.py
    assert torch_xla.core.xla_env_vars.PJRT_DEVICE == "PJRT_DEVICE"  # a child module, reached as an attribute


def test_implementation_error_is_kept_as_the_reason(monkeypatch):
    """A name the implementation module refuses itself keeps that message when PyTorch/XLA has it."""
    import types

    from spmdtorch.compat._finder import make_alias

    impl = types.ModuleType("fake_impl")
    impl.__all__ = []

    def refuse(attr):
        raise TorchXlaNameError(f"spmdtorch.checkpoint has no {attr}: use spmdtorch.checkpoint.save")

    impl.__getattr__ = refuse  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "fake_impl", impl)
    monkeypatch.setitem(ALIASES, "torch_xla.experimental.distributed_checkpoint.util", "fake_impl")
    module = make_alias("torch_xla.experimental.distributed_checkpoint.util")
    placeholder = module.prime_optimizer  # a PyTorch/XLA 2.9 name there
    with pytest.raises(TorchXlaNameError, match="use spmdtorch.checkpoint.save"):
        placeholder()
    with pytest.raises(TorchXlaNameError, match="has no not_upstream"):
        module.not_upstream  # noqa: B018


# --- distribution metadata -------------------------------------------------------------------------------------


def test_distribution_metadata_while_installed_only():
    assert importlib.metadata.version("torch_xla") == "2.9.0"
    assert importlib.metadata.version("torch-xla") == "2.9.0"
    assert importlib.metadata.metadata("torch_xla")["Name"] == "torch_xla"
    assert spmdtorch.compat._real_torch_xla() is None  # our own metadata is not a real torch_xla
    spmdtorch.compat.uninstall()
    try:
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version("torch_xla")
    finally:
        spmdtorch.compat.install()


def test_transformers_sees_torch_xla_2_9():
    from transformers.utils import import_utils

    assert import_utils._is_package_available("torch_xla", return_version=True) == (True, "2.9.0")


# --- the index generator ---------------------------------------------------------------------------------------


def _fake_checkout(root: Path) -> Path:
    pkg = root / "torch_xla"
    files = {
        "__init__.py": "from ._internal import tpu\nfrom .version import __version__\nfrom .api import *\nimport os\n",
        "version.py.in": "",
        "api.py": "__all__ = ['f']\ndef f(): pass\ndef g(): pass\nclass C: pass\nif True:\n    K = 1\n",
        "_internal/__init__.py": "",
        "_internal/tpu.py": "from torch_xla.sub.b import B as Bee\ntry:\n    import numpy\nexcept ImportError:\n    pass\n",
        "sub/__init__.py": "from .a import A\nfrom .b import B\n",
        "sub/a.py": "from torch_xla.sub import B\nclass A: pass\n",
        "sub/b.py": "from torch_xla.sub import A\nclass B: pass\n",
        "csrc/init_python_bindings.cpp": textwrap.dedent(
            """
            m.def("_xla_thing", []() {})
             .def(
                 // a comment line
                 "_other_thing", []() {});
            py::class_<Foo>(m, "OpSharding").def("method", []() {});
            auto lowering = m.def_submodule("lowering", "doc");
            """
        ),
    }
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_index_generator_reads_names_by_kind(tmp_path):
    sys.path.insert(0, str(REPO / "tools"))
    try:
        import torch_xla_names
    finally:
        sys.path.remove(str(REPO / "tools"))
    index = torch_xla_names.build(_fake_checkout(tmp_path))
    top = index["torch_xla"]
    assert top["f"] == "function" and "g" not in top  # `from .api import *` follows api's __all__
    assert top["__version__"] == "value"  # from a module the checkout lacks (generated at build)
    assert top["tpu"] == "module=torch_xla._internal.tpu" and "os" not in top  # other packages' imports are not API
    assert index["torch_xla.api"] == {"C": "class", "K": "value", "f": "function", "g": "function"}
    # import cycles (sub/__init__ <-> sub/a, sub/b) resolve to the real kinds
    assert index["torch_xla.sub"] == {"A": "class", "B": "class", "a": "module", "b": "module"}
    assert index["torch_xla._internal.tpu"] == {"Bee": "class"}
    assert index["torch_xla._XLAC"] == {
        "_xla_thing": "function",
        "_other_thing": "function",
        "OpSharding": "class",
        "lowering": "value",
    }
    modules, module_attrs = torch_xla_names.split(index)
    assert module_attrs["torch_xla"] == {"tpu": "torch_xla._internal.tpu"}
    assert modules["torch_xla.sub"] == {"class": ("A", "B"), "module": ("a", "b")}


def test_index_generator_check_mode(tmp_path):
    pkg = _fake_checkout(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "torch_xla_names.py"), str(pkg), "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1  # the fake checkout is not the stored 2.9 index
    assert "differs" in proc.stderr
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "torch_xla_names.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "not a torch_xla package directory" in proc.stderr


def test_stored_index_matches_a_pytorch_xla_checkout_when_one_is_at_hand():
    checkout = os.environ.get("TORCH_XLA_SRC", "/tmp/ptxla_src/torch_xla")
    if not Path(checkout, "__init__.py").exists():
        pytest.skip(f"no PyTorch/XLA checkout at {checkout} (set TORCH_XLA_SRC)")
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "torch_xla_names.py"), checkout, "--check"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


# --- torch_xla.core.xla_env_vars -------------------------------------------------------------------------------


def test_xla_env_vars_are_the_variable_names():
    import torch_xla.core.xla_env_vars as xenv

    upstream = MODULES["torch_xla.core.xla_env_vars"]["value"]
    assert sorted(xenv.__all__) == sorted(upstream)
    for name in upstream:
        value = getattr(xenv, name)
        assert isinstance(value, str) and not is_placeholder(value)
    assert xenv.PJRT_DEVICE == "PJRT_DEVICE"
    assert xenv.TPU_MESH_CTLER_ADDR == "TPU_MESH_CONTROLLER_ADDRESS"  # the one whose value is not its name


# --- torch_xla.utils.utils -------------------------------------------------------------------------------------


def test_sample_generator_yields_data_sample_count_times_per_pass():
    import torch
    import torch_xla.utils.utils as xu

    data = (torch.zeros(2, 3), torch.ones(2, dtype=torch.int64))
    gen = xu.SampleGenerator(data=data, sample_count=3)
    assert len(gen) == 3
    for _ in range(2):  # every pass starts again (one per epoch)
        batches = list(gen)
        assert len(batches) == 3 and all(b is data for b in batches)


def test_fn_data_generator():
    import torch
    import torch_xla.utils.utils as xu

    gen = xu.FnDataGenerator(lambda x: x.sum(dim=1), 4, torch.randn, dims=[3], count=2)
    pairs = list(gen)
    assert len(pairs) == 2 and len(gen) == 2
    for data, target in pairs:
        assert data.shape == (4, 3)
        torch.testing.assert_close(target, data.sum(dim=1))


def test_getenv_as_and_check_env_flag(monkeypatch):
    import torch_xla.utils.utils as xu

    monkeypatch.delenv("SPMDTORCH_TEST_VAR", raising=False)
    assert xu.getenv_as("SPMDTORCH_TEST_VAR", int, 7) == 7
    monkeypatch.setenv("SPMDTORCH_TEST_VAR", "0")
    assert xu.getenv_as("SPMDTORCH_TEST_VAR", bool, True) is False
    assert xu.getenv_as("SPMDTORCH_TEST_VAR", int) == 0
    assert not xu.check_env_flag("SPMDTORCH_TEST_VAR")
    monkeypatch.setenv("SPMDTORCH_TEST_VAR", "true")
    assert xu.check_env_flag("SPMDTORCH_TEST_VAR")
    assert xu.getenv_as("SPMDTORCH_TEST_VAR", str) == "true"


def test_get_free_tcp_ports_are_bindable():
    import torch_xla.utils.utils as xu

    ports = xu.get_free_tcp_ports(3)
    assert len(ports) == 3 and all(isinstance(p, int) and p > 0 for p in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", ports[0]))


def test_for_each_instance_and_rewrite_walk_nested_structures():
    import torch
    import torch_xla.utils.utils as xu

    class Holder:
        def __init__(self, t):
            self.t = t

    shared = torch.ones(2)
    value = {"a": [shared, (shared, 3)], "b": Holder(torch.zeros(1)), "c": {torch.tensor(5.0).item()}}
    seen = []
    xu.for_each_instance(value, lambda v: isinstance(v, torch.Tensor), seen.append)
    assert len(seen) == 2  # the shared tensor once

    calls = []

    def double(t):
        calls.append(t)
        return t * 2

    out = xu.for_each_instance_rewrite(value, lambda v: isinstance(v, torch.Tensor), double)
    assert len(calls) == 2
    assert out["a"][0] is out["a"][1][0]  # shared stays shared
    assert isinstance(out["a"][1], list)  # tuples come back as lists, as in PyTorch/XLA
    torch.testing.assert_close(out["a"][0], shared * 2)
    torch.testing.assert_close(out["b"].t, torch.zeros(1))
    assert out["b"] is not value["b"] and value["b"].t is not out["b"].t
    assert value["a"][0] is shared  # the input is not changed


def test_small_helpers():
    import torch_xla.utils.utils as xu

    assert xu.as_list(1) == [1] and xu.as_list((1, 2)) == (1, 2)
    assert xu.shape([[1, 2, 3], [4, 5, 6]]) == [2, 3]
    with pytest.raises(ValueError, match="different shapes"):
        xu.shape([[1, 2], [3]])
    assert xu.flatten_nested_tuple(((1, (2, 3)), [4])) == (1, 2, 3, 4)
    assert xu.list_copy_append((1, 2), 3) == [1, 2, 3]
    assert xu.parallel_work(2, lambda a, b: a + b, [1, 2], [10, 20]) == [11, 22]
    lines = []
    assert xu.timed(lambda: 5, msg="took ", printfn=lines.append) == 5
    assert lines[0].startswith("took ") and lines[0].endswith("ms")
    with xu.TimedScope("scope ", printfn=lines.append):
        pass
    assert lines[1].startswith("scope ")
    lazy = xu.LazyProperty(lambda: [1])
    assert lazy.value is lazy.value
