"""Multi-process jobs: 2 processes x 4 CPU devices, started by the local launcher.

Each test launches a script of this folder with ``spmdtorch.launch.launch``
under a hard ``timeout_s`` (the launcher then SIGKILLs every process), and
reads what the processes report on ``RESULT`` lines.
"""

from __future__ import annotations

import io
import json
import signal
import sys
from pathlib import Path

import pytest
import torch

from spmdtorch.launch import launch
from spmdtorch.runtime import PEER_LOST_EXIT_STATUS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import fsdp_train  # noqa: E402  this folder, put on sys.path above

LAUNCH_TIMEOUT_S = 110  # each test's hard limit; the launcher SIGKILLs everything after it


def run_job(script: str, *args: str, **kwargs):
    """Launches ``script`` (2 x 4 unless told); returns (LaunchResult, output, RESULT dict per rank)."""
    out = io.StringIO()
    kwargs.setdefault("grace_period_s", 5.0)
    kwargs.setdefault("nprocs", 2)
    kwargs.setdefault("devices_per_proc", 4)
    result = launch([str(HERE / script), *args], out=out, timeout_s=LAUNCH_TIMEOUT_S, **kwargs)
    text = out.getvalue()
    reports = {}
    for line in text.splitlines():
        if line.startswith("[rank ") and "] RESULT " in line:
            rank = int(line[len("[rank ") : line.index("]")])
            reports[rank] = json.loads(line.split("] RESULT ", 1)[1])
    return result, text, reports


