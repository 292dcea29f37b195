"""CheckpointManager: intervals, max_to_keep, preemption, fallback, kill -9, bit-exact resume, async fingerprints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.checkpoint import (
    CheckpointCorruptionError,
    CheckpointExistsError,
    CheckpointManager,
    StepNotFoundError,
    fingerprint,
    io,
)
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def test_interval_max_to_keep_and_restore(tmp_path):
    w = torch.zeros(10, 6, device="xla")
    mark_sharding(w, Mesh(np.arange(8), (4, 2), ("a", "b")), ("a", "b"))
    with CheckpointManager(tmp_path, save_interval_steps=2, max_to_keep=2, save_on_preemption=False) as mgr:
        assert [mgr.should_save(s) for s in range(1, 4)] == [True, True, True]  # nothing saved yet
        saved = []
        for step in range(7):
            w.add_(1)
            saved.append(mgr.save(step, {"w": w, "step": step}))
        assert saved == [True, False, True, False, True, False, True]
        w.add_(1)
        assert mgr.save(5, {"w": w, "step": 5}, force=True)  # off-interval, forced: holds 8.0
        mgr.wait_until_finished()
        assert mgr.all_steps() == [5, 6] and mgr.latest_step() == 6  # max_to_keep=2 dropped 0, 2, 4
        with pytest.raises(CheckpointExistsError, match="step 6 is already saved"):
            mgr.save(6, {"w": w, "step": 6}, force=True)
        target = torch.zeros(10, 6, device="xla")
        assert mgr.restore({"w": target, "step": -1})["step"] == 6 and mgr.restored_step == 6
        assert torch.equal(target.cpu(), torch.full((10, 6), 7.0))
        assert mgr.restore({"w": target, "step": -1}, step=5)["step"] == 5
        assert torch.equal(target.cpu(), torch.full((10, 6), 8.0))
        with pytest.raises(StepNotFoundError, match=r"step 2 is not saved.*\[5, 6\]"):
            mgr.restore({"w": target, "step": -1}, step=2)
    with pytest.raises(StepNotFoundError, match="no saved step"):
        CheckpointManager(tmp_path / "empty", save_on_preemption=False).restore({})


def test_falls_back_to_the_newest_intact_step(tmp_path):
    mgr = CheckpointManager(tmp_path, async_save=False, save_on_preemption=False)
    values = {step: torch.randn(64, 64, generator=torch.Generator().manual_seed(step)) for step in (1, 2)}
    for step in (1, 2):  # random values: the data file is not compressible, the flip lands in it
        mgr.save(step, {"w": values[step].to("xla"), "step": step})
    data = [p for p in (tmp_path / "2" / "arrays").rglob("*") if p.is_file() and p.parent.name == "d"]
    biggest = max(data, key=lambda p: p.stat().st_size)
    for f in data:
        if f.read_bytes() == biggest.read_bytes():
            raw = bytearray(f.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            f.write_bytes(bytes(raw))
    w = torch.zeros(64, 64, device="xla")
    with pytest.warns(RuntimeWarning, match="step 2 is damaged"):
        out = mgr.restore({"w": w, "step": 0})
    assert out["step"] == 1 and mgr.restored_step == 1 and torch.equal(w.cpu(), values[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing older is tried, so nothing says it is
        with pytest.raises(CheckpointCorruptionError):
            mgr.restore({"w": w, "step": 0}, fallback=False)
    mgr.close()


def test_sigterm_saves_the_next_boundary_and_close_restores_the_handler(tmp_path):
    previous = signal.getsignal(signal.SIGTERM)
    mgr = CheckpointManager(tmp_path, save_interval_steps=100)
    w = torch.zeros(3, device="xla")
    stopped = None
    for step in range(1, 10):
        w.add_(1)
        mgr.save(step, {"w": w, "step": step})
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # lands after this step's save
        if mgr.reached_preemption(step):
            stopped = step
            break
    assert stopped == 4 and mgr.all_steps() == [1, 4]  # 1: the first save; 4: for the preemption
    assert mgr.should_save(5)
    mgr.close()
    assert signal.getsignal(signal.SIGTERM) is previous
    out = checkpoint.load(tmp_path / "4", {"w": w, "step": 0})
    assert out["step"] == 4 and torch.equal(w.cpu(), torch.full((3,), 4.0))


_KILLED_CHILD = textwrap.dedent(r"""
    import os, sys, time
    import torch
    import orbax.checkpoint._src.path.atomicity as atomicity
    import spmdtorch
    from spmdtorch.checkpoint import CheckpointManager
    root = sys.argv[1]
    mgr = CheckpointManager(root, save_on_preemption=False)
    big = torch.ones(256, 1024, device="xla")
    mgr.save(1, {"w": big, "step": 1})
    mgr.wait_until_finished()

    # Step 2's files are all written, then the process dies before the step
    # is finalised (renamed): the hook announces that point and hangs there.
    async def hang(self):
        open(os.path.join(root, "..", "at_finalize"), "w").close()
        time.sleep(600)
    atomicity.AtomicRenameTemporaryPath.finalize = hang
    big.mul_(2)
    mgr.save(2, {"w": big, "step": 2})
    print("save returned", flush=True)
    time.sleep(600)
