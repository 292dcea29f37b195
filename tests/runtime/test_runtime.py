"""Tests for spmdtorch.runtime (8 simulated CPU devices, see conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import torch

import spmdtorch.runtime as xr

REPO_ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------
# Counts and devices
# --------------------------------------------------------------------------


def test_counts(devices8):
    assert xr.device_count() == 8
    assert xr.global_runtime_device_count() == 8
    assert xr.addressable_runtime_device_count() == 8
    assert xr.process_index() == 0
    assert xr.process_count() == 1


def test_jax_devices(devices8):
    assert xr.jax_devices() == jax.devices()
    assert xr.local_jax_devices() == jax.local_devices()
    assert len(xr.jax_devices()) == 8
    assert all(isinstance(d, jax.Device) for d in xr.local_jax_devices())


def test_device_default_and_index(devices8):
    assert xr.device() == torch.device("xla:0")
    assert xr.device(None) == torch.device("xla", 0)
    assert xr.device(7) == torch.device("xla:7")
    assert str(xr.device(3)) == "xla:3"


@pytest.mark.parametrize("bad", [8, 100, -1])
def test_device_out_of_range(devices8, bad):
    with pytest.raises(ValueError, match=r"8 addressable device"):
        xr.device(bad)


@pytest.mark.parametrize("bad", ["1", 1.0, True])
def test_device_index_type(devices8, bad):
    with pytest.raises(TypeError):
        xr.device(bad)


def test_devices(devices8):
    devs = xr.devices()
    assert devs == [torch.device("xla", i) for i in range(8)]
    assert all(isinstance(d, torch.device) for d in devs)


# --------------------------------------------------------------------------
# device_type and PJRT_DEVICE
# --------------------------------------------------------------------------


def test_device_type_from_jax(devices8, monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert xr.device_type() == "CPU"


@pytest.mark.parametrize("value", ["CPU", "cpu", " Cpu "])
def test_device_type_from_env(devices8, monkeypatch, value):
    monkeypatch.setenv("PJRT_DEVICE", value)
    assert xr.device_type() == "CPU"


def test_device_type_empty_env_falls_back(devices8, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "")
    assert xr.device_type() == "CPU"


@pytest.mark.parametrize("value", ["FOO", "XPU", "TPU_LEGACY", "cuda12"])
def test_device_type_invalid_env(monkeypatch, value):
    monkeypatch.setenv("PJRT_DEVICE", value)
    with pytest.raises(xr.InvalidPjrtDeviceError, match="PJRT_DEVICE") as info:
        xr.device_type()
    # The named error is both a config error and a ValueError.
    assert isinstance(info.value, xr.RuntimeConfigError)
    assert isinstance(info.value, ValueError)
    assert "CUDA" in str(info.value) and "TPU" in str(info.value)
    with pytest.raises(xr.InvalidPjrtDeviceError):
        xr._apply_pjrt_device_env()


@pytest.mark.parametrize("value", ["GPU", "CUDA", "TPU"])
def test_device_type_env_mismatch_running_backend(devices8, monkeypatch, value):
    # JAX already runs on CPU here: claiming another type would be a lie.
    monkeypatch.setenv("PJRT_DEVICE", value)
    with pytest.raises(xr.RuntimeConfigError, match="running on CPU"):
        xr.device_type()


def test_apply_env_unset_is_noop(devices8, monkeypatch):
    monkeypatch.delenv("PJRT_DEVICE", raising=False)
    assert xr._apply_pjrt_device_env() is None


def test_apply_env_after_backend_start(devices8, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xr._apply_pjrt_device_env() is None
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    with pytest.warns(RuntimeWarning, match="already started on CPU"):
        assert xr._apply_pjrt_device_env() is None
    assert jax.default_backend() == "cpu"


def _run_fresh(code: str, env_updates: dict[str, str | None]) -> str:
    """Runs ``code`` in a fresh interpreter (no JAX backend yet); returns stdout."""
    env = dict(os.environ)
    for key, val in env_updates.items():
        if val is None:
            env.pop(key, None)
        else:
            env[key] = val
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO_ROOT), env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=str(REPO_ROOT),
    )
    if proc.returncode != 0:
        pytest.fail(f"subprocess failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout.strip()


# One fresh interpreter (no JAX backend yet) runs every case below in turn,
# resetting the environment and jax_platforms between cases; a process per
# case cost ~3 s each.
_APPLY = """
import json, os, sys
import jax
from jax._src import xla_bridge
import spmdtorch.runtime as xr
from spmdtorch import config
out = {}
for name, env in json.loads(sys.argv[1]).items():
    for key, val in env.items():
        if val is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = val
    jax.config.update("jax_platforms", None)
    try:
        config.reload()
        xr._apply_pjrt_device_env()
    except Exception as e:
        out[name] = "ERR " + type(e).__name__
        continue
    out[name] = " ".join(map(str, (os.environ.get("JAX_PLATFORMS"), jax.config.jax_platforms,
                                   xla_bridge.backends_are_initialized(), xr.device_type())))
