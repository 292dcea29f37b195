"""Test configuration: 8 simulated CPU devices.

Everything here runs at conftest import, before any test queries devices:
XLA reads ``XLA_FLAGS`` and ``NPROC`` when its CPU backend starts
(``spmdtorch.runtime.cpu_devices``).
"""

from __future__ import annotations

import os
import sys

import pytest

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

# Shared test helpers (tests/training_helpers.py) import as top-level modules.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_DEVICES = 8

# 8 CPU devices, enough XLA threads for them (docs/design.md, hazard "CPU
# collective deadlock"), and XLA:CPU's optimisation barriers kept so that
# activation checkpointing really lowers memory in the tests, as it does on
# GPU/TPU. Applied before anything queries devices.
simulate_cpu_devices(NUM_DEVICES, keep_remat_barriers=True)


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
