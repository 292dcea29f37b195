"""A PyTorch/XLA-style script: no init call, yet one job across the launcher's processes.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/multiprocess/no_init_call.py

``import spmdtorch`` joins the job (spmdtorch.runtime.auto_initialize_distributed).
Each rank prints ``RESULT {...}``; tests/multiprocess/test_auto_join.py asserts on it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch

import spmdtorch
import spmdtorch.runtime as xr
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def main() -> dict:
    joined = xr._distributed._DISTRIBUTED[0]
    out: dict = {
        "joined_at_import": joined is not None and xr.is_distributed_initialized(),
        "source": None if joined is None else joined.source,
        "counts": [xr.process_index(), xr.process_count(), xr.global_runtime_device_count(), len(spmdtorch.devices())],
        "joined_pid_is_self": os.environ.get(xr.ENV_JOINED_PID) == str(os.getpid()),
    }
    # An explicit call afterwards stays valid and returns the same settings.
    out["explicit_same"] = xr.initialize_distributed() is joined
    # A computation over all 8 devices of both processes: one job.
    mesh = Mesh(np.arange(8), (8,), ("d",))
    x = mark_sharding(torch.arange(16.0).to("xla"), mesh, ("d",))
    out["sum"] = (x * 2).sum().item()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