os.environ.pop("PJRT_DEVICE", None)  # the last case's value must not reach exit hooks
config.reload()
print(json.dumps(out))
"""

# case -> (environment, the line it must print)
_APPLY_CASES = {
    "GPU": ({"PJRT_DEVICE": "GPU", "JAX_PLATFORMS": None}, "cuda cuda False CUDA"),
    "CUDA": ({"PJRT_DEVICE": "CUDA", "JAX_PLATFORMS": None}, "cuda cuda False CUDA"),
    "TPU": ({"PJRT_DEVICE": "TPU", "JAX_PLATFORMS": None}, "tpu tpu False TPU"),
    "cpu": ({"PJRT_DEVICE": "cpu", "JAX_PLATFORMS": None}, "cpu cpu False CPU"),
    "conflicts with JAX_PLATFORMS": ({"PJRT_DEVICE": "TPU", "JAX_PLATFORMS": "cpu"}, "ERR RuntimeConfigError"),
    "keeps a consistent JAX_PLATFORMS": (
        {"PJRT_DEVICE": "GPU", "JAX_PLATFORMS": "cuda,cpu"},
        "cuda,cpu cuda,cpu False CUDA",
    ),
    "invalid": ({"PJRT_DEVICE": "nonsense", "JAX_PLATFORMS": None}, "ERR InvalidPjrtDeviceError"),
}


@pytest.fixture(scope="module")
def apply_env_results():
    import json

    env = {name: case[0] for name, case in _APPLY_CASES.items()}
    code = textwrap.dedent(_APPLY) + "\n"
    out = _run_fresh(
        f"import sys; sys.argv[1:] = [{json.dumps(json.dumps(env))}]\n" + code,
        {"PJRT_DEVICE": None, "JAX_PLATFORMS": None},
    )
    return json.loads(out.splitlines()[-1])


@pytest.mark.parametrize("case", list(_APPLY_CASES))
def test_apply_env_in_a_fresh_process(case, apply_env_results):
    """PJRT_DEVICE sets JAX_PLATFORMS / jax_platforms before any backend starts, or raises by name."""
    assert apply_env_results[case] == _APPLY_CASES[case][1]


def test_apply_env_cpu_runs_on_cpu():
    code = """
    import spmdtorch.runtime as xr
    xr._apply_pjrt_device_env()
    import jax
    print(jax.devices()[0].platform, xr.device_type(), xr.device_count())
    """
    out = _run_fresh(code, {"PJRT_DEVICE": "CPU", "JAX_PLATFORMS": None})
    assert out.splitlines()[-1] == "cpu CPU 8"


# --------------------------------------------------------------------------
# Persistent compilation cache
# --------------------------------------------------------------------------

_CACHE_OPTIONS = [
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_entry_size_bytes",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_compilation_cache_max_size",
    "jax_persistent_cache_enable_xla_caches",
]


@pytest.fixture
def restore_cache_config():
    """Puts JAX's cache settings back after a test that changes them."""
    from jax.experimental.compilation_cache import compilation_cache as cc

    saved = {name: getattr(jax.config, name) for name in _CACHE_OPTIONS}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    cc.reset_cache()


@pytest.fixture
def cache_hits():
    """Counts persistent-cache hits reported by JAX while the test runs."""
    hits = []

    def listener(event, **kwargs):
        if event == "/jax/compilation_cache/cache_hits":
            hits.append(event)

    jax.monitoring.register_event_listener(listener)
    yield hits
    jax.monitoring.unregister_event_listener(listener)


def _entries(path: Path) -> set[str]:
    return {p.name for p in path.glob("*-cache")}


def _program(scale: float):
    def prog(x):
        return jnp.sin(x) * scale + jnp.cos(x)

    return jax.jit(prog)


def test_initialize_cache_writes_entries(devices8, tmp_path, restore_cache_config):
    cache_dir = tmp_path / "cache"
    xr.initialize_cache(str(cache_dir))
    assert jax.config.jax_compilation_cache_dir == str(cache_dir)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0

    out = _program(3.0)(jnp.arange(16, dtype=jnp.float32))
    out.block_until_ready()
    first = _entries(cache_dir)
    assert len(first) >= 1, f"no cache entry in {list(cache_dir.iterdir())}"

    _program(5.0)(jnp.arange(16, dtype=jnp.float32)).block_until_ready()
    assert len(_entries(cache_dir)) > len(first)


def test_initialize_cache_accepts_pathlike_and_switches_dir(devices8, tmp_path, restore_cache_config):
    a, b = tmp_path / "a", tmp_path / "b"
    xr.initialize_cache(a)
    _program(7.0)(jnp.ones(8)).block_until_ready()
    xr.initialize_cache(b)
    _program(11.0)(jnp.ones(8)).block_until_ready()
    assert _entries(a) and _entries(b)
    assert _entries(a).isdisjoint(_entries(b))


def test_initialize_cache_readonly(devices8, tmp_path, restore_cache_config, cache_hits):
    cache_dir = tmp_path / "shared"
    x = jnp.arange(32, dtype=jnp.float32)

    xr.initialize_cache(cache_dir)  # the writer
    expected = _program(13.0)(x)
    written = _entries(cache_dir)
    assert written

    xr.initialize_cache(cache_dir, readonly=True)
    jax.clear_caches()  # forget in-memory executables so the disk is consulted
    got = _program(13.0)(x)  # same program: served from the cache
    assert cache_hits, "readonly cache was not read"
    assert jnp.array_equal(got, expected)

    _program(17.0)(x).block_until_ready()  # new program: compiled, not written
    assert _entries(cache_dir) == written
    assert sorted(p.name for p in cache_dir.iterdir() if p.name.endswith("-atime")) == []


def test_initialize_cache_empty_path(restore_cache_config):
    with pytest.raises(ValueError, match="non-empty"):
        xr.initialize_cache("")
