"""A peer dies during an async checkpoint save or a restore; the previous step stays restorable.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 --heartbeat-timeout 30 \\
        tests/multiprocess/peer_fault_checkpoint.py DIR save-killed VICTIM
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 --heartbeat-timeout 30 \\
        tests/multiprocess/peer_fault_checkpoint.py DIR restore-killed VICTIM
    python -m spmdtorch.launch --nprocs N --devices-per-proc 8/N \\
        tests/multiprocess/peer_fault_checkpoint.py DIR check

``save-killed``: step 1 of a sharded state (values of ``state_values(1)``) is
saved and finished; the async save of step 2 starts, and process ``VICTIM``
SIGKILLs itself while it is being written (after its device-to-host copy,
before the step is finalised). The survivor waits for the write
(``wait_until_finished``) and must end with ``PeerLostError``.

``restore-killed``: every process restores the newest step; process
``VICTIM`` SIGKILLs itself inside the restore, after reading its shards and
before the fingerprint check (which needs every process).

``check``: a fresh job lists the steps (only finalised ones), restores the
newest one and compares it with ``state_values``; prints ``RESULT {...}``.
A survivor that gets past the kill prints ``SURVIVED`` (the test fails).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import spmdtorch.runtime as xr

ROWS, COLS = 64, 256  # big enough that the write is not instantaneous; uneven enough to pad


def state_values(step: int):
    import torch

    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(ROWS, COLS, generator=g), "b": torch.randn(COLS, generator=g), "step": step}


def sharded_state(step: int):
    import numpy as np

    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    mesh = Mesh(np.arange(xr.global_runtime_device_count()), (xr.global_runtime_device_count(),), ("x",))
    values = state_values(step)
    return {
        "w": mark_sharding(values["w"].to("xla"), mesh, ("x", None)),
        "b": mark_sharding(values["b"].to("xla"), mesh, ("x",)),
        "step": values["step"],
    }


def die() -> None:
    print("dying now", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


def outlive(seconds: float = 90.0) -> None:
    """A survivor that gets here was not stopped: the test fails on this line."""
    time.sleep(seconds)
    print("SURVIVED", flush=True)


def main() -> None:
    directory, phase = sys.argv[1], sys.argv[2]
    from spmdtorch.checkpoint import CheckpointManager

    mgr = CheckpointManager(directory, async_save=True)
    if phase == "save-killed":
        victim = int(sys.argv[3])
        mgr.save(1, sharded_state(1))
        mgr.wait_until_finished()
        print("saved 1", flush=True)
        mgr.save(2, sharded_state(2))  # returns after the device-to-host copy; the write goes on
        print("saving 2", flush=True)
        if xr.process_index() == victim:
            die()
        mgr.wait_until_finished()  # the write's commit needs every process
        outlive()
    elif phase == "restore-killed":
        victim = int(sys.argv[3])
        target = sharded_state(0)
        print("restoring", mgr.latest_step(), flush=True)
        if xr.process_index() == victim:
            # Inside the restore, after reading this process's shards, before the fingerprint
            # check (a program over every process's devices): the survivor is then surely
            # inside its own restore, waiting for this process.
            from spmdtorch.checkpoint import io

            io._verify = lambda *args: die()  # type: ignore[assignment]
        mgr.restore(target)
        target["w"].sum().item()  # a collective: the survivor cannot finish without the victim
        outlive()
    elif phase == "check":
        import torch

        steps = mgr.all_steps()
        target = mgr.restore(sharded_state(0))
        expected = state_values(mgr.restored_step or -1)
        ok = torch.equal(target["w"].cpu(), expected["w"]) and torch.equal(target["b"].cpu(), expected["b"])
        entries = sorted(os.listdir(directory))
        report = {"steps": steps, "restored": mgr.restored_step, "equal": ok, "step": target["step"]}
        print("RESULT " + json.dumps({**report, "entries": entries}), flush=True)
        mgr.close()
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main()
