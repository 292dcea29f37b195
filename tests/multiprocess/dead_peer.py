"""One process of a job dies; the others must stop, not hang.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 --heartbeat-timeout 5 \
        tests/multiprocess/dead_peer.py 1

Process ``argv[1]`` kills itself (SIGKILL, no cleanup) after one collective
step (with ``raise`` as ``argv[2]``: it raises an uncaught ``ValueError``; with ``exit``: ``sys.exit(3)``); the others keep running collective steps. They print ``SURVIVED`` if
they are still alive after ``SURVIVE_S`` seconds (the test then fails).

With ``race DIR`` as ``argv[2:]``, the survivors notice the death *before*
their peer watch can: the victim creates ``DIR/dying`` and kills itself
``RACE_DELAY_S`` later, and a survivor that sees the file raises the
uncaught ``JaxRuntimeError`` a collective cut short by a dead peer raises
(what a compiled step's result fetch does when the peer's gloo connection
closes a moment before its watch connection).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import spmdtorch.runtime as xr

SURVIVE_S = 90.0
RACE_DELAY_S = 0.3

if __name__ == "__main__":
    victim = int(sys.argv[1])
    xr.initialize_distributed()
    import numpy as np
    import torch

    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    x = mark_sharding(torch.arange(16.0).to("xla"), Mesh(np.arange(8), (8,), ("d",)), ("d",))
    print("first step", x.sum().item(), flush=True)  # both processes are up and talking
    if xr.process_index() == victim:
        print("dying now", flush=True)
        if sys.argv[2:] == ["raise"]:
            raise ValueError("the victim fails")
        if sys.argv[2:] == ["exit"]:
            sys.exit(3)
        if sys.argv[2:3] == ["race"]:
            open(os.path.join(sys.argv[3], "dying"), "w").close()
            time.sleep(RACE_DELAY_S)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    while time.monotonic() - start < SURVIVE_S:
        if sys.argv[2:3] == ["race"]:  # no programs: each needs every process, and the victim runs none
            if os.path.exists(os.path.join(sys.argv[3], "dying")):
                import jax

                raise jax.errors.JaxRuntimeError("UNAVAILABLE: Gloo: connection closed by peer")
            time.sleep(0.01)
            continue
        x = x + 1
        x.sum().item()  # a cross-process reduction every step
        time.sleep(0.05)
    print("SURVIVED", flush=True)
