"""A SIGTERM to one process of a job: every process saves the same step, then stops.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/multiprocess/preemption.py DIR

Process 1 sends itself SIGTERM at step ``SIGNAL_AT``. JAX's preemption
service (started by ``jax.distributed.initialize``) tells every process, they
agree on a later step (the next one all of them can still reach), ``CheckpointManager.save`` saves it everywhere (the interval
is far away), and ``reached_preemption`` ends both loops there. Each process
prints ``RESULT {"stopped_at": step, "steps": [...]}``.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time

import spmdtorch.runtime as xr

SIGNAL_AT = 3
MAX_SECONDS = 60.0  # JAX agrees on the step within a second or two

if __name__ == "__main__":
    directory = sys.argv[1]
    xr.initialize_distributed()
    import numpy as np
    import torch

    from spmdtorch.checkpoint import CheckpointManager
    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    w = mark_sharding(torch.zeros(16).to("xla"), Mesh(np.arange(8), (8,), ("d",)), ("d",))
    stopped = None
    with CheckpointManager(directory, save_interval_steps=100_000) as mgr:
        start = time.monotonic()
        for step in itertools.count():
            if time.monotonic() - start > MAX_SECONDS:  # never agreed: report None (the test fails)
                break
            if step == SIGNAL_AT and xr.process_index() == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            w.add_(1.0)
            w.sum().item()  # a cross-process step
            mgr.save(step, {"w": w, "step": step})
            if mgr.reached_preemption(step):
                stopped = step
                break
        mgr.wait_until_finished()
        steps = mgr.all_steps()
    print("RESULT " + json.dumps({"stopped_at": stopped, "steps": steps}), flush=True)
