"""Multi-host semantics, checked from inside every process of a 2 x 4 job.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/multiprocess/multihost_checks.py

Each rank prints ``RESULT {...}`` with what it observed;
tests/multiprocess/test_multiprocess.py asserts on it.
"""

from __future__ import annotations

import json

import spmdtorch.runtime as xr


def main() -> dict:
    cfg = xr.initialize_distributed()
    import torch

    import spmdtorch
    from spmdtorch.data import MpDeviceLoader
    from spmdtorch.mesh import HybridMesh
    from spmdtorch.partition import ShardingSpec, local_shards, mark_sharding

    pid = xr.process_index()
    out: dict = {
        "source": cfg.source,
        "counts": [
            pid,
            xr.process_count(),
            xr.global_runtime_device_count(),
            xr.addressable_runtime_device_count(),
            len(spmdtorch.devices()),
        ],
    }
    # HybridMesh: each DCN row must be one process's devices.
    mesh = HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    out["hybrid_rows"] = [[int(d.process_index) for d in row] for row in mesh.jax_mesh.devices]

    # Host data held whole by every process, then sharded: each process keeps its rows.
    host = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    x = mark_sharding(host.to("xla"), mesh, ("dcn", "ici"))
    out["local_rows"] = sorted({(s.indices[0].start, s.indices[0].stop) for s in local_shards(x)})
    out["cpu_equal"] = bool(torch.equal(x.cpu(), host))  # gathers from both processes
    y = x @ x.T + 1  # a program whose operands span both processes
    out["matmul_equal"] = bool(torch.allclose(y.cpu(), host @ host.T + 1))
    out["item"] = (x * 2).sum().item()
    out["print_has_values"] = "63." in str(x) and "tensor(" in str(x)

    xr.set_max_gather_bytes(64)  # x is 256 bytes
    try:
        x.cpu()
        out["gather_limit"] = None
    except xr.GatherTooLargeError as e:
        out["gather_limit"] = str(e)
    finally:
        xr.set_max_gather_bytes(None)

    # minibatch=True: each process loads only its 4 rows of the 8-row batch.
    local = torch.arange(12, dtype=torch.float32).reshape(4, 3) + 100 * pid
    spec = ShardingSpec(mesh, (("dcn", "ici"), None), minibatch=True)
    (batch,) = list(MpDeviceLoader([local], spmdtorch.device(), input_sharding=spec))
    out["minibatch_shape"] = list(batch.shape)
    out["minibatch_value"] = batch.cpu().tolist()
    out["minibatch_local_rows"] = sorted({(s.indices[0].start, s.indices[0].stop) for s in local_shards(batch)})
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main()), flush=True)
