"""spmdtorch.runtime's multi-process part: where initialize_distributed's settings
come from, its checks, and the cross-host gather limit.

Joining real processes is tested in tests/multiprocess (through the launcher).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import spmdtorch.runtime as xr
from spmdtorch.runtime import DistributedInitError, resolve_distributed_config

TORCHRUN = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500", "RANK": "3", "WORLD_SIZE": "4"}
LAUNCHER = {
    "SPMDTORCH_COORDINATOR_ADDRESS": "127.0.0.1:4000",
    "SPMDTORCH_NUM_PROCESSES": "2",
    "SPMDTORCH_PROCESS_ID": "1",
}


def test_arguments_win_over_the_environment():
    cfg = resolve_distributed_config("h:1", 8, 5, env={**LAUNCHER, **TORCHRUN})
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.source) == ("h:1", 8, 5, "arguments")


def test_launcher_variables_come_before_torchrun_ones():
    cfg = resolve_distributed_config(env={**LAUNCHER, **TORCHRUN, "SPMDTORCH_LOCAL_DEVICE_IDS": "0,1"})
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id) == ("127.0.0.1:4000", 2, 1)
    assert cfg.source == "SPMDTORCH_*" and cfg.local_device_ids == (0, 1)


def test_torchrun_variables():
    cfg = resolve_distributed_config(env=TORCHRUN)
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.source) == (
        "10.1.2.3:29500",
        4,
        3,
        "torchrun",
    )
    assert cfg.local_device_ids is None
    # torchrun's agent holds MASTER_PORT with its own store: the coordinator takes the next port.
    agent = resolve_distributed_config(env={**TORCHRUN, "TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert agent.coordinator_address == "10.1.2.3:29501"
    port = resolve_distributed_config(env={**TORCHRUN, "SPMDTORCH_COORDINATOR_PORT": "7777"})
    assert port.coordinator_address == "10.1.2.3:7777"
    # Several processes per host (one per GPU): each takes its local rank's device.
    per_gpu = resolve_distributed_config(env={**TORCHRUN, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"})
    assert per_gpu.local_device_ids == (1,)


def test_nothing_configured_leaves_it_to_jax_cluster_detection():
    cfg = resolve_distributed_config(env={})
    assert (cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.source) == (None, None, None, "jax")


def test_heartbeat_timeout():
    assert resolve_distributed_config(env={}).heartbeat_timeout_s == xr.DEFAULT_HEARTBEAT_TIMEOUT_S
    assert resolve_distributed_config(env={"SPMDTORCH_HEARTBEAT_TIMEOUT": "7"}).heartbeat_timeout_s == 7
    assert resolve_distributed_config(heartbeat_timeout_s=3, env={}).heartbeat_timeout_s == 3


@pytest.mark.parametrize(
    "args,env,match",
    [
        (
            (None, None, None),
            {**LAUNCHER, "SPMDTORCH_NUM_PROCESSES": "two"},
            "SPMDTORCH_NUM_PROCESSES='two' is not an integer",
        ),
        (
            (None, None, None),
            {"SPMDTORCH_COORDINATOR_ADDRESS": "h:1", "SPMDTORCH_NUM_PROCESSES": "2"},
            r"process_id not given .*SPMDTORCH_PROCESS_ID",
        ),
        ((None, None, None), {**TORCHRUN, "MASTER_PORT": ""}, "MASTER_ADDR is set but MASTER_PORT is not"),
        (("h:1", 2, 2), {}, r"process_id must be an int in 0..1 \(num_processes=2\), got 2"),
        (("h:1", 0, 0), {}, "num_processes must be an int >= 1, got 0"),
        (("host-without-port", 2, 0), {}, "must be 'host:port'"),
        (
            (None, None, None),
            {**LAUNCHER, "SPMDTORCH_LOCAL_DEVICE_IDS": "0;1"},
            "SPMDTORCH_LOCAL_DEVICE_IDS='0;1' must be a comma-separated list",
        ),
    ],
)
def test_malformed_settings(args, env, match):
    with pytest.raises(DistributedInitError, match=match):
        resolve_distributed_config(*args, env=env)


def test_a_bool_is_not_a_local_device_id():
    assert resolve_distributed_config("h:1", 2, 0, 1, env={}).local_device_ids == (1,)
    with pytest.raises(DistributedInitError, match="local_device_ids must be a device id .* got True"):
        resolve_distributed_config("h:1", 2, 0, True, env={})


def test_a_job_of_one_process_is_a_no_op(monkeypatch):
    monkeypatch.setattr(xr, "_DISTRIBUTED", [None])
    cfg = xr.initialize_distributed("127.0.0.1:1", 1, 0)
    assert cfg.num_processes == 1 and not xr.is_distributed_initialized()
    assert xr.initialize_distributed("127.0.0.1:1", 1, 0) is cfg  # idempotent
    with pytest.raises(DistributedInitError, match="cannot be re-initialised"):
        xr.initialize_distributed("127.0.0.1:1", 2, 0)


def test_refused_once_jax_has_started(devices8, monkeypatch):
    monkeypatch.setattr(xr, "_DISTRIBUTED", [None])
    with pytest.raises(DistributedInitError, match="must run before JAX starts.*8 device"):
        xr.initialize_distributed("127.0.0.1:1", 2, 0)


def test_no_cluster_found_means_one_process():
    code = (
        "import spmdtorch.runtime as xr\n"
        "cfg = xr.initialize_distributed()\n"
        "print(cfg.source, cfg.num_processes, cfg.process_id, xr.process_count(), xr.is_distributed_initialized())\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR")) and k not in ("RANK", "WORLD_SIZE")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["single-process", "1", "0", "1", "False"]


def test_gather_limit(monkeypatch):
    monkeypatch.delenv(xr.ENV_MAX_GATHER_BYTES, raising=False)
    assert xr.max_gather_bytes() == 1 << 30
    monkeypatch.setenv(xr.ENV_MAX_GATHER_BYTES, "123")
    assert xr.max_gather_bytes() == 123
    xr.set_max_gather_bytes(5)
    try:
        assert xr.max_gather_bytes() == 5
    finally:
        xr.set_max_gather_bytes(None)
    assert xr.max_gather_bytes() == 123
    monkeypatch.setenv(xr.ENV_MAX_GATHER_BYTES, "lots")
    with pytest.raises(ValueError, match="SPMDTORCH_MAX_GATHER_BYTES='lots' must be a whole number"):
        xr.max_gather_bytes()
    with pytest.raises(ValueError, match="got -1"):
        xr.set_max_gather_bytes(-1)


def test_single_process_reads_ignore_the_gather_limit(devices8):
    # The limit is about copying other hosts' shards; here every shard is local.
    import numpy as np
    import torch

    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    x = mark_sharding(torch.arange(64.0).to("xla"), Mesh(np.arange(8), (8,), ("d",)), ("d",))
    xr.set_max_gather_bytes(0)
    try:
        assert torch.equal(x.cpu(), torch.arange(64.0))
    finally:
        xr.set_max_gather_bytes(None)


@pytest.mark.parametrize("name", ["spmdtorch.runtime", "spmdtorch.tensor.multihost"])
def test_doctests(devices8, name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
