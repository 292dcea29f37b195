"""Test configuration: 8 simulated CPU devices.

Everything here runs at conftest import, before any test module imports jax
or spmdtorch: XLA reads ``XLA_FLAGS`` and ``NPROC`` when its CPU backend
starts and JAX reads ``JAX_PLATFORMS`` when it is imported.
"""

from __future__ import annotations

import os
import re
import sys

import pytest

# Shared test helpers (tests/training_helpers.py) import as top-level modules.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_DEVICES = 8

# 8 host-platform (CPU) devices; replace any device count already in XLA_FLAGS.
_flag = f"--xla_force_host_platform_device_count={NUM_DEVICES}"
_xla_flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
# Keep optimisation barriers on XLA:CPU (its cse_barrier_expander pass drops
# them), so activation checkpointing really lowers memory in the tests, as it
# does on GPU/TPU (spmdtorch.partition.CPU_REMAT_XLA_FLAG).
os.environ["XLA_FLAGS"] = " ".join(_xla_flags + [_flag, "--xla_disable_hlo_passes=cse_barrier_expander"])

# XLA's CPU client sizes its thread pool from NPROC; with fewer threads than
# 2 x devices, queued executions with collectives can deadlock (DESIGN.md,
# "CPU collective deadlock").
_min_nproc = max(16, 2 * NUM_DEVICES)
try:
    _nproc = int(os.environ.get("NPROC", "0"))
except ValueError:
    _nproc = 0
if _nproc < _min_nproc:
    os.environ["NPROC"] = str(_min_nproc)

# Tests run on CPU only, whatever accelerator the machine has; PJRT_DEVICE
# agrees so spmdtorch's import-time check sees no conflict.
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["PJRT_DEVICE"] = "CPU"

if "jax" in sys.modules:  # imported early (e.g. by a plugin): fix its config too
    import jax

    jax.config.update("jax_platforms", "cpu")


@pytest.fixture(scope="session")
def devices8():
    """The 8 simulated CPU jax devices; fails (never skips) if they are missing."""
    import jax

    devs = jax.devices()
    if len(devs) != NUM_DEVICES or any(d.platform != "cpu" for d in devs):
        pytest.fail(
            f"expected {NUM_DEVICES} CPU jax devices, got {len(devs)}: {devs}. "
            "JAX started before tests/conftest.py set XLA_FLAGS/JAX_PLATFORMS "
            "(something imported and used jax too early?)",
            pytrace=False,
        )
    return devs
