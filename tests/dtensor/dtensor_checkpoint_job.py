"""A 2 x 4 job that restores a DTensor checkpoint saved by one 8-device process, trains a step, and saves again.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/dtensor/dtensor_checkpoint_job.py SRC EXPECTED OUT

``SRC`` was saved by ``tests/dtensor/test_dtensor_checkpoint.py`` from a
``fully_shard`` model on an ``(8,)`` mesh; here the same model is built
FSDP + TP on a ``(2, 4)`` mesh spanning both processes and restored with
spmdtorch.dtensor's state-dict functions and ``SPMDLoadPlanner``. Each
process compares what it restored with ``EXPECTED`` (the saved values, a
``torch.save`` file), takes one AdamW step, saves to ``OUT`` with
``SPMDSavePlanner`` and prints ``RESULT {...}``; the test reads ``OUT`` back
in one process.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

# The test module's model, layouts and helpers (this folder is on sys.path when run as a script).
from test_dtensor_checkpoint import Net, _fsdp_tp, _full, _restore, _save, _step

import spmdtorch.runtime as xr
from spmdtorch.dtensor import init_device_mesh


def main(src: str, expected_path: str, out: str) -> dict:
    # DCP agrees on its plan through gloo (the launcher's MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE).
    dist.init_process_group("gloo")
    expected = torch.load(expected_path, weights_only=True)
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(1)  # other initial values than the saved ones
    model = _fsdp_tp(Net(), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _restore(model, opt, src)
    params_equal = all(torch.equal(_full(p), expected["params"][n]) for n, p in model.named_parameters())
    moments_equal = all(
        torch.equal(_full(opt.state[p]["exp_avg"]), expected["exp_avg"][n])
        and torch.equal(_full(opt.state[p]["exp_avg_sq"]), expected["exp_avg_sq"][n])
        for n, p in model.named_parameters()
    )
    steps = sorted({float(opt.state[p]["step"]) for p in model.parameters()})
    loss = _step(model, opt, 2, "xla")
    _save(model, opt, out)
    report = {
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "devices": xr.global_runtime_device_count(),
        "params_equal": params_equal,
        "moments_equal": moments_equal,
        "steps": steps,
        "loss": loss,
    }
    dist.destroy_process_group()
    return report


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(*sys.argv[1:4])), flush=True)
