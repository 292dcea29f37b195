"""A 2-D (data x model) sharded MLP with distributed checkpointing and resume, as PyTorch/XLA's guides write it.

Nothing here imports spmdtorch: run it unchanged under the compatibility layer,

    python -m spmdtorch.compat examples/torch_xla_style/train_2d_sharded_dcp.py --ckpt-dir /tmp/ckpt --steps 8

and as one job of two processes (no init call: the processes join at import),

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 -m spmdtorch.compat \\
        examples/torch_xla_style/train_2d_sharded_dcp.py --ckpt-dir /tmp/ckpt --steps 8

The mesh is ``(devices // 2, 2)`` with axes ``('data', 'model')``. Each block's
first linear layer is column-parallel (its weight's output rows split over
``model``), the second row-parallel (its input columns split over ``model``),
as in Megatron-LM; the batch is split over ``data``. The partitioner inserts
the all-reduces.

Checkpointing follows PyTorch/XLA's distributed-checkpoint guide: a CPU
``gloo`` process group from the ``xla://`` init method, a ``CheckpointManager``
that ``save_async``-s every ``--save-interval`` steps, and on start the newest
step is restored into the sharded model and a primed optimizer
(``prime_optimizer``). ``--stop-after K`` ends the run after K steps, as a
preempted job would; running again with the same ``--ckpt-dir`` resumes there
and ends with the parameters of an uninterrupted run (the batches depend only
on the step). At the end the model is exported with ``torch.distributed.checkpoint``
and ``SPMDSavePlanner``, read back into another sharding with
``SPMDLoadPlanner`` and compared; ``--params-out`` saves the final parameters
with ``xm.save``.
"""

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dist_cp
import torch.nn as nn
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.spmd as xs
import torch_xla.distributed.xla_backend
import torch_xla.experimental.distributed_checkpoint as xc
import torch_xla.runtime as xr

xr.use_spmd()


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class MLP(nn.Module):
    def __init__(self, dim, hidden, depth):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(depth))
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def shard_megatron(model, mesh):
    """Column-parallel fc1 (weight rows and bias over 'model'), row-parallel fc2 (weight columns over 'model')."""
    for block in model.blocks:
        xs.mark_sharding(block.fc1.weight, mesh, ("model", None))
        xs.mark_sharding(block.fc1.bias, mesh, ("model",))
        xs.mark_sharding(block.fc2.weight, mesh, (None, "model"))


def batch(step, batch_size, dim):
    """The batch of ``step``: the same whatever the run, so a resumed run sees the batches an uninterrupted one does."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch_size, dim, generator=g)
    y = torch.sin(x[:, :1] * 2.0) + 0.5 * x[:, 1:2] * x[:, 2:3]
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--stop-after", type=int, default=None, help="end after this many steps (a preemption)")
    parser.add_argument("--save-interval", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--params-out", default=None, help="xm.save the final parameters here")
    args = parser.parse_args()

    # The CPU process group distributed checkpointing coordinates through.
    if not dist.is_initialized():
        dist.init_process_group("gloo", init_method="xla://")

    num_devices = xr.global_runtime_device_count()
    # Every process of the job says which it is (xm.master_print would print process 0's line only).
    print(f"process {xr.process_index()} of {xr.process_count()}: runtime devices {num_devices}", flush=True)
    mesh_shape = (num_devices // 2, 2)
    mesh = xs.Mesh(np.array(range(num_devices)), mesh_shape, ("data", "model"))
    device = torch_xla.device()

    torch.manual_seed(0)
    model = MLP(args.dim, args.hidden, args.depth).to(device)
    shard_megatron(model, mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()

    chkpt_mgr = xc.CheckpointManager(os.path.join(args.ckpt_dir, "train"), save_interval=args.save_interval)
    start_step = 0
    tracked_steps = chkpt_mgr.all_steps()
    if tracked_steps:
        # The optimizer has no state before its first step: prime it so the checkpoint has tensors to fill.
        start_step = max(tracked_steps)
        xc.prime_optimizer(optimizer)
        state_dict = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        chkpt_mgr.restore(start_step, state_dict)
        model.load_state_dict(state_dict["model"])
        optimizer.load_state_dict(state_dict["optim"])
        xm.master_print(f"resumed from step {start_step}")

    end_step = args.steps if args.stop_after is None else min(args.steps, args.stop_after)
    model.train()
    for step in range(start_step, end_step):
        x, y = batch(step, args.batch_size, args.dim)
        x, y = x.to(device), y.to(device)
        xs.mark_sharding(x, mesh, ("data", None))
        xs.mark_sharding(y, mesh, ("data", None))
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        xm.mark_step()
        xm.master_print(f"step {step + 1} loss {loss.item():.6f}")
        # The checkpoint of step s holds the state after s steps.
        state_dict = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        if chkpt_mgr.save_async(step + 1, state_dict):
            xm.master_print(f"checkpoint taken at step {step + 1}")
    chkpt_mgr.join()
    if end_step < args.steps:
        xm.master_print(f"stopped after step {end_step} of {args.steps}")
        return

    xm.master_print(f"fc1 weight sharding: {torch_xla._XLAC._get_xla_sharding_spec(model.blocks[0].fc1.weight)}")
    xm.master_print(f"fc2 weight sharding: {torch_xla._XLAC._get_xla_sharding_spec(model.blocks[0].fc2.weight)}")

    # Export with torch.distributed.checkpoint: each process writes its own shards.
    export_dir = os.path.join(args.ckpt_dir, "export")
    dist_cp.save(
        state_dict={"model": model.state_dict()},
        storage_writer=dist_cp.FileSystemWriter(export_dir),
        planner=xc.SPMDSavePlanner(),
    )
    # Read it back into a model sharded another way (fully data-parallel: weights split over 'data' only).
    reloaded = MLP(args.dim, args.hidden, args.depth).to(device)
    for block in reloaded.blocks:
        xs.mark_sharding(block.fc1.weight, mesh, ("data", None))
        xs.mark_sharding(block.fc2.weight, mesh, ("data", None))
    state_dict = {"model": reloaded.state_dict()}
    dist_cp.load(
        state_dict=state_dict,
        storage_reader=dist_cp.FileSystemReader(export_dir),
        planner=xc.SPMDLoadPlanner(),
    )
    reloaded.load_state_dict(state_dict["model"])
    same = all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(model.parameters(), reloaded.parameters()))
    xm.master_print(f"DCP export reloaded equal: {same}")
    if args.params_out:
        xm.save(model.state_dict(), args.params_out)
    xm.master_print(f"final steps: {args.steps}")


if __name__ == "__main__":
    main()
