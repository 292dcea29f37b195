"""Save failures are CheckpointSaveErrors, reported to the saver (issue 42, item 16).

Before: a background save's failure was raised by whatever waited next, a
``restore`` included (once, then gone), as the raw error of the layer that
failed (tensorstore's ``ValueError``, an ``OSError``). Now every save failure
is a ``CheckpointSaveError`` naming the step (or path) and the directory, its
cause chained, and a background failure is reported by the manager's next
``save`` / ``wait_until_finished`` / ``close``, never by ``restore``.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from typing import Any

import orbax.checkpoint as ocp
import pytest
import torch

from spmdtorch import checkpoint
from spmdtorch.checkpoint import CheckpointManager, CheckpointSaveError

_SIMULATED = "PERMISSION_DENIED: simulated tensorstore write failure"


@pytest.fixture
def failing_writes(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """While the returned event is set, every array save fails in Orbax's background write (as tensorstore does)."""
    on = threading.Event()
    real = ocp.PyTreeCheckpointHandler.async_save

    async def async_save(self: Any, *args: Any, **kwargs: Any) -> Any:
        futures = await real(self, *args, **kwargs)
        if not on.is_set():
            return futures

        async def fail() -> None:
            raise ValueError(_SIMULATED)

        return [*futures, ocp.future.CommitFutureAwaitingContractedSignals(fail(), name="test_failing_write")]

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "async_save", async_save)
    return on


def _check_failure(err: CheckpointSaveError, step: int, directory: Any) -> None:
    assert f"step {step} " in str(err) and str(directory) in str(err) and _SIMULATED in str(err)
    assert isinstance(err.__cause__, ValueError) and not isinstance(err.__cause__, CheckpointSaveError)


def test_a_background_failure_is_not_raised_by_restore_but_by_the_next_wait(tmp_path, devices8, failing_writes):
    w = torch.arange(4.0, device="xla")
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        assert mgr.save(0, {"w": w})
        mgr.wait_until_finished()
        failing_writes.set()
        # Saved from a worker thread: its failure must not land on the main thread's restore.
        worker = threading.Thread(target=mgr.save, args=(1, {"w": w + 1}))
        worker.start()
        worker.join()
        failing_writes.clear()
        target = {"w": torch.zeros(4, device="xla")}
        mgr.restore(target)  # waits for the write, does not raise its failure
        assert mgr.restored_step == 0 and torch.equal(target["w"].cpu(), torch.arange(4.0))
        with pytest.raises(CheckpointSaveError) as info:
            mgr.wait_until_finished()
        _check_failure(info.value, 1, tmp_path)
        mgr.wait_until_finished()  # reported once
        assert mgr.all_steps() == [0]


def test_a_background_failure_is_raised_by_the_next_save(tmp_path, devices8, failing_writes):
    w = torch.ones(4, device="xla")
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        failing_writes.set()
        assert mgr.save(0, {"w": w})  # returns after the copy; the write fails later
        failing_writes.clear()
        with pytest.raises(CheckpointSaveError, match="step 1 was not started") as info:
            mgr.save(1, {"w": w})
        _check_failure(info.value, 0, tmp_path)
        assert mgr.save(1, {"w": w})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1]


def test_close_reports_an_unreported_failure_after_releasing_everything(tmp_path, devices8, failing_writes):
    w = torch.ones(4, device="xla")
    mgr = CheckpointManager(tmp_path, save_on_preemption=False)
    failing_writes.set()
    mgr.save(0, {"w": w})
    with pytest.raises(CheckpointSaveError) as info:
        mgr.close()
    _check_failure(info.value, 0, tmp_path)
    mgr.close()  # closed: nothing left to report
    failing_writes.clear()
    # The writer lock was released: another manager writes here.
    with CheckpointManager(tmp_path, save_on_preemption=False) as again:
        assert again.save(0, {"w": w})


