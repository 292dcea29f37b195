"""``import spmdtorch`` joins the multi-process job by itself (issue 17, point 2), and
torch.distributed.checkpoint with spmdtorch's planners across processes.

Every process here is bounded: the launcher's ``--timeout`` SIGKILLs its
children (JAX traps SIGTERM) and ``subprocess.run``'s timeout kills the rest.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp

from spmdtorch.checkpoint.distributed_checkpoint import SPMDLoadPlanner
from spmdtorch.launch import free_port, launch
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

HERE = Path(__file__).resolve().parent
LIMIT_S = 110


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables, plus ``extra``."""
    launcher = ("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR", "SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return env


@pytest.mark.timeout(LIMIT_S + 60)
def test_launcher_without_init_call_gives_one_8_device_job():
    cmd = [
        sys.executable, "-m", "spmdtorch.launch", "--nprocs", "2", "--devices-per-proc", "4",
        "--timeout", str(LIMIT_S), "--grace-period", "5", str(HERE / "no_init_call.py"),
    ]  # fmt: skip
    out = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=LIMIT_S + 30, check=False)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    reports = {}
    for line in out.stdout.splitlines():
        if "] RESULT " in line:
            reports[int(line[len("[rank ") : line.index("]")])] = json.loads(line.split("] RESULT ", 1)[1])
    assert sorted(reports) == [0, 1], text[-4000:]
    for rank, rep in reports.items():
        assert rep["joined_at_import"] and rep["source"] == "SPMDTORCH_*"
        # process_index, process_count 2, 8 global devices, 4 of them this process's.
        assert rep["counts"] == [rank, 2, 8, 4]
        assert rep["explicit_same"] and rep["joined_pid_is_self"]
        assert rep["sum"] == float(sum(range(16)) * 2)


def _import_spmdtorch(env: dict[str, str], timeout_s: float = 90) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-c", "import spmdtorch; print('IMPORTED', spmdtorch.runtime.process_count())"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    return out, time.monotonic() - start


@pytest.mark.timeout(150)
def test_unreachable_coordinator_fails_fast_naming_it():
    # Process 1 of 2; nobody listens on the port (process 0 never starts).
    address = f"127.0.0.1:{free_port()}"
    env = _clean_env(
        SPMDTORCH_COORDINATOR_ADDRESS=address,
        SPMDTORCH_NUM_PROCESSES="2",
        SPMDTORCH_PROCESS_ID="1",
        SPMDTORCH_CONNECT_TIMEOUT="2",
        JAX_PLATFORMS="cpu",
    )
    out, elapsed = _import_spmdtorch(env)
    assert out.returncode != 0 and "IMPORTED" not in out.stdout
    assert "DistributedInitError" in out.stderr, out.stderr[-3000:]
    assert f"cannot reach the coordinator {address}" in out.stderr, out.stderr[-3000:]
    assert "spmdtorch.launch (SPMDTORCH_NUM_PROCESSES=2)" in out.stderr, out.stderr[-3000:]
    assert elapsed < 60  # not JAX's 300 s initialization timeout


@pytest.mark.timeout(150)
def test_unresolvable_coordinator_fails_at_once_naming_it():
    env = _clean_env(
        MASTER_ADDR="no-such-host.invalid", MASTER_PORT="29500", RANK="0", WORLD_SIZE="2", JAX_PLATFORMS="cpu"
    )
    out, elapsed = _import_spmdtorch(env)
    assert out.returncode != 0 and "IMPORTED" not in out.stdout
    assert "cannot resolve the host of the coordinator no-such-host.invalid:29500 (torchrun)" in out.stderr, out.stderr[
        -3000:
    ]
    assert "torchrun (WORLD_SIZE=2)" in out.stderr


@pytest.mark.timeout(150)
def test_opt_out_runs_alone():
    env = _clean_env(WORLD_SIZE="2", SPMDTORCH_AUTO_DISTRIBUTED="0", JAX_PLATFORMS="cpu")
    out, _ = _import_spmdtorch(env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["IMPORTED", "1"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
@pytest.mark.timeout(LIMIT_S + 60)
def test_dcp_checkpoint_of_two_processes_reshards_into_one(devices8, tmp_path):
    sys.path.insert(0, str(HERE))
    import dcp_roundtrip  # this folder

    out = io.StringIO()
    path = str(tmp_path / "dcp")
    result = launch(
        [str(HERE / "dcp_roundtrip.py"), path], nprocs=2, devices_per_proc=4, out=out, timeout_s=LIMIT_S,
        grace_period_s=5.0, env=_clean_env(),
    )  # fmt: skip
    text = out.getvalue()
    assert result.returncode == 0, text[-4000:]
    reports = [json.loads(line.split("] RESULT ", 1)[1]) for line in text.splitlines() if "] RESULT " in line]
    assert len(reports) == 2, text[-4000:]
    for rep in reports:
        assert (rep["process_count"], rep["devices"]) == (2, 8)
        assert rep["w_equal"] and rep["r_equal"] and rep["step"] == 7
    # Each process wrote its own shards; this 1 x 8 process reads them into yet another sharding.
    assert len(list((tmp_path / "dcp").glob("*.distcp"))) == 2
    w, r = dcp_roundtrip.values()
    target_w = mark_sharding(torch.zeros(10, 6).to("xla"), Mesh(np.arange(8), (8,), ("x",)), (None, "x"))
    target = {"w": target_w, "r": torch.zeros(3, 4).to("xla"), "step": 0}
    dist_cp.load(target, checkpoint_id=path, planner=SPMDLoadPlanner())
    assert torch.equal(target_w.cpu(), w) and torch.equal(target["r"].cpu(), r) and target["step"] == 7


@pytest.mark.timeout(LIMIT_S + 60)
def test_torchrun_without_init_call_gives_one_job():
    # Real torchrun: its agent holds MASTER_PORT with its store, the coordinator takes the next port.
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
        str(HERE / "report_job.py"),
    ]  # fmt: skip
    env = _clean_env(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4", NPROC="16")
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its workers (JAX traps SIGTERM)
        out, _ = proc.communicate()
        pytest.fail("torchrun job did not finish:\n" + out[-4000:])
    assert proc.returncode == 0, out[-4000:]
    # Both workers share torchrun's stdout: find each report wherever it sits, not one per line.
    reports = sorted(json.loads(found) for found in re.findall(r"RESULT (\[[^\[\]]*\])", out))
    assert reports == [[0, 2, 8, 4, "torchrun"], [1, 2, 8, 4, "torchrun"]], out[-4000:]
