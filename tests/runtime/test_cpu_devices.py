"""The shared simulated-CPU-device environment (spmdtorch.runtime.cpu_devices)."""

from __future__ import annotations

import pytest

from spmdtorch.config import ConfigError
from spmdtorch.runtime import cpu_devices
from spmdtorch.runtime.cpu_devices import (
    CPU_REMAT_XLA_FLAG,
    ENV_CPU_DEVICES,
    SimulatedDevicesError,
    apply_cpu_devices_setting,
    cpu_device_env,
    requested_cpu_devices,
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


@pytest.mark.parametrize(
    "env,expected",
    [
        ({}, None),
        ({ENV_CPU_DEVICES: " "}, None),  # empty means unset, as for every knob
        ({ENV_CPU_DEVICES: "4"}, 4),
        ({ENV_CPU_DEVICES: "4", "PJRT_DEVICE": "cpu", "JAX_PLATFORMS": "cpu"}, 4),
        ({"PJRT_DEVICE": "TPU"}, None),  # no request: the other platform is none of its business
    ],
)
def test_requested_cpu_devices(env, expected):
    assert requested_cpu_devices(env) == expected


@pytest.mark.parametrize(
    "env,match",
    [
        ({ENV_CPU_DEVICES: "0"}, "SPMDTORCH_CPU_DEVICES='0' must be >= 1"),
        ({ENV_CPU_DEVICES: "four"}, "SPMDTORCH_CPU_DEVICES='four' is not an integer"),
        ({ENV_CPU_DEVICES: "4", "PJRT_DEVICE": "TPU"}, "PJRT_DEVICE='TPU' asks for another platform.*unset"),
        ({ENV_CPU_DEVICES: "4", "JAX_PLATFORMS": "cuda,cpu"}, "JAX_PLATFORMS='cuda,cpu' asks for another platform"),
    ],
)
def test_requested_cpu_devices_rejects(env, match):
    with pytest.raises(ConfigError, match=match):
        requested_cpu_devices(env)


def test_apply_cpu_devices_setting_in_this_running_process(devices8, monkeypatch):
    monkeypatch.delenv(ENV_CPU_DEVICES, raising=False)
    assert apply_cpu_devices_setting() is None
    monkeypatch.setenv(ENV_CPU_DEVICES, "8")
    assert apply_cpu_devices_setting() == 8  # what is running already: nothing to do
    monkeypatch.setenv(ENV_CPU_DEVICES, "4")
    with pytest.raises(SimulatedDevicesError, match="SPMDTORCH_CPU_DEVICES=4 cannot take effect.*already started"):
        apply_cpu_devices_setting()


def test_simulate_after_joining_a_job_before_the_backend_started(monkeypatch):
    # A job's process: joining made XLA read its flags (4 devices), no device was used yet.
    monkeypatch.setattr(cpu_devices, "_backend_started", lambda: False)
    monkeypatch.setattr(cpu_devices, "_joined", lambda: True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=4")
    simulate_cpu_devices(4)  # what the job has: nothing to do
    with pytest.raises(SimulatedDevicesError, match="joined a multi-process job with 4 CPU.*SPMDTORCH_CPU_DEVICES=8"):
        simulate_cpu_devices(8)
    monkeypatch.setenv("XLA_FLAGS", "")
    with pytest.raises(SimulatedDevicesError, match="with XLA's default CPU device count"):
        simulate_cpu_devices(8)
