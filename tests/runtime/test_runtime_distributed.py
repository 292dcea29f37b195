"""spmdtorch.runtime's multi-process part: where initialize_distributed's settings
come from, its checks, and the cross-host gather limit.

Joining real processes is tested in tests/multiprocess (through the launcher).
"""

from __future__ import annotations

import os
import socket
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
    monkeypatch.setattr(xr._distributed, "_DISTRIBUTED", [None])
    cfg = xr.initialize_distributed("127.0.0.1:1", 1, 0)
    assert cfg.num_processes == 1 and not xr.is_distributed_initialized()
    assert xr.initialize_distributed("127.0.0.1:1", 1, 0) is cfg  # idempotent
    with pytest.raises(DistributedInitError, match="cannot be re-initialised"):
        xr.initialize_distributed("127.0.0.1:1", 2, 0)


def test_refused_once_jax_has_started(devices8, monkeypatch):
    monkeypatch.setattr(xr._distributed, "_DISTRIBUTED", [None])
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


# -- joining at import (spmdtorch.runtime.auto_initialize_distributed, spmdtorch.runtime._cluster) -----------


@pytest.mark.parametrize(
    "env,launcher,count,method",
    [
        (LAUNCHER, "spmdtorch.launch", 2, None),
        (TORCHRUN, "torchrun", 4, None),
        ({"WORLD_SIZE": "2"}, "torchrun", 2, None),
        ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_ID": "7"}, "slurm", 4, None),
        ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:1"}, "openmpi", 2, None),
        ({"OMPI_COMM_WORLD_SIZE": "2"}, "openmpi", 2, "mpi4py"),  # Open MPI 5: JAX needs mpi4py
        ({"PMI_SIZE": "3"}, "mpi", 3, "mpi4py"),
        ({"TPU_WORKER_HOSTNAMES": "h0,h1"}, "tpu", 2, None),
        ({"TPU_PROCESS_ADDRESSES": "a:1,b:1,c:1", "TPU_WORKER_HOSTNAMES": "h0"}, "tpu", 3, None),
        ({"MEGASCALE_NUM_SLICES": "2"}, "tpu", None, None),
    ],
)
def test_multi_process_launchers_are_detected(env, launcher, count, method):
    from spmdtorch.runtime._cluster import detect_job

    job = detect_job(env)
    assert job is not None and (job.launcher, job.num_processes, job.jax_detection) == (launcher, count, method)
    assert "=" in job.evidence


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"WORLD_SIZE": "1", "RANK": "0"},
        {**LAUNCHER, "SPMDTORCH_NUM_PROCESSES": "1", "SPMDTORCH_PROCESS_ID": "0"},
        {"SLURM_STEP_NUM_TASKS": "1", "SLURM_JOB_ID": "7"},  # a batch script / one task
        {"OMPI_COMM_WORLD_SIZE": "1"},
        {"TPU_WORKER_HOSTNAMES": "localhost"},
    ],
)
def test_one_process_is_no_job_to_join(env):
    from spmdtorch.runtime._cluster import detect_job

    assert detect_job(env) is None


def test_world_size_without_torchruns_rendezvous_is_an_error_not_a_silent_single_process():
    with pytest.raises(
        DistributedInitError, match=r"WORLD_SIZE=2 says .* one of 2 .* MASTER_ADDR and RANK are not set"
    ):
        resolve_distributed_config(env={"WORLD_SIZE": "2"})
    with pytest.raises(DistributedInitError, match=r"MASTER_ADDR is not set"):
        resolve_distributed_config(env={"WORLD_SIZE": "2", "RANK": "1"})


def test_auto_join_after_jax_started_names_the_launcher(devices8, monkeypatch):
    monkeypatch.setattr(xr._distributed, "_DISTRIBUTED", [None])
    for k, v in TORCHRUN.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SPMDTORCH_JOINED_PID", raising=False)
    with pytest.raises(DistributedInitError, match=r"torchrun \(WORLD_SIZE=4\) .* before spmdtorch could join"):
        xr.auto_initialize_distributed()
    # Opting out, or being the subprocess of a process that joined, does nothing.
    monkeypatch.setenv("SPMDTORCH_AUTO_DISTRIBUTED", "0")
    assert xr.auto_initialize_distributed() is None
    monkeypatch.setenv("SPMDTORCH_AUTO_DISTRIBUTED", "1")
    monkeypatch.setenv("SPMDTORCH_JOINED_PID", str(os.getpid() + 1))
    assert xr.auto_initialize_distributed() is None
    assert xr._distributed._DISTRIBUTED[0] is None


def test_nothing_to_join_in_a_plain_process(monkeypatch):
    monkeypatch.setattr(xr._distributed, "_DISTRIBUTED", [None])
    assert xr.auto_initialize_distributed() is None and xr._distributed._DISTRIBUTED[0] is None


def test_coordinator_check_names_the_address(monkeypatch):
    from spmdtorch.launch import free_port

    bad_host = xr.DistributedConfig("no-such-host.invalid:1234", 2, 1, None, "arguments")
    with pytest.raises(
        DistributedInitError, match=r"cannot resolve the host of the coordinator no-such-host.invalid:1234"
    ):
        xr._distributed._check_coordinator(bad_host)
    monkeypatch.setenv("SPMDTORCH_CONNECT_TIMEOUT", "1")
    address = f"127.0.0.1:{free_port()}"
    with pytest.raises(DistributedInitError, match=rf"process 1 of 2 cannot reach the coordinator {address} .* 1 s"):
        xr._distributed._check_coordinator(xr.DistributedConfig(address, 2, 1, None, "arguments"))
    # Process 0 listens itself: the address must lead back to it (here it does) ...
    xr._distributed._check_coordinator(xr.DistributedConfig(address, 2, 0, None, "arguments"))
    # ... not to another host (TEST-NET-1, RFC 5737: never routed) ...
    port = free_port()
    elsewhere = f"192.0.2.1:{port}"
    with pytest.raises(
        DistributedInitError,
        match=rf"process 0 of 2 listens for the coordinator {elsewhere} .* on port {port} .* does not lead back to it",
    ):
        xr._distributed._check_coordinator(xr.DistributedConfig(elsewhere, 2, 0, None, "arguments"))
    # ... and its port must be free.
    with socket.create_server(("", port)):
        with pytest.raises(
            DistributedInitError, match=rf"process 0 of 2 cannot listen on port {port} .* pick a free port"
        ):
            xr._distributed._check_coordinator(xr.DistributedConfig(f"127.0.0.1:{port}", 2, 0, None, "arguments"))