def test_leaving_a_with_block_on_an_exception_logs_the_failure_instead(tmp_path, devices8, failing_writes, caplog):
    w = torch.ones(4, device="xla")
    failing_writes.set()
    with caplog.at_level(logging.ERROR, logger="spmdtorch.checkpoint"):
        with pytest.raises(KeyError, match="the loop's own error"):
            with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
                mgr.save(0, {"w": w})
                raise KeyError("the loop's own error")
    assert any("step 0" in r.getMessage() and _SIMULATED in r.getMessage() for r in caplog.records)


def test_a_blocking_save_failure_names_the_step(tmp_path, devices8, failing_writes):
    failing_writes.set()
    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as mgr:
        with pytest.raises(CheckpointSaveError) as info:
            mgr.save(3, {"w": torch.ones(2, device="xla")})
        _check_failure(info.value, 3, tmp_path)
        mgr.wait_until_finished()  # already reported by save
        assert mgr.all_steps() == []


def test_a_failure_in_orbax_blocking_phase_is_a_save_error(tmp_path, devices8, monkeypatch):
    async def fail(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise OSError("No space left on device")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "async_save", fail)
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        with pytest.raises(CheckpointSaveError, match="step 0 .*No space left") as info:
            mgr.save(0, {"w": torch.ones(2, device="xla")})
        assert isinstance(info.value.__cause__, OSError)
        mgr.wait_until_finished()  # this failure was reported by save, not again


def test_checkpoint_save_failures_are_save_errors(tmp_path, devices8, failing_writes):
    # A real failure: the parent of the path is a regular file.
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(CheckpointSaveError) as info:
        checkpoint.save(tmp_path / "file" / "ckpt", {"w": torch.ones(2, device="xla")})
    assert str(tmp_path / "file" / "ckpt") in str(info.value)
    assert info.value.__cause__ is not None and not isinstance(info.value.__cause__, CheckpointSaveError)
    failing_writes.set()
    with pytest.raises(CheckpointSaveError) as info:
        checkpoint.save(tmp_path / "c", {"w": torch.ones(2, device="xla")})
    assert str(tmp_path / "c") in str(info.value) and isinstance(info.value.__cause__, ValueError)
    assert not (tmp_path / "c").exists()


# A process whose saves fail in Orbax's blocking phase (the array handler
# raises): with checkpoint.save, then with a CheckpointManager's async save,
# left unclosed. It prints when it starts to exit.
_FAIL_THEN_EXIT = """
import sys, time
import orbax.checkpoint as ocp
import torch
from spmdtorch import checkpoint
from spmdtorch.checkpoint import CheckpointManager, CheckpointSaveError

async def fail(self, *args, **kwargs):
    raise OSError("No space left on device")

ocp.PyTreeCheckpointHandler.async_save = fail
w = torch.ones(2, device="xla")
try:
    checkpoint.save(sys.argv[1] + "/one", {"w": w})
except CheckpointSaveError:
    print("save failed", flush=True)
try:
    CheckpointManager(sys.argv[1] + "/steps", save_on_preemption=False).save(0, {"w": w})
except CheckpointSaveError:
    print("manager save failed", flush=True)
print("exiting", time.time(), flush=True)
"""


def test_a_process_ends_promptly_after_failed_saves(tmp_path):
    # Orbax created step directories on a background thread that every writer
    # waits for; when a handler raised in the blocking phase, nothing waited for
    # that thread, and a process ending at once was held ~300 s by the writers
    # waiting for its signal (checkpoint.save and CheckpointManager alike).
    # Killed (SIGKILL: JAX traps SIGTERM) if it still hangs.
    try:
        done = subprocess.run(
            [sys.executable, "-c", _FAIL_THEN_EXIT, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=240,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the process still ran 240 s after its failed saves: {e.stdout!r}")
    ended = time.time()
    assert done.returncode == 0, done.stderr[-2000:]
    assert "save failed" in done.stdout and "manager save failed" in done.stdout, done.stdout
    started = float(done.stdout.split("exiting ")[1].split()[0])
    assert ended - started < 30, f"the process took {ended - started:.0f} s to exit after its failed saves"
    assert not (tmp_path / "one").exists() and not (tmp_path / "steps" / "0").exists()
