"""Train a small transformer with torch's own FSDP2 + tensor-parallel API (DeviceMesh, parallelize_module, fully_shard).

The model and the parallelisation are written as torchtitan writes them:
``parallelize_module`` with ``ColwiseParallel``/``RowwiseParallel`` over the
mesh's ``"tp"`` dim (attention heads and feed-forward columns), then
``fully_shard`` per block and on the root over its ``"dp"`` dim, with an
AdamW step. Only the imports of the three functions that build meshes and
lay out modules change (``spmdtorch.dtensor`` instead of ``torch.distributed``):
one process drives every device, each placement is a GSPMD annotation, and XLA
inserts every all-gather, reduce-scatter and all-reduce (docs/dtensor.md).

On a CPU-only machine the script simulates 8 CPU devices, so the same code
path as on a TPU/GPU host runs. Under a multi-process launcher every process
runs this script (SPMD): importing spmdtorch joins the job, the mesh spans
all processes' devices, and every process prints the same (global) losses. The data is a synthetic learnable token
stream (each token is followed by the next one, modulo the vocabulary), so
the loss drops within a few steps; the script exits non-zero if it does not.

Usage:
    python examples/train_dtensor.py                       # dp=2 x tp=4, 8 compiled steps
    python examples/train_dtensor.py --mesh 8,1            # FSDP only
    python examples/train_dtensor.py --mode lazy --steps 4
    python examples/train_dtensor.py --grad-accum 4        # 4 micro-batches per step, one gradient reduction
                                                           # (compiled: replayed after 3 traces, as without)
    python examples/train_dtensor.py --compare-eager       # also train an eager CPU copy and compare losses
    PJRT_DEVICE=TPU python examples/train_dtensor.py       # real accelerators (no CPU simulation)
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 examples/train_dtensor.py   # 2 processes x 4
    SPMDTORCH_CPU_DEVICES=4 torchrun --nproc-per-node 2 examples/train_dtensor.py         # the same, torchrun
"""

from __future__ import annotations

import argparse
import sys

# Importing spmdtorch joins the job when a launcher started this process as one of several.
from spmdtorch import runtime
from spmdtorch.runtime.cpu_devices import requested_cpu_devices, simulate_cpu_devices

DEFAULT_CPU_DEVICES = 8


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--mesh", default="2,4", help="dp,tp: the mesh shape (their product is the device count)")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps")
    p.add_argument("--mode", choices=("compiled", "lazy"), default="compiled", help="spmdtorch.compile or lazy steps")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (accumulate_gradients)")
    p.add_argument("--batch", type=int, default=16, help="sequences per micro-batch (a multiple of the device count)")
    p.add_argument("--seq", type=int, default=16, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compare-eager", action="store_true", help="train an eager CPU copy too and compare losses")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help=f"simulated CPU devices of a single-process run (default {DEFAULT_CPU_DEVICES}); a multi-process "
        "job's come from its launcher (--devices-per-proc, or SPMDTORCH_CPU_DEVICES under torchrun)",
    )
    args = p.parse_args(argv)
    try:
        dims = tuple(int(d) for d in args.mesh.split(","))
    except ValueError:
        dims = ()
    if len(dims) != 2 or min(dims) < 1:
        p.error(f"--mesh must be two positive ints dp,tp (e.g. 2,4), got {args.mesh!r}")
    args.mesh_shape = dims
    if args.steps < 2 or args.grad_accum < 1:
        p.error("--steps must be at least 2 and --grad-accum at least 1")
    return args


args = parse_args()
# XLA is configured here, before torch and spmdtorch start it (E402 is ignored for examples/).
if args.cpu_devices is not None or not (runtime.is_distributed_initialized() or requested_cpu_devices()):
    simulate_cpu_devices(args.cpu_devices or DEFAULT_CPU_DEVICES, unless_accelerator=True)

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import fully_shard, init_device_mesh, parallelize_module
from spmdtorch.fsdp import accumulate_gradients
from spmdtorch.sharding import get_sharding_spec