""")


def test_kill_9_during_async_save_keeps_the_previous_step(tmp_path):
    root = tmp_path / "ckpts"
    script = tmp_path / "child.py"
    script.write_text(_KILLED_CHILD)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(root)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 240
        while not (tmp_path / "at_finalize").exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.time() < deadline, "the child never reached the finalize hook"
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert any(".orbax-checkpoint-tmp" in p.name for p in root.iterdir())  # step 2 was mid-save
    mgr = CheckpointManager(root, save_on_preemption=False)
    assert mgr.all_steps() == [1] and mgr.latest_step() == 1
    w = torch.zeros(256, 1024, device="xla")
    assert mgr.restore({"w": w, "step": 0})["step"] == 1
    assert torch.equal(w.cpu(), torch.ones(256, 1024))
    mgr.save(2, {"w": w, "step": 2})  # the interrupted step can be saved again
    mgr.close()
    assert mgr.all_steps() == [1, 2]


def _train(model, opt, batches, mgr=None, start=0):
    losses = []
    for i, (x, y) in enumerate(batches[start:], start):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        spmdtorch.sync()
        losses.append(loss.item())
        if mgr is not None:
            mgr.save(
                i, {"model": model.state_dict(), "optim": opt.state_dict(), "step": i, "rng": torch.get_rng_state()}
            )
    return losses


def _model():
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 10), torch.nn.Dropout(0.25), torch.nn.Tanh(), torch.nn.Linear(10, 3)
    ).to("xla")
    mark_sharding(model[0].weight, mesh, ("a", "b"))  # (10, 6): uneven over 4
    mark_sharding(model[3].weight, mesh, (None, "a"))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def test_resumed_training_matches_uninterrupted_bit_for_bit(tmp_path):
    gen = torch.Generator().manual_seed(0)
    batches = [
        (torch.randn(8, 6, generator=gen).to("xla"), torch.randn(8, 3, generator=gen).to("xla")) for _ in range(6)
    ]
    torch.manual_seed(1)
    init = {k: v.cpu() for k, v in _model()[0].state_dict().items()}

    torch.manual_seed(2)
    model, opt = _model()
    model.load_state_dict(init)
    straight = _train(model, opt, batches)

    torch.manual_seed(2)
    model, opt = _model()
    model.load_state_dict(init)
    with CheckpointManager(tmp_path, save_interval_steps=2, save_on_preemption=False) as mgr:
        first = _train(model, opt, batches[:3], mgr)  # saves step 0 and 2
    torch.manual_seed(123)  # the resumed process has its own RNG state until restored
    model, opt = _model()
    checkpoint.init_optimizer_state(opt)
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        state = mgr.restore(
            {"model": model.state_dict(), "optim": opt.state_dict(), "step": -1, "rng": torch.get_rng_state()}
        )
    opt.load_state_dict(state["optim"])
    torch.set_rng_state(state["rng"])
    assert state["step"] == 2
    rest = _train(model, opt, batches, start=3)
    assert first + rest == straight


class _GatedFingerprint:
    """A device fingerprint whose value can only be read once ``gate`` is set (a slow device)."""

    def __init__(self, real, gate, log):
        self._real, self._gate, self._log = real, gate, log

    def __array__(self, dtype=None, copy=None):
        if not self._gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        self._log.append("fingerprint read")
        return np.asarray(self._real, dtype=dtype)


def test_async_save_returns_before_the_fingerprints_and_finalises_after_them(tmp_path, monkeypatch):
    gate, log = threading.Event(), []
    real = fingerprint.device_fingerprints

    def gated(arrays, logical_shapes=None):
        log.append("fingerprints dispatched")
        return [_GatedFingerprint(fp, gate, log) for fp in real(arrays, logical_shapes)]

    monkeypatch.setattr(fingerprint, "device_fingerprints", gated)
    monkeypatch.setattr(io, "SELF_DISPATCH_AFTER_S", 60.0)  # only the next program dispatches them
    w = mark_sharding(torch.arange(48.0).reshape(8, 6).to("xla"), Mesh(np.arange(8), (4, 2), ("a", "b")), ("a", "b"))
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        orbax_save = mgr._mgr.save

        def recorded(*args, **kwargs):
            out = orbax_save(*args, **kwargs)
            log.append("orbax blocking phase done")  # its device→host copy included
            return out

        monkeypatch.setattr(mgr._mgr, "save", recorded)
        assert mgr.save(0, {"w": w, "step": 0})
        # save() returned right after Orbax's copy: the fingerprint programs
        # are owed to the next program, and the step is not finalised without them.
        assert log == ["orbax blocking phase done"]
        w.add_(1.0)
        spmdtorch.sync()  # the next step (it donates w's saved buffer): the fingerprints go first
        assert log == ["orbax blocking phase done", "fingerprints dispatched"]
        assert not (tmp_path / "0").exists()
        # Listed only once completely written (Orbax itself lists it already).
        assert 0 in mgr._mgr.all_steps() and mgr.all_steps() == [] and mgr.latest_step() is None
        gate.set()
        mgr.wait_until_finished()
        assert log[-1] == "fingerprint read" and mgr.all_steps() == [0]
    target = torch.zeros(8, 6, device="xla")
    assert checkpoint.load(tmp_path / "0", {"w": target, "step": -1})["step"] == 0  # the fingerprint verifies
    assert torch.equal(target.cpu(), torch.arange(48.0).reshape(8, 6))


@pytest.mark.parametrize("async_save", [True, False])
def test_failed_fingerprints_surface_and_finalise_nothing(tmp_path, monkeypatch, async_save):
    w = torch.ones(4, 4, device="xla")

    def broken_dispatch(arrays, logical_shapes=None):
        raise RuntimeError("fingerprint program failed to launch")

    class Poisoned:  # dispatched, then the device computation fails
        def __array__(self, dtype=None, copy=None):
            raise RuntimeError("fingerprint computation failed on device")

    with CheckpointManager(tmp_path, async_save=async_save, save_on_preemption=False) as mgr:
        monkeypatch.setattr(fingerprint, "device_fingerprints", broken_dispatch)
        with pytest.raises(RuntimeError, match="failed to launch"):
            mgr.save(0, {"w": w})
            mgr.wait_until_finished()  # async: dispatched after save() returned; the background write raises
        mgr.wait_until_finished()  # raised once
        monkeypatch.setattr(fingerprint, "device_fingerprints", lambda arrays, logical_shapes=None: [Poisoned()])
        with pytest.raises(RuntimeError, match="failed on device"):
            mgr.save(1, {"w": w})
            mgr.wait_until_finished()  # async: the background write fails
        assert mgr.all_steps() == [] and not any(p.name.isdigit() for p in tmp_path.iterdir())
        monkeypatch.undo()
        assert mgr.save(1, {"w": w}, force=True)
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1]


def test_a_save_failing_in_orbax_leaves_no_thread_waiting_for_fingerprints(tmp_path, monkeypatch):
    async def fail(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ocp.PyTreeCheckpointHandler, "async_save", fail)
    # The writer threads started during the save, recorded at their start: one
    # may already have ended by the time the save's error reaches this test.
    writers: list[threading.Thread] = []
    start = threading.Thread.start

    def recording_start(self):
        if self.name == "spmdtorch_meta_save":
            writers.append(self)
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", recording_start)
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        with pytest.raises(checkpoint.CheckpointSaveError, match="disk full") as info:
            mgr.save(0, {"w": torch.ones(3, device="xla")})
        assert isinstance(info.value.__cause__, OSError)
        # The record's write had started (Orbax starts the item saves together);
        # told that the save failed, it ends instead of waiting for fingerprints.
        assert writers
        for t in writers:
            threading.Thread.join(t, timeout=30)  # (Orbax's own join re-raises the thread's error)
            assert not t.is_alive()
        assert mgr.all_steps() == [] and not (tmp_path / "0").exists()


def test_deferred_fingerprints_are_dispatched_without_a_next_step(tmp_path, monkeypatch):
    """No program after an async save: the background write dispatches the fingerprints itself."""
    monkeypatch.setattr(io, "SELF_DISPATCH_AFTER_S", 0.05)
    w = torch.arange(12.0).reshape(3, 4).to("xla")
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        assert mgr.save(0, {"w": w})
        mgr._mgr.wait_until_finished()  # Orbax's own wait: nothing flushes the owed dispatch
        assert mgr.all_steps() == [0]
    target = torch.zeros(3, 4, device="xla")
    checkpoint.load(tmp_path / "0", {"w": target})  # the fingerprint was computed and verifies
    assert torch.equal(target.cpu(), torch.arange(12.0).reshape(3, 4))


def test_an_async_save_then_a_donating_step_keeps_the_saved_values(tmp_path):
    """The step after save() donates the saved buffers; the fingerprints were dispatched before it."""
    mesh = Mesh(np.arange(8), (8,), ("d",))
    w = mark_sharding(torch.arange(64.0).reshape(16, 4).to("xla"), mesh, ("d", None))
    with CheckpointManager(tmp_path, save_on_preemption=False) as mgr:
        assert mgr.save(0, {"w": w})
        for _ in range(3):
            with spmdtorch.step():
                w.mul_(2.0)
        mgr.wait_until_finished()
    target = mark_sharding(torch.zeros(16, 4).to("xla"), mesh, (None, "d"))
    checkpoint.load(tmp_path / "0", {"w": target})  # verifies the fingerprint
    assert torch.equal(target.cpu(), torch.arange(64.0).reshape(16, 4))
    assert torch.equal(w.cpu(), torch.arange(64.0).reshape(16, 4) * 8)


def test_retired_steps_leave_through_the_trash_and_leftovers_are_cleaned(tmp_path):
    """max_to_keep retires a step by renaming it out of the listing first (a process killed while
    deleting never leaves a half-deleted step listed); leftovers of killed saves are removed."""
    w = torch.zeros(4, device="xla")
    with CheckpointManager(tmp_path, save_interval_steps=1, max_to_keep=1) as mgr:
        for step in range(3):
            w.add_(1)
            mgr.save(step, {"w": w})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [2]
    trash = tmp_path / ".spmdtorch-deleted"
    assert not trash.exists() or not any(trash.iterdir())
    # What a SIGKILL leaves behind: a retired step not yet deleted, an unfinished save.
    (trash / "1").mkdir(parents=True)
    (tmp_path / "3.orbax-checkpoint-tmp").mkdir()
    with CheckpointManager(tmp_path, save_interval_steps=1) as mgr:
        assert mgr.all_steps() == [2]
        assert mgr.restore({"w": w})["w"] is w and w.cpu().tolist() == [3.0] * 4
        # A reader deletes nothing (the unfinished save may be another process's, in flight) ...
        assert (tmp_path / "3.orbax-checkpoint-tmp").exists() and any(trash.iterdir())
        mgr.save(4, {"w": w})  # ... the writer, once it holds the writer lock, removes both
        mgr.wait_until_finished()
        assert not any(trash.iterdir())
        assert not (tmp_path / "3.orbax-checkpoint-tmp").exists()
        assert mgr.all_steps() == [2, 4]
