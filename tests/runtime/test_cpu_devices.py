"""The shared simulated-CPU-device environment (spmdtorch.runtime.cpu_devices)."""

from __future__ import annotations

import pytest

from spmdtorch.runtime.cpu_devices import (
    CPU_REMAT_XLA_FLAG,
    SimulatedDevicesError,
    cpu_device_env,
    simulate_cpu_devices,
)


def test_env_replaces_the_count_keeps_other_flags_and_raises_nproc():
    env = cpu_device_env(
        12, {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=8", "NPROC": "4"}
    )
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=12"
    assert env["NPROC"] == "24"  # at least 2 x devices (docs/design.md, hazard "CPU collective deadlock")
    assert (env["JAX_PLATFORMS"], env["PJRT_DEVICE"]) == ("cpu", "CPU")
    assert cpu_device_env(2, {"NPROC": "64"})["NPROC"] == "64"  # never lowered
    assert cpu_device_env(2, {"NPROC": "lots"})["NPROC"] == "16"


def test_env_keeps_remat_barriers_without_dropping_other_disabled_passes():
    assert cpu_device_env(2, {}, keep_remat_barriers=True)["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2",
        CPU_REMAT_XLA_FLAG,
    ]
    flags = cpu_device_env(2, {"XLA_FLAGS": "--xla_disable_hlo_passes=a,b"}, keep_remat_barriers=True)["XLA_FLAGS"]
    assert flags.split()[0] == "--xla_disable_hlo_passes=a,b,cse_barrier_expander"
    once = cpu_device_env(2, {"XLA_FLAGS": CPU_REMAT_XLA_FLAG}, keep_remat_barriers=True)["XLA_FLAGS"]
    assert once.count("cse_barrier_expander") == 1


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_env_rejects_a_bad_count(bad):
    with pytest.raises(ValueError, match="positive int"):
        cpu_device_env(bad, {})


def test_simulate_after_the_backend_started(devices8):
    simulate_cpu_devices(8)  # what is running already: nothing to do
    with pytest.raises(SimulatedDevicesError, match="already started with 8 cpu device"):
        simulate_cpu_devices(4)
