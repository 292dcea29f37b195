"""Kill a training job with SIGKILL at random moments; resumed, it ends bit-identical to one never killed.

The job (``resumable_train.py``) checkpoints asynchronously every few steps:
model, AdamW state, the loader's position and torch's generator (which also
keys the xla random numbers). Each kill lands after a chosen event line of the
job (during a step, while an async save is being written, while restoring),
after a random delay; the job is then restarted until it finishes. On every
start the job checks that each listed checkpoint step restores (exit code 3
if one does not). The final parameters and optimizer state must equal, bit
for bit, those of an uninterrupted run.
"""

from __future__ import annotations

import queue
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from kill_resume_helpers import job_env, newest_step, pump_lines, restored_step

SCRIPT = Path(__file__).with_name("resumable_train.py")
RUN_TIMEOUT_S = 300


def _run(directory, out, *, steps, save_every, mode, kill=None) -> tuple[int, list[str]]:
    """Run the job once; ``kill=(prefix, nth, delay_s)`` SIGKILLs it ``delay_s`` after its ``nth`` line
    starting with ``prefix``. Returns (exit code, output lines); a run past RUN_TIMEOUT_S fails the test.

    Every run of one test shares JAX's persistent compilation cache (beside
    ``directory``), as a restarted job on a real cluster would: restarts skip
    compiling, and a kill may land while an entry is written."""
    cmd = [sys.executable, str(SCRIPT), str(directory), str(out), "--steps", str(steps)]
    cmd += ["--save-every", str(save_every), "--mode", mode]
    cmd += ["--compile-cache", str(Path(directory).parent / "xla-cache")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env())
    lines = pump_lines(proc)
    seen: list[str] = []
    count = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"the job did not finish within {RUN_TIMEOUT_S} s; last lines: {seen[-5:]}")
            if line is None:
                break
            seen.append(line)
            if kill is not None and line.startswith(kill[0]):
                count += 1
                if count == kill[1]:
                    time.sleep(kill[2])
                    proc.send_signal(signal.SIGKILL)
                    kill = None
        return proc.wait(timeout=60), seen
    finally:
        if proc.poll() is None:
            proc.kill()  # JAX traps SIGTERM: only SIGKILL ends a stuck job
            proc.wait()


def _kill_and_resume(tmp_path, *, steps, save_every, kills, mode, seed):
    ref_code, ref_lines = _run(tmp_path / "ref", tmp_path / "ref.pt", steps=steps, save_every=save_every, mode=mode)
    assert ref_code == 0, ref_lines[-20:]
    rng = random.Random(seed)
    directory, out = tmp_path / "job", tmp_path / "job.pt"
    done_at = 0  # the step the next start resumes from
    log = []
    for _ in range(kills):
        prefix = rng.choice(["step ", "saving ", "saved ", "restoring "] if done_at else ["step ", "saving ", "saved "])
        delay = rng.uniform(0.0, 0.05)
        remaining_steps = steps - done_at
        if prefix == "step ":
            nth = rng.randint(1, remaining_steps)
        elif prefix in ("saving ", "saved "):
            nth = rng.randint(1, max(1, remaining_steps // save_every))
        else:
            nth = 1
        code, lines = _run(directory, out, steps=steps, save_every=save_every, mode=mode, kill=(prefix, nth, delay))
        log.append((prefix.strip(), nth, round(delay, 3), code, restored_step(lines)))
        assert code != 3, f"a listed checkpoint step did not restore: {lines[-5:]}"
        assert code in (0, -signal.SIGKILL), (code, lines[-20:])
        done_at = newest_step(directory)
        if code == 0:
            break
    code, lines = _run(directory, out, steps=steps, save_every=save_every, mode=mode)
    assert code == 0, lines[-20:]
    assert sum(1 for entry in log if entry[3] == -signal.SIGKILL) >= 1, log
    ref, got = torch.load(tmp_path / "ref.pt"), torch.load(out)
    assert ref.keys() == got.keys()
    differ = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not differ, f"after kills {log}: {len(differ)} tensors differ from the uninterrupted run, e.g. {differ[:3]}"
    # The losses of every step that ran to completion agree too.
    ref_steps = {line.split()[1]: line for line in ref_lines if line.startswith("step ")}
    for line in lines:
        if line.startswith("step "):
            assert line == ref_steps[line.split()[1]]


# Both in the slow tier: the default suite keeps an in-process kill -9 during an
# async save (tests/checkpoint/test_manager.py), bit-exact resumption
# (test_resumed_training_matches_uninterrupted_bit_for_bit) and peers killed
# while saving or restoring (tests/multiprocess/test_peer_faults.py).
@pytest.mark.slow
def test_killed_twice_resumes_bit_exact(tmp_path):
    _kill_and_resume(tmp_path, steps=30, save_every=10, kills=2, mode="compiled", seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compiled", "lazy"])
def test_killed_ten_times_in_200_steps_resumes_bit_exact(tmp_path, mode):
    _kill_and_resume(tmp_path, steps=200, save_every=20, kills=10, mode=mode, seed=1)
