"""spmdtorch.config: every knob's parse, default and error message."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from spmdtorch import config
from spmdtorch.config import ConfigError, DistributedInitError, InvalidPjrtDeviceError, RuntimeConfigError

KNOB = {k.env: k for k in config.KNOBS}

# env variable -> [(raw value, parsed value)]
GOOD = {
    "SPMDTORCH_MAX_IN_FLIGHT": [("0", 0), ("8", 8), (" 3 ", 3)],
    "SPMDTORCH_COMPILE_CACHE_SIZE": [("1", 1), ("4096", 4096)],
    "SPMDTORCH_LOG_RECOMPILES": [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        ("on", True),
        ("0", False),
        ("off", False),
    ],
    "SPMDTORCH_DEFER_UPLOAD": [("1", True), ("0", False), ("off", False)],
    "SPMDTORCH_MAX_GATHER_BYTES": [("0", 0), ("123", 123)],
    "PJRT_DEVICE": [("CPU", "CPU"), (" cpu ", "CPU"), ("gpu", "CUDA"), ("CUDA", "CUDA"), ("tpu", "TPU")],
    "SPMDTORCH_COORDINATOR_ADDRESS": [("10.0.0.1:1234", "10.0.0.1:1234")],
    "SPMDTORCH_NUM_PROCESSES": [("1", 1), ("16", 16)],
    "SPMDTORCH_PROCESS_ID": [("0", 0), ("15", 15)],
    "SPMDTORCH_LOCAL_DEVICE_IDS": [("0", (0,)), ("0,1", (0, 1))],
    "SPMDTORCH_COORDINATOR_PORT": [("7777", 7777)],
    "SPMDTORCH_HEARTBEAT_TIMEOUT": [("7", 7)],
    "SPMDTORCH_INIT_TIMEOUT": [("60", 60)],
    "MASTER_ADDR": [("10.1.2.3", "10.1.2.3")],
    "MASTER_PORT": [("29500", 29500)],
    "WORLD_SIZE": [("4", 4)],
    "RANK": [("0", 0), ("3", 3)],
    "LOCAL_RANK": [("1", 1)],
    "LOCAL_WORLD_SIZE": [("2", 2)],
    "TORCHELASTIC_USE_AGENT_STORE": [("True", True), ("False", False), ("1", False)],
    # PyTorch/XLA's variables (acted on by spmdtorch.compat.install()).
    "PT_XLA_DEBUG_LEVEL": [("0", 0), ("2", 2)],
    "XLA_USE_BF16": [("1", True), ("0", False)],
    "XLA_DOWNCAST_BF16": [("1", True), ("false", False)],
    "XLA_IR_DEBUG": [("1", True)],
    "XLA_HLO_DEBUG": [("1", True)],
    "XLA_SAVE_TENSORS_FILE": [("/tmp/graphs.txt", "/tmp/graphs.txt")],
    "XLA_SAVE_TENSORS_FMT": [("text", "text"), ("HLO", "hlo"), ("dot", "dot")],
    "XLA_METRICS_FILE": [("/tmp/m.txt", "/tmp/m.txt")],
    "XLA_AUTO_SPMD_MESH": [("8", (8,)), ("2,4", (2, 4)), (" 2, 2 ", (2, 2))],
    "SLURM_STEP_NUM_TASKS": [("4", 4)],
    "OMPI_COMM_WORLD_SIZE": [("2", 2)],
    "OMPI_MCA_orte_hnp_uri": [("1531576320.0;tcp://10.96.0.1:34911", "1531576320.0;tcp://10.96.0.1:34911")],
    "PMI_SIZE": [("8", 8)],
    "TPU_WORKER_HOSTNAMES": [("h0,h1", "h0,h1")],
    "TPU_PROCESS_ADDRESSES": [("h0:8476,h1:8476", "h0:8476,h1:8476")],
    "MEGASCALE_NUM_SLICES": [("2", 2)],
    "SPMDTORCH_AUTO_DISTRIBUTED": [("0", False), ("on", True)],
    "SPMDTORCH_JOINED_PID": [("1234", 1234)],
    "SPMDTORCH_LAUNCH_FINISHED_DIR": [("/tmp/spmdtorch-launch-x", "/tmp/spmdtorch-launch-x")],
    "SPMDTORCH_CONNECT_TIMEOUT": [("5", 5)],
    "SPMDTORCH_PEER_WATCH": [("0", False), ("yes", True)],
    "SPMDTORCH_CPU_DEVICES": [("4", 4), (" 1 ", 1)],
    "SPMDTORCH_ATTENTION_KERNEL": [("auto", "auto"), ("XLA", "xla"), ("pallas", "pallas")],
}

# env variable -> [(raw value, the error's class, the reason it gives)]
BAD = {
    "SPMDTORCH_MAX_IN_FLIGHT": [("eight", ConfigError, "is not an integer"), ("-1", ConfigError, "must be >= 0")],
    "SPMDTORCH_COMPILE_CACHE_SIZE": [("0", ConfigError, "must be >= 1"), ("1k", ConfigError, "is not an integer")],
    "SPMDTORCH_LOG_RECOMPILES": [("maybe", ConfigError, "is not a boolean")],
    "SPMDTORCH_DEFER_UPLOAD": [("later", ConfigError, "is not a boolean")],
    "SPMDTORCH_MAX_GATHER_BYTES": [
        ("lots", ConfigError, "must be a whole number of bytes"),
        ("-5", ConfigError, "must be >= 0"),
    ],
    "PJRT_DEVICE": [("XPU", InvalidPjrtDeviceError, "is not supported")],
    "SPMDTORCH_NUM_PROCESSES": [
        ("two", DistributedInitError, "is not an integer"),
        ("0", DistributedInitError, "must be >= 1"),
    ],
    "SPMDTORCH_PROCESS_ID": [("-1", DistributedInitError, "must be >= 0")],
    "SPMDTORCH_LOCAL_DEVICE_IDS": [("0;1", DistributedInitError, "must be a comma-separated list")],
    "SPMDTORCH_COORDINATOR_PORT": [("port", DistributedInitError, "is not an integer")],
    "SPMDTORCH_HEARTBEAT_TIMEOUT": [("0", DistributedInitError, "must be >= 1")],
    "SPMDTORCH_INIT_TIMEOUT": [("5m", DistributedInitError, "is not an integer")],
    "MASTER_PORT": [("x", DistributedInitError, "is not an integer")],
    "WORLD_SIZE": [("0", DistributedInitError, "must be >= 1")],
    "RANK": [("r0", DistributedInitError, "is not an integer")],
    "LOCAL_RANK": [("-2", DistributedInitError, "must be >= 0")],
    "LOCAL_WORLD_SIZE": [("many", DistributedInitError, "is not an integer")],
    "PT_XLA_DEBUG_LEVEL": [("high", ConfigError, "is not an integer")],
    "XLA_USE_BF16": [("yes please", ConfigError, "is not a boolean")],
    "XLA_SAVE_TENSORS_FMT": [("svg", ConfigError, "is not a graph format")],
    "XLA_AUTO_SPMD_MESH": [
        ("2x4", ConfigError, "must be a comma-separated list of mesh axis sizes"),
        ("2,0", ConfigError, "has an axis size < 1"),
    ],
    "SLURM_STEP_NUM_TASKS": [("x", DistributedInitError, "is not an integer")],
    "OMPI_COMM_WORLD_SIZE": [("0", DistributedInitError, "must be >= 1")],
    "PMI_SIZE": [("n", DistributedInitError, "is not an integer")],
    "MEGASCALE_NUM_SLICES": [("0", DistributedInitError, "must be >= 1")],
    "SPMDTORCH_AUTO_DISTRIBUTED": [("auto", ConfigError, "is not a boolean")],
    "SPMDTORCH_JOINED_PID": [("me", ConfigError, "is not an integer")],
    "SPMDTORCH_CONNECT_TIMEOUT": [("0", DistributedInitError, "must be >= 1")],
    "SPMDTORCH_PEER_WATCH": [("sometimes", ConfigError, "is not a boolean")],
    "SPMDTORCH_CPU_DEVICES": [("0", ConfigError, "must be >= 1"), ("four", ConfigError, "is not an integer")],
    "SPMDTORCH_ATTENTION_KERNEL": [("flash", ConfigError, "is not an attention kernel")],
}


def test_every_knob_is_a_settings_field_with_its_default():
    fields = {f.name: f.default for f in dataclasses.fields(config.Settings)}
    assert {k.field: k.default for k in config.KNOBS} == fields
    assert len({k.env for k in config.KNOBS}) == len(config.KNOBS)
    assert config.read({}) == config.Settings()


def test_every_knob_has_a_parse_test():
    # A new knob must come with its cases here (and in BAD, unless it takes any string).
    assert set(GOOD) == set(KNOB)


@pytest.mark.parametrize("env,raw,value", [(e, r, v) for e, cases in GOOD.items() for r, v in cases])
def test_parse(env, raw, value):
    assert getattr(config.read({env: raw}), KNOB[env].field) == value
    assert config.read_one(KNOB[env].field, {env: raw}) == value


@pytest.mark.parametrize("env", sorted(KNOB))
def test_unset_and_empty_mean_the_default(env):
    k = KNOB[env]
    assert getattr(config.read({}), k.field) == k.default
    assert getattr(config.read({env: "  "}), k.field) == k.default


@pytest.mark.parametrize("env,raw,cls,reason", [(e, *c) for e, cases in BAD.items() for c in cases])
def test_bad_value_names_variable_value_valid_values_and_fix(env, raw, cls, reason):
    with pytest.raises(cls) as info:
        config.read({env: raw})
    err = info.value
    assert isinstance(err, ConfigError) and isinstance(err, ValueError)
    assert (err.name, err.value) == (env, raw)
    msg = str(err)
    assert msg.startswith(f"{env}={raw!r} {reason}"), msg
    assert f"valid values: {KNOB[env].valid}" in msg
    assert f"Fix: set {env} to {KNOB[env].valid}, or unset it" in msg
    with pytest.raises(cls):
        config.read_one(KNOB[env].field, {env: raw})


def test_read_one_parses_only_its_knob():
    env = {"RANK": "not a number", "SPMDTORCH_MAX_IN_FLIGHT": "2"}
    assert config.read_one("max_in_flight", env) == 2
    with pytest.raises(DistributedInitError, match="RANK='not a number'"):
        config.read(env)


def test_error_classes_keep_their_runtime_families():
    import spmdtorch.runtime as xr

    assert xr.InvalidPjrtDeviceError is InvalidPjrtDeviceError
    assert xr.DistributedInitError is DistributedInitError
    assert xr.RuntimeConfigError is RuntimeConfigError
    assert issubclass(InvalidPjrtDeviceError, RuntimeConfigError) and issubclass(InvalidPjrtDeviceError, ValueError)
    with pytest.raises(DistributedInitError):
        config.read({"RANK": "x"})


def test_error_pickles():
    err = ConfigError("SPMDTORCH_MAX_IN_FLIGHT", "x", "is not an integer", "a whole number >= 0", "set it")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ConfigError and str(back) == str(err) and back.name == err.name


def test_default_fix_mentions_the_default():
    with pytest.raises(ConfigError, match=r"or unset it for the default \(8\)"):
        config.read({"SPMDTORCH_MAX_IN_FLIGHT": "x"})


def test_settings_is_read_once_and_reload_rereads(monkeypatch):
    monkeypatch.delenv("SPMDTORCH_MAX_IN_FLIGHT", raising=False)
    before = config.reload()
    assert config.settings() is before
    monkeypatch.setenv("SPMDTORCH_MAX_IN_FLIGHT", "3")
    assert config.settings().max_in_flight == before.max_in_flight == 8  # a snapshot
    try:
        assert config.reload().max_in_flight == 3
        assert config.settings().max_in_flight == 3
        monkeypatch.setenv("SPMDTORCH_MAX_IN_FLIGHT", "x")
        with pytest.raises(ConfigError, match="SPMDTORCH_MAX_IN_FLIGHT='x'"):
            config.reload()
    finally:
        monkeypatch.delenv("SPMDTORCH_MAX_IN_FLIGHT")
        config.reload()
    assert config.settings().max_in_flight == 8


def test_settings_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.settings().max_in_flight = 1  # type: ignore[misc]


def test_a_bad_engine_knob_fails_the_first_step_with_the_named_error():
    import os
    import subprocess
    import sys

    env = {**os.environ, "SPMDTORCH_COMPILE_CACHE_SIZE": "big"}
    code = "import torch, spmdtorch\nx = torch.ones(2, device='xla') + 1\nprint(x.cpu())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "spmdtorch.config.ConfigError: SPMDTORCH_COMPILE_CACHE_SIZE='big' is not an integer" in out.stderr
