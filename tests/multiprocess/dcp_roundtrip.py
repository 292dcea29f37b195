"""torch.distributed.checkpoint with spmdtorch's planners in a 2 x 4 job (no init call: import joins).

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/multiprocess/dcp_roundtrip.py DIR

Saves ``{"w": (10, 6) sharded over all 8 devices (uneven: 10 rows over 4),
"r": replicated, "step": 7}`` with ``SPMDSavePlanner``, loads it back into
another sharding with ``SPMDLoadPlanner``, and prints ``RESULT {...}``;
tests/multiprocess/test_auto_join.py also loads ``DIR`` in one process.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp

import spmdtorch.runtime as xr
from spmdtorch.checkpoint.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def values() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(10, 6, generator=g), torch.randn(3, 4, generator=g)


def main(path: str) -> dict:
    # The launcher's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE: DCP agrees on its plan through gloo.
    dist.init_process_group("gloo")
    w, r = values()
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    state = {"w": mark_sharding(w.to("xla"), mesh, ("a", "b")), "r": r.to("xla"), "step": 7}
    dist_cp.save(state, checkpoint_id=path, planner=SPMDSavePlanner())
    target_w = mark_sharding(torch.zeros(10, 6).to("xla"), mesh, ("b", "a"))
    target = {"w": target_w, "r": torch.zeros(3, 4).to("xla"), "step": 0}
    dist_cp.load(target, checkpoint_id=path, planner=SPMDLoadPlanner())
    out = {
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "devices": xr.global_runtime_device_count(),
        "w_equal": bool(torch.equal(target_w.cpu(), w)),
        "r_equal": bool(torch.equal(target["r"].cpu(), r)),
        "step": target["step"],
    }
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
