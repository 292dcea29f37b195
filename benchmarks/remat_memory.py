"""Activation checkpointing: temporary memory of the FSDPv2 training step, with and without.

Run:

    python benchmarks/remat_memory.py                 # small config, sequence 128 and 256
    python benchmarks/remat_memory.py --seqs 64       # faster

For the decoder of ``benchmarks/train_step.py`` (``LlamaConfig.small()``,
batch 8, FSDPv2 per decoder layer on 8 simulated CPU devices, AdamW), it
compiles the whole training step four ways and prints XLA's per-device
memory analysis (temporaries: activations kept for backward and scratch):

* spmdtorch, plain and with every decoder layer under ``checkpoint_module``
  (``auto_wrapper_callable=lambda m, **kw: FSDPv2(checkpoint_module(m), **kw)``);
* the pure-JAX twin (same decoder, same shardings, ``optax.adamw``), plain and
  with every layer under ``jax.checkpoint``.

Memory analysis needs no timing, so one process is enough. XLA:CPU drops
optimisation barriers unless ``--xla_disable_hlo_passes=cse_barrier_expander``
is in ``XLA_FLAGS`` (``spmdtorch.partition.CPU_REMAT_XLA_FLAG``); this script
sets it, as a CPU user must (GPU/TPU keep barriers anyway).
"""

from __future__ import annotations

import os
import sys

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8
# XLA:CPU must keep the optimisation barriers that rematerialisation rests on.
simulate_cpu_devices(_NUM_DEVICES, keep_remat_barriers=True)

import argparse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import jax
import step_time  # noqa: F401  (first: it checks that jax has not started)
import torch
import train_step
from rich.console import Console
from rich.table import Table

import spmdtorch
from spmdtorch import debug
from spmdtorch.partition import FSDPv2, checkpoint_module

MIB = 2**20


def spmdtorch_temp(seq: int, remat: bool) -> tuple[int, float]:
    """Temporaries per device of the lazily recorded training step (and its first loss)."""
    _, model, tokens = train_step._setup("small", seq)
    wrapper = (lambda m, **kw: FSDPv2(checkpoint_module(m), **kw)) if remat else None
    _, _, tok, step = train_step.spmdtorch_step(model, tokens, auto_wrapper_callable=wrapper)
    losses = []
    for _ in range(2):  # the second step is the steady one (AdamW's state exists)
        with spmdtorch.step():
            loss = step(tok)
        losses.append(loss.item())
    return debug.last_executable().memory_analysis().temp_size_in_bytes, losses[0]


def jax_temp(seq: int, remat: bool) -> tuple[int, float]:
    """Temporaries per device of the pure-JAX twin's training step (and its loss)."""
    cfg, model, tokens = train_step._setup("small", seq)
    twin = train_step.jax_twin(cfg, model, tokens, remat=remat)
    compiled = twin.jitted.lower(twin.params, twin.opt_state, twin.tokens).compile()
    loss = float(jax.value_and_grad(twin.loss_fn)(twin.params, twin.tokens)[0])
    return compiled.memory_analysis().temp_size_in_bytes, loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[128, 256])
    args = parser.parse_args()
    console = Console()
    console.print(
        f"[bold]Training-step temporaries per device[/bold]: LlamaConfig.small (4 layers, dim 256), "
        f"batch 8, FSDPv2 per layer on {_NUM_DEVICES} CPU devices, AdamW; jax {jax.__version__}, "
        f"torch {torch.__version__}; XLA_FLAGS={os.environ['XLA_FLAGS']!r}"
    )
    table = Table("seq", "ours", "ours + ckpt", "saved", "JAX", "JAX + remat", "saved", "ckpt/remat")
    for seq in args.seqs:
        ours_plain, loss_a = spmdtorch_temp(seq, False)
        ours_remat, loss_b = spmdtorch_temp(seq, True)
        jax_plain, loss_c = jax_temp(seq, False)
        jax_remat, _ = jax_temp(seq, True)
        if not (abs(loss_a - loss_b) < 1e-4 * abs(loss_a) and abs(loss_a - loss_c) < 1e-4 * abs(loss_a)):
            raise SystemExit(f"the four steps do not compute the same loss: {loss_a}, {loss_b}, {loss_c}")
        table.add_row(
            str(seq),
            f"{ours_plain / MIB:.2f}",
            f"{ours_remat / MIB:.2f}",
            f"{1 - ours_remat / ours_plain:.0%}",
            f"{jax_plain / MIB:.2f}",
            f"{jax_remat / MIB:.2f}",
            f"{1 - jax_remat / jax_plain:.0%}",
            f"{ours_remat / jax_remat:.2f}×",
        )
    console.print(table)
    console.print(
        "ours: spmdtorch; ckpt: every layer under checkpoint_module; JAX: the pure-JAX twin; remat: every "
        "layer under jax.checkpoint. MiB per device (XLA's temp_size_in_bytes)."
    )


if __name__ == "__main__":
    main()
