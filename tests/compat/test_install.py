"""install(): opt-in, idempotent, refuses a real torch_xla; unknown names fail by name; python -m spmdtorch.compat."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import spmdtorch.compat
from spmdtorch.compat import (
    MultiprocessNotSupportedError,
    TorchXlaInstalledError,
    TorchXlaModuleNotProvidedError,
    TorchXlaNameError,
    UnsupportedEnvironmentError,
)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240


def _python(code: str, *args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full = dict(os.environ)
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")])
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *args] if not code else [sys.executable, "-c", code, *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_import_spmdtorch_does_not_install():
    proc = _python(
        "import sys, spmdtorch, spmdtorch.partition, spmdtorch.debug\n"
        "import importlib.util\n"
        "assert 'torch_xla' not in sys.modules\n"
        "assert not any(type(f).__name__ == 'TorchXlaFinder' for f in sys.meta_path)\n"
        "assert 'spmdtorch.compat' not in sys.modules\n"
        "try:\n    import torch_xla\nexcept ModuleNotFoundError:\n    print('no torch_xla')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "no torch_xla" in proc.stdout


def test_install_is_idempotent_and_uninstall_removes_everything():
    spmdtorch.compat.install()
    spmdtorch.compat.install()
    assert sum(type(f).__name__ == "TorchXlaFinder" for f in sys.meta_path) == 1
    import torch_xla.core.xla_model as xm

    assert xm.xla_device() == torch.device("xla", 0)
    spmdtorch.compat.uninstall()
    assert not spmdtorch.compat.is_installed()
    assert not any(n == "torch_xla" or n.startswith("torch_xla.") for n in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        import torch_xla  # noqa: F401


def test_refuses_when_the_real_torch_xla_is_installed(tmp_path):
    fake = tmp_path / "site" / "torch_xla"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("REAL = True\n")
    proc = _python(
        "import spmdtorch.compat\n"
        "try:\n    spmdtorch.compat.install()\n"
        "except spmdtorch.compat.TorchXlaInstalledError as e:\n    print('refused:', e)\n",
        env={"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "site")])},
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: the real torch_xla is installed" in proc.stdout
    assert "pip uninstall torch_xla" in proc.stdout
    assert issubclass(TorchXlaInstalledError, spmdtorch.compat.CompatError)


def test_unknown_module_and_name_fail_by_name():
    import torch_xla.core.xla_model as xm

    # A module PyTorch/XLA 2.9 does not have either (it has custom_kernel: see test_modules_names.py).
    with pytest.raises(TorchXlaModuleNotProvidedError, match="torch_xla.experimental.pjrt"):
        import torch_xla.experimental.pjrt
    with pytest.raises(ImportError):  # a ModuleNotFoundError: `except ImportError` fallbacks keep working
        import torch_xla.distributed.xla_dist  # noqa: F401
    with pytest.raises(TorchXlaNameError, match=r"torch_xla.core.xla_model.not_a_name.*migrating-from-torch-xla"):
        xm.not_a_name  # noqa: B018
    assert not hasattr(xm, "not_a_name")
    assert xm.__name__ == "torch_xla.core.xla_model"


def test_bare_import_reaches_submodules_as_attributes():
    import torch_xla

    assert torch_xla.runtime.is_spmd()
    assert torch_xla.core.xla_model.xla_device() == torch.device("xla", 0)
    assert callable(torch_xla._XLAC._get_xla_sharding_spec)
    assert torch_xla.__version__.endswith("+spmdtorch")


def test_multiprocess_apis_raise_with_the_spmd_equivalent():
    import torch_xla
    import torch_xla.distributed.xla_multiprocessing as xmp
    from torch_xla.distributed.fsdp import XlaFullyShardedDataParallel

    def _mp_fn(index):
        raise AssertionError("must not run")

    with pytest.raises(MultiprocessNotSupportedError, match=r"xmp.spawn\(_mp_fn.*_mp_fn\(0, \*args\).*input_sharding"):
        xmp.spawn(_mp_fn, args=())
    with pytest.raises(MultiprocessNotSupportedError, match="one process per host"):
        torch_xla.launch(_mp_fn, args=())
    with pytest.raises(MultiprocessNotSupportedError, match="SpmdFullyShardedDataParallel as FSDPv2"):
        XlaFullyShardedDataParallel(torch.nn.Linear(2, 2))


def test_xla_ddp_backend_raises_and_xla_init_method_serves_gloo(tmp_path):
    # In a subprocess: a process group is process-global state.
    code = textwrap.dedent(
        """
        import os
        os.environ["MASTER_PORT"] = "29617"
        import spmdtorch.compat
        spmdtorch.compat.install()
        import torch, torch.distributed as dist
        import torch_xla.distributed.xla_backend
        import torch_xla.runtime as xr
        xr.use_spmd()
        try:
            dist.init_process_group("xla", init_method="xla://")
        except spmdtorch.compat.MultiprocessNotSupportedError as e:
            print("refused:", e)
        dist.init_process_group("gloo", init_method="xla://")
        print("gloo", dist.get_rank(), dist.get_world_size())
        """
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: dist.init_process_group('xla', ...)" in proc.stdout
    assert "gloo 0 1" in proc.stdout


@pytest.mark.parametrize("name", ["XLA_USE_BF16", "XLA_DOWNCAST_BF16", "XLA_IR_DEBUG", "XLA_HLO_DEBUG"])
def test_meaningless_env_vars_are_refused_by_name(monkeypatch, name):
    spmdtorch.compat.uninstall()
    monkeypatch.setenv(name, "1")
    with pytest.raises(UnsupportedEnvironmentError, match=f"{name}=1"):
        spmdtorch.compat.install()
    assert not spmdtorch.compat.is_installed()


def test_save_tensors_file_and_metrics_file_are_written(monkeypatch, tmp_path):
    graphs, metrics_file = tmp_path / "graphs.txt", tmp_path / "metrics.txt"
    spmdtorch.compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(graphs))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "hlo")
    monkeypatch.setenv("XLA_METRICS_FILE", str(metrics_file))
    spmdtorch.compat.install()
    import torch_xla.core.xla_model as xm

    t = torch.ones(4, device=xm.xla_device())
    for _ in range(2):
        t = t * 3 + 1
        xm.mark_step()
    assert t.cpu().tolist() == [13.0] * 4
    saved = tmp_path / "graphs.txt.0"  # PyTorch/XLA appends the device ordinal (SPMD:0)
    text = saved.read_text()
    assert text.count("## BEGIN_GRAPH") == 2 and text.count("## END_GRAPH") == 2
    assert text.count("#OUTPUT_SHARDING_END") == 2  # the hlo format adds each program's output shardings
    assert "HloModule" in text and "multiply" in text
    assert "f32[4] {replicated}" in text
    assert text.splitlines()[-2] == "#OUTPUT_SHARDING_END"  # where PyTorch/XLA's graph-dump test reads it
    assert not graphs.exists()
    assert metrics_file.read_text().count("Counter: MarkStep") == 2
    spmdtorch.compat.uninstall()
    t = t + 1
    spmdtorch.mark_step()
    assert saved.read_text().count("## END_GRAPH") == 2  # hooks removed with the layer


def test_save_tensors_fmt_dot_is_refused(monkeypatch, tmp_path):
    spmdtorch.compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(tmp_path / "g.dot"))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "dot")
    with pytest.raises(UnsupportedEnvironmentError, match="XLA_SAVE_TENSORS_FMT=dot"):
        spmdtorch.compat.install()


def test_pt_xla_debug_level_logs_compilations(monkeypatch, caplog):
    import logging

    spmdtorch.compat.uninstall()
    monkeypatch.setenv("PT_XLA_DEBUG_LEVEL", "2")
    spmdtorch.compat.install()
    import torch_xla.core.xla_model as xm

    try:
        with caplog.at_level(logging.INFO):
            kept = []  # live tensors: a barrier computes only those
            for n in (2, 3):  # a new shape: a recompilation, logged with its cause
                kept.append(torch.ones(n, device=xm.xla_device()) * 2)
                xm.mark_step()
            assert [t.sum().item() for t in kept] == [4.0, 6.0]
        assert any("Execution Analysis" in r.getMessage() for r in caplog.records), caplog.text
        assert any(r.name == "spmdtorch.compile" for r in caplog.records), caplog.text
    finally:
        spmdtorch.debug.log_recompiles(False)


@pytest.mark.slow
def test_python_m_spmdtorch_compat_runs_a_script_with_its_argv(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(
        "import sys, torch\n"
        "import torch_xla, torch_xla.core.xla_model as xm\n"
        "t = torch.arange(4.0, device=xm.xla_device()) * 2\n"
        "xm.mark_step()\n"
        "print('argv', sys.argv)\n"
        "print('name', __name__, 'sum', t.sum().item())\n"
    )
    proc = _python("", "-m", "spmdtorch.compat", str(script), "--flag", "7", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"argv ['{script}', '--flag', '7']" in proc.stdout
    assert "name __main__ sum 12.0" in proc.stdout
    usage = _python("", "-m", "spmdtorch.compat")
    assert usage.returncode == 2 and "usage: python -m spmdtorch.compat" in usage.stdout
