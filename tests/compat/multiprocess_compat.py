"""Compat names in a 2 x 4 job, checked from inside each process.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/compat/multiprocess_compat.py OUTDIR

Each rank prints ``RESULT {...}``; tests/compat/test_multiprocess_compat.py asserts on it.
"""

from __future__ import annotations

import json
import os
import sys

import spmdtorch.runtime

# Joins the job (with auto-join on first device query this line becomes unnecessary).
spmdtorch.runtime.initialize_distributed()

import spmdtorch.compat  # noqa: E402

spmdtorch.compat.install()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.distributed.spmd as xs  # noqa: E402
import torch_xla.distributed.xla_backend  # noqa: E402,F401
import torch_xla.runtime as xr  # noqa: E402
import torch_xla.utils.serialization as xser  # noqa: E402


def main(outdir: str) -> dict:
    rank = xr.global_ordinal()
    out: dict = {
        "names": [xr.world_size(), rank, xr.global_device_count(), xr.global_runtime_device_count()],
        "master": [xm.is_master_ordinal(local=False), xm.xrt_world_size(), xm.get_ordinal()],
        "rendezvous": [p.decode() for p in xm.rendezvous("hello", f"rank{rank}".encode() * (rank + 1))],
        "mesh_reduce": xm.mesh_reduce("sum", rank + 1, sum),
    }
    mesh = xs.Mesh(np.arange(xr.global_runtime_device_count()), (8,), ("data",))
    t = xs.mark_sharding(torch.arange(16.0).reshape(8, 2).to(xm.xla_device()), mesh, ("data", None))
    # Every process calls save (the read spans hosts); only the global master writes.
    xm.save({"t": t}, os.path.join(outdir, "xm.pt"), global_master=True)
    xser.save({"t": t, "step": 3}, os.path.join(outdir, "xser.pt"), global_master=True)
    try:
        all_reduce_error = ""
        xm.all_reduce(xm.REDUCE_SUM, t)
    except spmdtorch.compat.MultiprocessNotSupportedError as e:
        all_reduce_error = str(e)[:40]
    out["all_reduce_error"] = all_reduce_error
    os.environ["MASTER_PORT"] = os.environ.get("SPMDTORCH_TEST_GLOO_PORT", "29631")
    dist.init_process_group("gloo", init_method="xla://")
    ranks = [None, None]
    dist.all_gather_object(ranks, rank)
    out["gloo"] = [dist.get_rank(), dist.get_world_size(), ranks]
    dist.destroy_process_group()
    xm.rendezvous("done")
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])), flush=True)