def _tail(text: str, n: int = 40) -> str:
    return "\n".join([line for line in text.splitlines() if "[Gloo]" not in line][-n:])


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
@pytest.mark.slow
def test_fsdp_training_two_processes_matches_one_process_and_eager(devices8):
    result, text, reports = run_job("fsdp_train.py")
    assert result.returncode == 0, _tail(text)
    assert sorted(reports) == [0, 1], _tail(text)
    for rank, rep in reports.items():
        assert (rep["process_index"], rep["process_count"], rep["devices"], rep["local_devices"]) == (rank, 2, 8, 4)
    # The loss is one global value: both processes read the same numbers.
    assert reports[0]["losses"] == reports[1]["losses"]
    two_by_four = torch.tensor(reports[0]["losses"])

    one_by_eight = torch.tensor(fsdp_train.train_spmd())  # this pytest process: 1 x 8 devices
    eager = torch.tensor(fsdp_train.train_eager())
    assert len(two_by_four) == fsdp_train.STEPS
    # Same program on the same 8-device mesh; only the collectives' summation
    # order (gloo across processes vs in-process) and the row order of the
    # global batch differ: float32 rounding.
    torch.testing.assert_close(two_by_four, one_by_eight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(two_by_four, eager, rtol=1e-5, atol=1e-6)
    assert not torch.equal(two_by_four[0], two_by_four[-1])  # the optimizer did change the model


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_multihost_semantics(devices8):
    result, text, reports = run_job("multihost_checks.py")
    assert result.returncode == 0, _tail(text)
    # Each process noted that its script finished (the launcher's way to tell a hung rank from one waiting for it).
    assert all(r.finished_script for r in result.ranks), result.ranks
    assert sorted(reports) == [0, 1], _tail(text)
    host = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    for rank, rep in reports.items():
        assert rep["source"] == "SPMDTORCH_*"  # what the launcher set, read by initialize_distributed()
        assert rep["counts"] == [rank, 2, 8, 4, 4]
        # HybridMesh(ici (1, 4), dcn (2, 1)): DCN row r is process r's devices.
        assert rep["hybrid_rows"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
        # mark_sharding of host data: this process holds only its own rows ...
        assert rep["local_rows"] == [[4 * rank, 4 * rank + 4]]
        # ... and reads gather the whole tensor from both processes.
        assert rep["cpu_equal"] and rep["matmul_equal"] and rep["print_has_values"]
        assert rep["item"] == float(host.sum() * 2)
        msg = rep["gather_limit"]
        assert msg is not None and "(8, 8)" in msg and "256 bytes" in msg and "limit of 64 bytes" in msg
        # minibatch=True: process p loaded rows 100 * p + ...; the batch is global.
        assert rep["minibatch_shape"] == [8, 3]
        expected = torch.cat([torch.arange(12.0).reshape(4, 3), torch.arange(12.0).reshape(4, 3) + 100])
        assert rep["minibatch_value"] == expected.tolist()
        assert rep["minibatch_local_rows"] == [[4 * rank + i, 4 * rank + i + 1] for i in range(4)]


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.parametrize("victim", [1, 0], ids=["worker", "coordinator"])
def test_dead_peer_ends_the_survivor_with_a_named_error(devices8, victim):
    heartbeat = 30
    # A grace period far above the heartbeat timeout: the launcher's SIGTERM
    # is trapped by JAX, so the survivor can only stop on its own.
    result, text, _ = run_job("dead_peer.py", str(victim), heartbeat_timeout_s=heartbeat, grace_period_s=80.0)
    assert not result.timed_out, _tail(text)
    assert "SURVIVED" not in text, _tail(text)
    dead, survivor = result.ranks[victim], result.ranks[1 - victim]
    assert dead.returncode == -signal.SIGKILL and result.first_failure == victim, _tail(text)
    assert result.returncode == 128 + signal.SIGKILL
    # The survivor ends itself with the named error, one line, and status 75 ...
    assert survivor.returncode == PEER_LOST_EXIT_STATUS, _tail(text)
    lines = [line for line in text.splitlines() if "PeerLostError:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"[rank {1 - victim}] spmdtorch.runtime.PeerLostError: "), _tail(
        text
    )
    assert f"process {victim} of 2 was lost" in lines[0], lines[0]
    # What the survivor was doing when its watch saw the closed connection:
    # nearly always blocked in the step's collective, but the kill can also
    # land while it records the step's `x + 1` (seen once in ~20 runs).
    doing = ("waiting for a program's results (a collective", "running Python code")
    assert any(d in lines[0] for d in doing) and "dead_peer.py:" in lines[0], lines[0]
    assert f"heartbeat timeout is {heartbeat} s" in lines[0] and "latest_step()" in lines[0], lines[0]
    # ... at once: its closed connection, not JAX's heartbeat timeout (nor the launcher) ended it.
    assert survivor.elapsed_s - dead.elapsed_s < 10, (survivor, dead)
    assert f"[launch]   rank {1 - victim}: exit status 75, peer lost (PeerLostError)" in text, _tail(text)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_an_error_raised_because_a_peer_died_is_reported_as_the_lost_peer(devices8, tmp_path):
    # CI, stop 51: a SIGKILLed peer's gloo connection closed a moment before its watch
    # connection; the survivor's step raised JaxRuntimeError and exited 1 before its watch
    # saw the loss, so the launcher named the survivor, not the killed process, as the cause.
    result, text, _ = run_job("dead_peer.py", "1", "race", str(tmp_path), heartbeat_timeout_s=30, grace_period_s=80.0)
    assert not result.timed_out and "SURVIVED" not in text, _tail(text)
    dead, survivor = result.ranks[1], result.ranks[0]
    # The survivor's own error is shown (its traceback), then the loss it came from ends it.
    assert "JaxRuntimeError: UNAVAILABLE: Gloo: connection closed by peer" in text, _tail(text)
    assert dead.returncode == -signal.SIGKILL and survivor.returncode == PEER_LOST_EXIT_STATUS, _tail(text)
    assert "process 1 of 2 was lost" in text and "ending on an uncaught JaxRuntimeError" in text, _tail(text)
    assert result.first_failure == 1 and result.returncode == 128 + signal.SIGKILL, result


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_a_peer_failing_with_an_exception_ends_the_others_and_is_named_the_cause(devices8):
    result, text, _ = run_job("dead_peer.py", "1", "raise", heartbeat_timeout_s=30, grace_period_s=80.0)
    assert not result.timed_out and "SURVIVED" not in text, _tail(text)
    assert "ValueError: the victim fails" in text, _tail(text)
    failed, survivor = result.ranks[1], result.ranks[0]
    # The failing process exits 1 at once (not held by JAX's shutdown barrier); the survivor is told.
    assert failed.returncode == 1 and survivor.returncode == PEER_LOST_EXIT_STATUS, _tail(text)
    assert "process 1 of 2 was lost (it ended on an uncaught ValueError)" in text, _tail(text)
    assert abs(survivor.elapsed_s - failed.elapsed_s) < 10, (survivor, failed)
    # Whichever ended first, the launcher names the cause, not the process that lost its peer.
    assert result.first_failure == 1 and result.returncode == 1, result
    assert "[launch] first failure: rank 1 (failed (exit status 1))" in text, _tail(text)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
def test_a_peer_calling_sys_exit_with_a_failure_status_ends_the_job_with_that_status(devices8):
    # sys.exit(3) used to say a normal goodbye: the survivor waited in its next
    # collective until JAX gave up (~300 s), every process aborted, status 3 was lost.
    result, text, _ = run_job("dead_peer.py", "1", "exit", heartbeat_timeout_s=30, grace_period_s=80.0)
    assert not result.timed_out and "SURVIVED" not in text, _tail(text)
    failed, survivor = result.ranks[1], result.ranks[0]
    assert failed.returncode == 3 and survivor.returncode == PEER_LOST_EXIT_STATUS, _tail(text)
    assert "process 1 of 2 was lost (it ended on sys.exit(3))" in text, _tail(text)
    assert abs(survivor.elapsed_s - failed.elapsed_s) < 10, (survivor, failed)
    assert result.first_failure == 1 and result.returncode == 3, result


def _roundtrip_job(nprocs, devices_per_proc, *args):
    """Run checkpoint_roundtrip.py as one job; process 0's report."""
    result, text, reports = run_job("checkpoint_roundtrip.py", *args, nprocs=nprocs, devices_per_proc=devices_per_proc)
    assert result.returncode == 0, _tail(text)
    assert sorted(reports) == list(range(nprocs)), _tail(text)
    for rank, rep in reports.items():
        assert (rep["process_index"], rep["process_count"], rep["devices"]) == (rank, nprocs, nprocs * devices_per_proc)
    return reports[0]


def _check_restored(saved, *restored):
    for rep in restored:
        assert rep["checked"] == 16  # 4 parameters + 3 AdamW tensors each (exp_avg, exp_avg_sq, step)
    # Every restore was into shardings other than the ones saved from.
    assert saved["specs"]["0.weight"] == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    for rep in restored:
        assert rep["specs"]["0.weight"] != saved["specs"]["0.weight"]
        assert rep["specs"]["0.weight"] != "{replicated}"


@pytest.mark.timeout(3 * LAUNCH_TIMEOUT_S + 30)
@pytest.mark.slow
def test_checkpoint_saved_by_two_processes_restores_in_one_and_back(devices8, tmp_path):
    a, b = str(tmp_path / "A"), str(tmp_path / "B")
    expected = a + ".expected.pt"  # the saved values as CPU tensors, written by the saver's process 0
    # (1) 2 processes x 4 devices save a sharded model + AdamW state (uneven dims: 10 rows over 8).
    saved = _roundtrip_job(2, 4, "save", a, "8")
    # (2) 1 process x 8 devices, another mesh and sharding: restores bit for bit, then saves B.
    one_by_eight = _roundtrip_job(1, 8, "load", a, "2x4", expected, b)
    # (3) and back: 2 processes x 4 devices restore what 1 process saved.
    two_by_four = _roundtrip_job(2, 4, "load", b, "4x2", expected)
    _check_restored(saved, one_by_eight, two_by_four)


@pytest.mark.slow
@pytest.mark.timeout(2 * LAUNCH_TIMEOUT_S + 30)
def test_checkpoint_saved_by_two_processes_restores_on_fewer_devices(devices8, tmp_path):
    a = str(tmp_path / "A")
    saved = _roundtrip_job(2, 4, "save", a, "8")
    # 1 process x 4 devices (10 rows over 4: uneven again, another padding).
    _check_restored(saved, _roundtrip_job(1, 4, "load", a, "4", a + ".expected.pt"))


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 30)
@pytest.mark.slow
def test_sigterm_to_one_process_saves_the_same_step_everywhere(devices8, tmp_path):
    result, text, reports = run_job("preemption.py", str(tmp_path / "ckpt"))
    assert result.returncode == 0, _tail(text)
    assert sorted(reports) == [0, 1], _tail(text)
    stopped = reports[0]["stopped_at"]
    assert stopped is not None and stopped >= 3, _tail(text)  # the SIGTERM came at step 3
    assert reports[1]["stopped_at"] == stopped, reports
    # Step 0 (Orbax saves the first step of an empty directory) and the preemption step.
    assert reports[0]["steps"] == reports[1]["steps"] == [0, stopped]