VOCAB, DIM, HEADS, HIDDEN, LAYERS = 64, 32, 4, 64, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Linear(DIM, DIM, bias=False) for _ in range(3))
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism torch code reshapes to its local heads; here the tensor is global.
        q, k, v = (w(x).view(b, s, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(DIM), nn.RMSNorm(DIM)
        self.attention, self.feed_forward = Attention(), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def parallelize(model: Transformer, mesh) -> Transformer:
    """torchtitan's recipe: tensor parallelism over mesh["tp"], then FSDP2 over mesh["dp"]."""
    if mesh["tp"].size() > 1:
        for block in model.layers:
            plan = {
                "attention.wq": ColwiseParallel(),
                "attention.wk": ColwiseParallel(),
                "attention.wv": ColwiseParallel(),
                "attention.wo": RowwiseParallel(),
                "feed_forward.w1": ColwiseParallel(),
                "feed_forward.w3": ColwiseParallel(),
                "feed_forward.w2": RowwiseParallel(),
            }
            parallelize_module(block, mesh["tp"], plan)
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def loss_fn(model: nn.Module, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten())


def batches(step: int, count: int, rows: int, seq: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic learnable data: every token is followed by the next one (mod VOCAB)."""
    g = torch.Generator().manual_seed(1000 + step)
    out = []
    for _ in range(count):
        start = torch.randint(0, VOCAB, (rows, 1), generator=g)
        seqs = (start + torch.arange(seq + 1)) % VOCAB
        out.append((seqs[:, :-1], seqs[:, 1:]))
    return out


def main() -> int:
    dp, tp = args.mesh_shape
    devices = runtime.global_runtime_device_count()
    if dp * tp != devices:
        print(f"--mesh {args.mesh}: dp*tp must be the device count {devices}", file=sys.stderr)
        return 2
    if args.batch % devices:
        print(f"--batch {args.batch}: must be a multiple of the device count {devices}", file=sys.stderr)
        return 2
    mesh = init_device_mesh("xla", (dp, tp), mesh_dim_names=("dp", "tp"))
    procs = runtime.process_count()
    where = f" over {procs} processes (this is process {runtime.process_index()})" if procs > 1 else ""
    print(f"devices: {devices} x {runtime.device_type()}{where}")
    print(f"mesh: dp={dp} x tp={tp}, mode: {args.mode}, micro-batches per step: {args.grad_accum}")

    torch.manual_seed(args.seed)
    ref = Transformer()
    model = parallelize(copy.deepcopy(ref), mesh)
    for name in ("tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.0.feed_forward.w2.weight"):
        p = model.get_parameter(name)
        print(f"  {name:34s} {tuple(p.placements)!s:36s} {get_sharding_spec(p.to_local())}")
    # Plain AdamW: under spmdtorch.compile its step counters move to the devices by themselves (capturable).
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    def train_step(data: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if args.grad_accum > 1:
            # One gradient reduction per step, not one per micro-batch (FSDP2's set_requires_gradient_sync(False)).
            loss = accumulate_gradients(model, loss_fn, data)
        else:
            loss = loss_fn(model, *data[0])
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step_fn = spmdtorch.compile(train_step) if args.mode == "compiled" else train_step
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=args.lr) if args.compare_eager else None
    losses, worst = [], 0.0
    for step in range(args.steps):
        data = batches(step, args.grad_accum, args.batch, args.seq)
        on_xla = [(x.to("xla"), y.to("xla")) for x, y in data]
        if args.mode == "lazy":
            with spmdtorch.step():
                loss = step_fn(on_xla)
        else:
            loss = step_fn(on_xla)
        value = float(loss.detach().cpu())
        losses.append(value)
        line = f"step {step:3d}  loss {value:.4f}"
        if ref_opt is not None:
            ref_loss = sum(loss_fn(ref, x, y) / len(data) for x, y in data)
            ref_loss.backward()
            ref_opt.step()
            ref_opt.zero_grad()
            diff = abs(value - float(ref_loss.detach()))
            worst = max(worst, diff)
            line += f"  eager {float(ref_loss.detach()):.4f}  |diff| {diff:.2e}"
        print(line, flush=True)
    print(f"first -> last loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
    # Every digit of the float32 losses (9 significant digits round-trip): runs compare them exactly.
    print("losses: " + " ".join(f"{v:.9g}" for v in losses))
    replayed = debug.counter_value("CompiledReplay") or 0
    if args.mode == "compiled":
        traced = debug.counter_value("CompiledTrace") or 0
        print(f"compiled steps replayed: {replayed} of {args.steps} (traced {traced})")
    if ref_opt is not None:
        print(f"max |loss - eager loss|: {worst:.2e}")
        if worst > 1e-3:
            print("FAIL: the losses differ from eager CPU's", file=sys.stderr)
            return 1
    # Traced until two traces agree (the first call also makes AdamW's state), with or without
    # accumulation; a step that keeps tracing runs at lazy-mode speed, so the run says so.
    if args.mode == "compiled" and replayed < args.steps - 3:
        print(
            f"FAIL: the compiled step replayed {replayed} of {args.steps} steps, expected all after the third",
            file=sys.stderr,
        )
        return 1
    if not losses[-1] < losses[0]:
        print("FAIL: the loss did not decrease", file=sys.stderr)
        return 1
    print("OK: loss decreased")
    return 0


if __name__ == "__main__":
    sys.exit(main())
