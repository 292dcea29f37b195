"""Multi-host faults (issue 20, point 4): a peer killed during an async checkpoint save or a
restore ends every other process with the named ``PeerLostError`` (exit status 75) within
seconds, never a hang, and the previous checkpoint step stays restorable; a coordinator
address that leads nowhere fails fast, naming it. (A peer killed during a collective:
``test_multiprocess.test_dead_peer_ends_the_survivor_with_a_named_error``.)

Every job runs under the launcher's hard ``timeout_s`` (SIGKILL for everything after it)
with a heartbeat timeout of 30 s, far above the time the survivor may take: it must stop
from its peer's closed connection, not from JAX's heartbeat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from spmdtorch.checkpoint import CheckpointManager
from spmdtorch.launch import free_port
from spmdtorch.runtime import PEER_LOST_EXIT_STATUS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import peer_fault_checkpoint as job  # noqa: E402  this folder, put on sys.path above
from test_multiprocess import LAUNCH_TIMEOUT_S, _tail, run_job  # noqa: E402

HEARTBEAT_S = 30
SCRIPT = "peer_fault_checkpoint.py"


def _assert_survivor_named_the_loss(result, text: str, victim: int, activity: str) -> str:
    """The victim died by SIGKILL; the survivor wrote one PeerLostError line and exited 75 at once."""
    assert not result.timed_out and "SURVIVED" not in text, _tail(text)
    dead, survivor = result.ranks[victim], result.ranks[1 - victim]
    assert dead.returncode == -signal.SIGKILL and result.first_failure == victim, _tail(text)
    assert survivor.returncode == PEER_LOST_EXIT_STATUS, _tail(text)
    lines = [line for line in text.splitlines() if "PeerLostError:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"[rank {1 - victim}] spmdtorch.runtime.PeerLostError: "), _tail(
        text
    )
    line = lines[0]
    assert f"process {victim} of 2 was lost" in line and activity in line, line
    assert f"heartbeat timeout is {HEARTBEAT_S} s" in line and ".latest_step()" in line, line
    assert survivor.elapsed_s - dead.elapsed_s < 10, (survivor, dead)
    return line


def _check_restores(directory: Path, step: int) -> None:
    """This process (1 x 8 devices), a fresh job: only finalised steps listed, the newest restores bit for bit."""
    with CheckpointManager(directory, save_on_preemption=False) as mgr:
        assert mgr.all_steps() == [step]
        target = mgr.restore(job.sharded_state(0))
        assert mgr.restored_step == step
    expected = job.state_values(step)
    assert target["step"] == step
    torch.testing.assert_close(target["w"].cpu(), expected["w"], rtol=0, atol=0)
    torch.testing.assert_close(target["b"].cpu(), expected["b"], rtol=0, atol=0)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
@pytest.mark.slow
def test_peer_killed_during_async_save_leaves_the_previous_step_restorable(devices8, tmp_path):
    directory = tmp_path / "ckpt"
    result, text, _ = run_job(
        SCRIPT, str(directory), "save-killed", "1", heartbeat_timeout_s=HEARTBEAT_S, grace_period_s=80.0
    )
    _assert_survivor_named_the_loss(result, text, 1, f"writing checkpoint step 2 to {directory} in the background")
    assert "saving 2" in text, _tail(text)  # the kill did land after step 2's save started
    _check_restores(directory, 1)


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
def test_peer_killed_during_restore_leaves_the_checkpoint_restorable(devices8, tmp_path):
    directory = tmp_path / "ckpt"
    with CheckpointManager(directory, async_save=False, save_on_preemption=False) as mgr:
        mgr.save(1, job.sharded_state(1))  # saved by 1 x 8 devices, restored by 2 x 4
    result, text, _ = run_job(
        SCRIPT, str(directory), "restore-killed", "0", heartbeat_timeout_s=HEARTBEAT_S, grace_period_s=80.0
    )
    _assert_survivor_named_the_loss(result, text, 0, f"restoring the checkpoint {directory}/1")
    _check_restores(directory, 1)


@pytest.mark.slow
@pytest.mark.timeout(3 * LAUNCH_TIMEOUT_S + 60)
@pytest.mark.parametrize("victim", [0, 1])
def test_after_a_peer_lost_during_save_a_two_process_job_resumes(devices8, tmp_path, victim):
    directory = tmp_path / "ckpt"
    result, text, _ = run_job(
        SCRIPT, str(directory), "save-killed", str(victim), heartbeat_timeout_s=HEARTBEAT_S, grace_period_s=80.0
    )
    _assert_survivor_named_the_loss(result, text, victim, "writing checkpoint step 2")
    # The restarted job (2 x 4 again) lists step 1 only and restores it.
    result, text, reports = run_job(SCRIPT, str(directory), "check")
    assert result.returncode == 0, _tail(text)
    for rep in reports.values():
        assert rep["steps"] == [1] and rep["restored"] == 1 and rep["equal"] and rep["step"] == 1, rep
    # A peer killed while that job restores: the checkpoint is still intact.
    result, text, _ = run_job(
        SCRIPT, str(directory), "restore-killed", str(1 - victim), heartbeat_timeout_s=HEARTBEAT_S, grace_period_s=80.0
    )
    _assert_survivor_named_the_loss(result, text, 1 - victim, "restoring the checkpoint")
    _check_restores(directory, 1)


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_coordinator_address_leading_nowhere_fails_fast_naming_it():
    # Both processes of a 2-process job are given an address of another host (TEST-NET-1,
    # RFC 5737: never routed). Process 0 listens on the port but cannot reach itself
    # through the address; process 1 cannot reach it at all. Neither may wait for JAX's
    # initialization timeout (300 s, then SIGABRT with "DEADLINE_EXCEEDED").
    port = free_port()
    address = f"192.0.2.1:{port}"
    launcher = ("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR", "SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_")
    base = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in ("RANK", "WORLD_SIZE")}
    procs = []
    start = time.monotonic()
    for rank in (0, 1):
        env = dict(
            base,
            SPMDTORCH_COORDINATOR_ADDRESS=address,
            SPMDTORCH_NUM_PROCESSES="2",
            SPMDTORCH_PROCESS_ID=str(rank),
            SPMDTORCH_CONNECT_TIMEOUT="5",
            JAX_PLATFORMS="cpu",
        )
        code = "import spmdtorch; print('IMPORTED')"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    outs = []
    try:
        for proc in procs:
            outs.append(proc.communicate(timeout=90))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()  # JAX traps SIGTERM
                proc.wait()
    elapsed = time.monotonic() - start
    (out0, err0), (out1, err1) = outs
    assert procs[0].returncode == 1 and "IMPORTED" not in out0, err0[-3000:]
    assert procs[1].returncode == 1 and "IMPORTED" not in out1, err1[-3000:]
    assert f"process 0 of 2 listens for the coordinator {address} (SPMDTORCH_*) on port {port}" in err0, err0[-3000:]
    assert "does not lead back to it within 5 s" in err0, err0[-3000:]
    assert f"process 1 of 2 cannot reach the coordinator {address}" in err1, err1[-3000:]
    assert elapsed < 60, elapsed  # imports (~10 s on a busy CI machine) + 5 s, not 300 s


def test_the_peer_lost_message_is_one_line_naming_peer_activity_timeout_and_fix(tmp_path):
    from spmdtorch.runtime import PeerLostError
    from spmdtorch.runtime import faults as _faults

    with CheckpointManager(tmp_path / "ck", save_on_preemption=False):
        with _faults.activity("restoring the checkpoint X\nof step 3"):
            e = _faults.peer_lost_error(1, "killed", 0, 2, 45)
        assert isinstance(e, PeerLostError) and isinstance(e, RuntimeError)
        text = str(e)
        assert "\n" not in text and e.peer == 1 and "restoring the checkpoint X of step 3" in e.activity
        assert text.startswith("process 1 of 2 was lost (killed) while this process (0 of 2) was restoring"), text
        assert "test_peer_faults.py:" in text  # where this process's main thread was
        assert "heartbeat timeout is 45 s" in text and f"exits with status {PEER_LOST_EXIT_STATUS}" in text
        assert f"CheckpointManager('{tmp_path / 'ck'}').latest_step()" in text
        # Outside every region: what the main thread runs; a process ending on an exception says so.
        assert "was running Python code, at test_peer_faults.py:" in str(_faults.peer_lost_error(None, "x", 0, 2, 1))
        failing = _faults.peer_lost_error(None, "x", 1, 2, 1, failing="ValueError")
        assert str(failing).startswith(
            "a peer process was lost (x) while this process (1 of 2) was ending on an uncaught ValueError"
        )


def test_only_a_clean_end_notes_that_the_script_finished(tmp_path):
    from spmdtorch.runtime import faults as _faults

    clean = _faults._Watch(0, 2, 30, str(tmp_path / "0"))
    clean.say_goodbye()  # no peers connected: nothing is sent, the note is still written
    assert (tmp_path / "0").exists()
    failing = _faults._Watch(1, 2, 30, str(tmp_path / "1"))
    failing.note_exit(3)
    assert failing.failing == "SystemExit(3)" and failing.exit_status == 3
    failing.say_goodbye()  # without peers it does not end the process
    assert not (tmp_path / "1").exists()
    # Python's sys.exit rules: None and 0 are success; other objects end with status 1.
    for code, status in ((None, None), (0, None), ("bad config", 1), (256, 1), (True, 1)):
        w = _faults._Watch(1, 2, 30)
        w.note_exit(code)
        assert (w.failing is None) == (status is None) and (status is None or w.exit_status == status), code
