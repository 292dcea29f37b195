"""Train a small Llama-style model with FSDPv2 on every available device.

This is the README's main example: an ordinary PyTorch training loop
(``LlamaForCausalLM`` + ``AdamW``) whose tensors live on the ``"xla"`` device,
wrapped in ``FSDPv2`` (one wrapper per decoder layer): every parameter is
split on its largest dim over the mesh axis ``"fsdp"``, each batch on dim 0,
and spmdtorch runs each training step as one XLA program, partitioned by
GSPMD across all devices. The parameter sharding table is printed at start.

On a CPU-only machine the script simulates 8 CPU devices (set before JAX
starts, through ``XLA_FLAGS=--xla_force_host_platform_device_count=8``), so the
same code path as on a TPU/GPU host is exercised. The data is a synthetic,
deterministic and learnable token stream, so the loss visibly drops within a
few dozen steps; the script exits non-zero if it does not, which makes it a
smoke test as well.

Usage:
    python examples/train_llama.py                      # tiny model, 30 compiled steps, 8 CPU devices
    python examples/train_llama.py --mode lazy          # spmdtorch.step() barrier per step instead
    python examples/train_llama.py --size small --steps 10
    python examples/train_llama.py --cpu-devices 4 --mesh 2,2
    python examples/train_llama.py --mixed-precision bf16 --checkpoint-layers
    python examples/train_llama.py --layers 32 --scan     # deep: the layer loop as one jax.lax.scan
    PJRT_DEVICE=TPU python examples/train_llama.py      # real accelerators (no CPU simulation)

Modes:
    ``compiled`` (default) wraps zero_grad + forward + backward + optimizer
    step in ``spmdtorch.compile``: the step is traced until it is stable, then
    replayed with no Python tracing. ``lazy`` runs the same Python every step
    inside ``with spmdtorch.step():``; the graph is recorded each time and the
    compile cache (keyed by graph structure) avoids recompiling.

Sharding:
    ``--mesh 8`` (the default: all devices) is one axis ``"fsdp"``: pure FSDP.
    ``--mesh 2,4`` is ``("data", "fsdp")``: parameters are sharded over
    ``"fsdp"`` and replicated over ``"data"``, the batch is split over both
    (FSDPv2's ``extra_data_axis``), i.e. hybrid sharded data parallelism.
    ``--checkpoint-layers`` recomputes each decoder layer's activations in
    backward (``checkpoint_module``); ``--mixed-precision bf16`` computes in
    bfloat16 with float32 master weights (``MixedPrecision``).
    ``--layers N`` sets the depth; ``--scan`` runs the decoder-layer loop as
    one ``jax.lax.scan`` over the stacked per-layer weights
    (``spmdtorch.models.scan_decoder_layers``): the layer is traced and
    compiled once, so the first step's time stays flat in depth; its weights
    are stacked parameters (one per weight kind, ``stack_parameters=True``;
    ``--no-stack`` keeps one per layer), and the checkpoint keeps per-layer keys.
    ``--assume-pure`` marks each decoder layer ``spmdtorch.assume_pure``: in
    lazy mode it is recorded once and then runs as one node per call (and one
    backward node), so the host no longer records its ops every step.

Checkpoint:
    At the end the model, the optimizer state, the step and the RNG states are
    saved with ``spmdtorch.checkpoint.CheckpointManager`` to
    ``--checkpoint-dir`` (default: a new ``checkpoints/train_llama-<date>-<time>``): a sharded Orbax
    checkpoint that restores onto any mesh or device count.

Multi-host:
    ``python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4
    examples/train_llama.py`` (or torchrun, or a TPU pod): every process runs
    this script; importing spmdtorch joins them, the launcher sets each
    process's devices (``--cpu-devices`` is for single-process runs), the mesh
    spans every process's devices and process 0's checkpoint directory is
    used by all.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

# Importing spmdtorch joins the job when a launcher started this process as one of several.
from spmdtorch import runtime
from spmdtorch.runtime.cpu_devices import requested_cpu_devices, simulate_cpu_devices

DEFAULT_CPU_DEVICES = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--size", choices=("tiny", "small"), default="tiny", help="LlamaConfig preset")
    p.add_argument("--steps", type=int, default=30, help="training steps")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument(
        "--mode",
        choices=("lazy", "compiled"),
        default="compiled",
        help="compiled: spmdtorch.compile(train_step); lazy: spmdtorch.step() per step",
    )
    p.add_argument("--seed", type=int, default=0, help="seed for model init and data")
    p.add_argument(
        "--mesh",
        default=None,
        help='device mesh shape, e.g. "8" or "2,4" (product must equal the device count; '
        "default: all devices on one axis)",
    )
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help=f"simulated CPU devices of a single-process run on CPU (default {DEFAULT_CPU_DEVICES}); a "
        "multi-process job's come from its launcher (--devices-per-proc, or SPMDTORCH_CPU_DEVICES under torchrun)",
    )
    p.add_argument(
        "--mixed-precision",
        choices=("none", "bf16"),
        default="none",
        help="bf16: compute in bfloat16, keep float32 master weights and optimizer state",
    )
    p.add_argument(
        "--checkpoint-layers",
        action="store_true",
        help="activation checkpointing: recompute each decoder layer in backward",
    )
    p.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where the final sharded checkpoint (model, optimizer, step, RNG) is saved "
        "(default: a new checkpoints/train_llama-<date>-<time> per run)",
    )
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the preset's)")
    p.add_argument(
        "--scan",
        action="store_true",
        help="run the decoder layers as one jax.lax.scan (compile time flat in depth)",
    )
    p.add_argument(
        "--no-stack",
        action="store_true",
        help="with --scan, keep one parameter per layer instead of one stacked parameter per weight "
        "(the optimizer then updates every layer's weights separately: a slower first step)",
    )
    p.add_argument(
        "--assume-pure",
        action="store_true",
        help="mark each decoder layer spmdtorch.assume_pure: recorded once, then one node per call "
        "(lazy mode records ~2 nodes per layer and step instead of its ~200 ops)",
    )
    p.add_argument("--no-save", action="store_true", help="do not save a checkpoint at the end")
    p.add_argument(
        "--log-every", type=int, default=1, help="read the loss back every k steps (each read waits for the device)"
    )
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be at least 2 (the first and last loss are compared)")
    if args.batch_size < 1 or args.seq_len < 2:
        p.error("--batch-size must be >= 1 and --seq-len >= 2")
    if args.cpu_devices is not None and args.cpu_devices < 1:
        p.error("--cpu-devices must be >= 1")
    if args.log_every < 1:
        p.error("--log-every must be >= 1")
    if args.layers is not None and args.layers < 1:
        p.error("--layers must be >= 1")
    return args


def configure_cpu_devices(requested) -> None:
    """Ask XLA for N simulated CPU devices, before anything queries devices.

    Does nothing when ``PJRT_DEVICE`` or ``JAX_PLATFORMS`` asks for another
    platform, or, without ``--cpu-devices``, when this process is one of a
    multi-process job or ``SPMDTORCH_CPU_DEVICES`` is set: joining the job
    (``import spmdtorch``) already fixed its device count. An explicit ``--cpu-devices`` replaces a device count already in
    ``XLA_FLAGS``; otherwise an existing one is kept. XLA:CPU keeps its
    optimisation barriers, so ``--checkpoint-layers`` really recomputes
    (``spmdtorch.partition.CPU_REMAT_XLA_FLAG``; GPU/TPU keep them anyway).
    """
    if requested is None and (runtime.is_distributed_initialized() or requested_cpu_devices()):
        return
    existing = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    if existing and requested is None:
        n = int(existing.group(1))
    else:
        n = DEFAULT_CPU_DEVICES if requested is None else requested
    simulate_cpu_devices(n, keep_remat_barriers=True, unless_accelerator=True)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    configure_cpu_devices(ARGS.cpu_devices)

# Only now may JAX start (spmdtorch is imported already; its backend starts on the first device query).
import dataclasses
import functools

import numpy as np
import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.mesh import Mesh
from spmdtorch.models import scan_decoder_layers
from spmdtorch.models.llama import (
    DecoderLayer,
    LlamaConfig,
    LlamaForCausalLM,
    causal_lm_loss,
)
from spmdtorch.partition import (
    FSDPv2,
    MixedPrecision,
    checkpoint_module,
    get_sharding_spec,
    mark_sharding,
    memory_plan,
    plain_state_dict,
    transformer_auto_wrap_policy,
)

# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


class PermutationStream:
    """A deterministic, learnable token stream.

    Every sequence starts at a random token and then follows a fixed random
    permutation of the vocabulary: ``tokens[t + 1] = perm[tokens[t]]``. A model
    that learns the bigram table ``perm`` predicts every token but the first
    exactly, so the loss falls from ~log(vocab) towards 0. Generated on the
    CPU with a seeded ``torch.Generator`` (the same seed gives the same run).
    """

    def __init__(self, vocab_size: int, batch_size: int, seq_len: int, seed: int):
        self.gen = torch.Generator().manual_seed(seed)
        self.perm = torch.randperm(vocab_size, generator=self.gen)
        self.vocab_size, self.batch_size, self.seq_len = vocab_size, batch_size, seq_len

    def next_batch(self) -> torch.Tensor:
        tokens = torch.empty(self.batch_size, self.seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, self.vocab_size, (self.batch_size,), generator=self.gen)
        for t in range(1, self.seq_len):
            tokens[:, t] = self.perm[tokens[:, t - 1]]
        return tokens


# ---------------------------------------------------------------------------
# Reporting helpers
# ---------------------------------------------------------------------------


def parse_mesh(spec, device_count: int) -> tuple[int, ...]:
    if spec is None:
        return (device_count,)
    try:
        shape = tuple(int(s) for s in spec.split(","))
    except ValueError:
        raise SystemExit(f"--mesh {spec!r}: expected comma-separated integers such as '8' or '2,4'") from None
    if not shape or any(d < 1 for d in shape):
        raise SystemExit(f"--mesh {spec!r}: every axis must be a positive integer")
    prod = 1
    for d in shape:
        prod *= d
    if prod != device_count:
        raise SystemExit(f"--mesh {spec!r} has {prod} devices but spmdtorch.device_count() is {device_count}")
    if len(shape) > 2:
        raise SystemExit(f"--mesh {spec!r}: give one axis (fsdp) or two (data, fsdp)")
    return shape


def make_mesh(shape: tuple[int, ...]) -> Mesh:
    """One axis: ("fsdp",); two: ("data", "fsdp"), the batch split over both."""
    names = ("fsdp",) if len(shape) == 1 else ("data", "fsdp")
    return Mesh(np.arange(int(np.prod(shape))), shape, names)


def parameter_table(model: torch.nn.Module) -> tuple[Table, int]:
    """Every parameter: shape, PyTorch/XLA sharding string, per-device block and bytes.

    The per-device numbers come from ``spmdtorch.partition.memory_plan``,
    which also totals AdamW's state.
    """
    named = plain_state_dict(model, keep_vars=True)
    params = {n: p for n, p in named.items() if isinstance(p, torch.nn.Parameter)}
    plan = memory_plan(params, optimizer="adamw", show=False)
    total = sum(p.numel() for p in params.values())
    full = sum(t.global_bytes for t in plan.tensors)
    table = Table(title="Parameter sharding", show_footer=True)
    table.add_column("parameter", footer="total; AdamW state", overflow="fold")
    table.add_column("shape", footer=f"{total:,} elements")
    table.add_column("sharding (HLO)", no_wrap=True)
    table.add_column("per-device block")
    table.add_column(
        "bytes/device",
        justify="right",
        footer=f"{plan.parameter_bytes / 2**20:.2f}/{full / 2**20:.2f} MiB; {plan.optimizer_bytes / 2**20:.2f}",
    )
    for t in plan.tensors:
        table.add_row(
            t.name,
            str(t.shape),
            get_sharding_spec(params[t.name]) or "replicated",
            str(t.shard_shape),
            f"{t.bytes_per_device:,}",
        )
    return table, total


# ---------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------


def main(args: argparse.Namespace) -> int:
    console = Console()
    # On a multi-host job (torchrun, a TPU pod, python -m spmdtorch.launch)
    # this joins the hosts; alone it does nothing.
    spmdtorch.runtime.initialize_distributed()
    n_dev = runtime.global_runtime_device_count()  # every process's: the mesh spans the whole job
    mesh = make_mesh(parse_mesh(args.mesh, n_dev))
    axes = " x ".join(f"{n}={k}" for n, k in zip(mesh.axis_names, mesh.mesh_shape))
    console.print(
        f"[bold]devices:[/] {n_dev} x {spmdtorch.runtime.device_type()}  "
        f"[bold]mesh:[/] {axes}  [bold]mode:[/] {args.mode}  "
        f"[bold]precision:[/] {args.mixed_precision}  "
        f"[bold]activation checkpointing:[/] {'on' if args.checkpoint_layers else 'off'}  "
        f"[bold]layers:[/] {'scanned' if args.scan else 'unrolled'}"
    )

    cfg = LlamaConfig.tiny() if args.size == "tiny" else LlamaConfig.small()
    if args.layers is not None:
        cfg = dataclasses.replace(cfg, n_layers=args.layers)
    if args.seq_len > cfg.max_seq_len:
        raise SystemExit(f"--seq-len {args.seq_len} exceeds max_seq_len={cfg.max_seq_len} of the {args.size} config")

    torch.manual_seed(args.seed)
    spmdtorch.manual_seed(args.seed)
    data_axis = "data" if "data" in mesh.axis_names else None
    # One FSDPv2 per decoder layer (its output is sharded on the batch too),
    # the root takes the embeddings, final norm and output head.
    wrap = FSDPv2
    if args.checkpoint_layers:

        def wrap(layer, **kwargs):
            return FSDPv2(checkpoint_module(layer), **kwargs)

    model = FSDPv2(
        LlamaForCausalLM(cfg),  # initialised on CPU (seeded); FSDPv2 moves and shards it
        mesh=mesh,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer}),
        auto_wrapper_callable=wrap,
        extra_data_axis=data_axis,
        mixed_precision=MixedPrecision(torch.bfloat16, output_dtype=torch.float32)
        if args.mixed_precision == "bf16"
        else None,
    )
    if args.scan:
        # The model's loop over its layers becomes one scan; stacked, each
        # weight kind is one parameter with a leading layer dim (sharded like
        # one layer's), so AdamW updates 9 arrays, not 9 per layer. Before the
        # optimizer is created: it must see the stacked parameters.
        scan_decoder_layers(model.module, stack_parameters=not args.no_stack)
    if args.assume_pure:
        for layer in model.module.layers:  # the FSDPv2 wrappers: their output annotation is recorded too
            spmdtorch.assume_pure(layer)
    batch_spec = ((data_axis, "fsdp") if data_axis else "fsdp", None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    table, n_params = parameter_table(model)
    console.print(table)
    data = PermutationStream(cfg.vocab_size, args.batch_size, args.seq_len, args.seed)
    tokens_per_step = args.batch_size * args.seq_len

    def train_step(tokens):
        optimizer.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        optimizer.step()
        return loss

    if args.mode == "compiled":
        run_step = spmdtorch.compile(train_step)
    else:

        def run_step(tokens):
            with spmdtorch.step():  # leaving the block is the barrier: the step runs (async)
                loss = train_step(tokens)
            return loss

    losses: dict[int, float] = {}
    done_at: dict[int, float] = {}  # wall time at which step i's loss was read back (step finished)

    # Why the *previous* step's loss: `loss.item()` waits for the device to
    # finish the step that computed it. Reading the loss of the step just
    # launched would leave the device idle while Python prepares the next batch
    # and dispatches the next step. Launching step i first, then reading step
    # i-1's loss, keeps one step queued behind the one running, so the host
    # work overlaps device work. It also bounds the queue (at most two steps in
    # flight; k + 1 with --log-every k, which reads only every k-th loss), so a
    # long queue of executions never builds up (see docs/design.md, hazard "CPU collective
    # deadlock").
    progress = Progress(
        TextColumn("[bold blue]train"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"),
        TextColumn("{task.fields[tps]} tok/s"),
        TimeElapsedColumn(),
        console=console,
    )
    print_every = max(1, args.steps // 10)  # ~10 log lines (they also show when stdout is not a terminal)
    printed = [-1]  # print_every bucket of the last printed line
    t_start = time.perf_counter()
    pending = None  # (step index, loss tensor) not yet read back
    with progress:
        task = progress.add_task("train", total=args.steps, loss="-", tps="-")

        def read(i, loss_t):
            losses[i] = loss_t.item()
            now = time.perf_counter()
            done_at[i] = now
            # Throughput over the last few reads (a cumulative rate would be
            # dominated by the first steps' compilation).
            window = sorted(done_at)[-6:]
            if len(window) >= 2:
                tps = (window[-1] - window[0]) * tokens_per_step / (done_at[window[-1]] - done_at[window[0]])
            else:
                tps = (i + 1) * tokens_per_step / (now - t_start)
            progress.update(task, completed=i + 1, loss=f"{losses[i]:.4f}", tps=f"{tps:,.0f}")
            if i // print_every != printed[0] or i == args.steps - 1:
                printed[0] = i // print_every
                progress.console.print(f"step {i:4d}  loss {losses[i]:.4f}  {tps:9,.0f} tok/s")

        for i in range(args.steps):
            # The batch is split on dim 0 like the layers' outputs.
            tokens = mark_sharding(data.next_batch().to("xla"), mesh, batch_spec)
            loss = run_step(tokens)
            if pending is not None:
                read(*pending)
                pending = None
            if i == 0 or i == args.steps - 1 or i % args.log_every == 0:
                pending = (i, loss)
        if pending is not None:
            read(*pending)
    spmdtorch.wait_device_ops()
    total = time.perf_counter() - t_start

    # Steady state: skip the warm-up steps that trace/compile (compiled mode
    # traces twice before replaying; lazy mode compiles on the first steps).
    read_steps = sorted(done_at)
    warm = [i for i in read_steps if i >= min(3, args.steps // 2)]
    if len(warm) >= 2:
        steady = (done_at[warm[-1]] - done_at[warm[0]]) / (warm[-1] - warm[0])
        steady_s = f"{steady * 1e3:.1f} ms/step ({tokens_per_step / steady:,.0f} tok/s)"
    elif len(read_steps) >= 2:  # sparse --log-every: only a rate that includes warm-up is known
        steady = (done_at[read_steps[-1]] - done_at[read_steps[0]]) / (read_steps[-1] - read_steps[0])
        steady_s = f"{steady * 1e3:.1f} ms/step (incl. warm-up: reads too sparse)"
    else:
        steady_s = "n/a (too few steps)"

    first, last = losses[0], losses[args.steps - 1]
    summary = Table(title="Summary", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("final loss", f"{last:.4f}")
    summary.add_row("first -> last loss", f"{first:.4f} -> {last:.4f} ({last - first:+.4f})")
    summary.add_row("total time", f"{total:.2f} s for {args.steps} steps")
    summary.add_row("steady-state step", steady_s)
    summary.add_row("UncachedCompile", str(spmdtorch.debug.counter_value("UncachedCompile")))
    summary.add_row("parameters", f"{n_params:,}")
    console.print(summary)

    if not args.no_save:
        if args.checkpoint_dir is None:
            # A fresh directory, so a rerun never collides with an earlier save; the processes of a job
            # save into one checkpoint, process 0's (their clocks may read different seconds).
            own = time.strftime("checkpoints/train_llama-%Y%m%d-%H%M%S").encode()
            args.checkpoint_dir = runtime.rendezvous("train_llama.checkpoint_dir", own)[0].decode()
        # A standard Orbax checkpoint, each device writing its own shards; it
        # restores onto any mesh (see docs/checkpoint.md).
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": args.steps,
            "torch_rng": torch.get_rng_state(),
            "data_rng": data.gen.get_state(),
        }
        t0 = time.perf_counter()
        with checkpoint.CheckpointManager(args.checkpoint_dir, save_interval_steps=1, max_to_keep=2) as mgr:
            mgr.save(args.steps, state, force=True)
            mgr.wait_until_finished()
        console.print(
            f"checkpoint: step {args.steps} saved to {mgr.step_path(args.steps)} in {time.perf_counter() - t0:.2f} s"
        )

    if not last < first:
        console.print(f"[bold red]FAIL:[/] loss did not decrease ({first:.4f} -> {last:.4f})")
        return 1
    console.print("[bold green]OK:[/] loss decreased")
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))
