"""Checkpoint benchmark: spmdtorch.checkpoint against raw Orbax on the same arrays.

Run:

    python benchmarks/checkpoint.py            # 256 MiB state, 5 repetitions
    python benchmarks/checkpoint.py --quick    # 32 MiB, 2 repetitions (smoke run)

In one process on 8 simulated CPU devices, a state of float32 matrices sharded
over a (4, 2) mesh is saved and restored by

* ``spmdtorch.checkpoint.save`` / ``load`` (fingerprints computed and checked
  on device, arrays restored into the tensors' own shardings, in place), and
* raw Orbax: ``PyTreeCheckpointer().save`` / ``restore`` with
  ``ArrayRestoreArgs(sharding=...)`` on the very same ``jax.Array``s,

alternating the two (and which goes first) so that machine load hits both
alike, with the page cache's dirty pages flushed (untimed) before each. The
async rows time how long ``CheckpointManager.save`` blocks the training loop
(async_save=True) against ``orbax.checkpoint.CheckpointManager.save`` (async)
and against the device→host copy of the same data (every replica-0 shard
copied to a numpy array), which is the floor an async save can reach, and
then how long the next step (one jitted pass over the arrays) takes while the
save finishes in the background, against that step with no save in flight:
work the save does after returning lands there. The last table is the
fingerprint's own throughput next to a float32 sum of the same arrays.
Medians over repetitions.
Targets: throughput ≥ 0.9× raw Orbax; async stall ≤ the device→host copy.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

simulate_cpu_devices(8, unless_accelerator=True)  # before anything queries devices

import jax
import numpy as np
import orbax.checkpoint as ocp
import torch
from rich.console import Console
from rich.table import Table

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.checkpoint import fingerprint
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def _state(total_mib: int):
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    n = 8
    rows = total_mib * 2**20 // 4 // n // 1024
    gen = torch.Generator().manual_seed(0)
    return {
        "model": {
            f"w{i}": mark_sharding(
                torch.randn(rows, 1024, generator=gen).to("xla"), mesh, ("a", "b") if i % 2 else ("b", "a")
            )
            for i in range(n)
        }
    }


def _arrays(state):
    return {k: t._st.value for k, t in state["model"].items()}


def _timed(fn, *args, **kwargs) -> float:
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def _orbax_restore(raw, path, shardings) -> None:
    restore_args = {"model": {k: ocp.ArrayRestoreArgs(sharding=s) for k, s in shardings.items()}}
    jax.block_until_ready(raw.restore(path, restore_args=restore_args))


def _d2h(arrays) -> None:
    for a in arrays.values():
        for s in a.addressable_shards:
            if s.replica_id == 0:
                np.array(s.data)


@jax.jit
def _step(arrays):
    """A stand-in for the next training step: one read and write of every array."""
    return {k: a * 0.999 + 0.001 for k, a in arrays.items()}


def _next_step(arrays) -> float:
    return _timed(lambda: jax.block_until_ready(_step(arrays)))


@jax.jit
def _f32_sum(arrays):
    return {k: a.sum() for k, a in arrays.items()}


def _repetition(rep: int, root: str, state, raw) -> dict:
    """One timing of every row (seconds by key)."""
    arrays = _arrays(state)
    shardings = {k: a.sharding for k, a in arrays.items()}
    ours, theirs = f"{root}/ours{rep}", f"{root}/orbax{rep}"
    t = {}

    def ours_async():
        # Async saves: how long save() blocks, then how long the next step
        # takes while the save finishes in the background.
        with checkpoint.CheckpointManager(f"{root}/mgr{rep}", save_on_preemption=False) as mgr:
            t["stall"] = _timed(mgr.save, 0, state)
            t["next"] = _next_step(arrays)
            mgr.wait_until_finished()

    def orbax_async():
        omgr = ocp.CheckpointManager(
            f"{root}/omgr{rep}", options=ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
        )
        t["orbax_stall"] = _timed(omgr.save, 0, args=ocp.args.PyTreeSave({"model": arrays}))
        t["orbax_next"] = _next_step(arrays)
        omgr.wait_until_finished()
        omgr.close()

    pairs = [
        (
            lambda: t.__setitem__("save", _timed(checkpoint.save, ours, state)),
            lambda: t.__setitem__("orbax_save", _timed(raw.save, theirs, {"model": arrays})),
        ),
        (
            lambda: t.__setitem__("load", _timed(checkpoint.load, ours, state)),
            lambda: t.__setitem__("orbax_load", _timed(_orbax_restore, raw, theirs, shardings)),
        ),
        (ours_async, orbax_async),
    ]
    for pair in pairs:
        # Alternate who goes first, and flush the page cache's dirty pages
        # before each (untimed): one side's writeback must not land in the
        # other's time.
        for run in pair if rep % 2 else pair[::-1]:
            os.sync()
            run()
    t.update(
        {
            "d2h": _timed(_d2h, arrays),
            "fp": _timed(lambda: jax.block_until_ready(fingerprint.device_fingerprints(list(arrays.values())))),
            "f32_sum": _timed(lambda: jax.block_until_ready(_f32_sum(arrays))),
            "idle_next": _next_step(arrays),
        }
    )
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--mib", type=int, default=None)
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args()
    mib = args.mib or (32 if args.quick else 256)
    reps = args.reps or (2 if args.quick else 5)
    state = _state(mib)
    spmdtorch.sync(wait=True)
    arrays = _arrays(state)
    nbytes = sum(a.nbytes for a in arrays.values())
    root = tempfile.mkdtemp(prefix="spmdtorch-ckpt-bench-")
    keys = (
        "save",
        "orbax_save",
        "load",
        "orbax_load",
        "stall",
        "orbax_stall",
        "d2h",
        "next",
        "orbax_next",
        "idle_next",
        "fp",
        "f32_sum",
    )
    times: dict = {k: [] for k in keys}
    raw = ocp.PyTreeCheckpointer()
    try:
        for rep in range(reps + 1):  # the first repetition warms up (compiles, opens files)
            t = _repetition(rep, root, state, raw)
            if rep:
                for k, v in t.items():
                    times[k].append(v)
            for d in os.listdir(root):
                shutil.rmtree(os.path.join(root, d), ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mbs = nbytes / 2**20
    console = Console()
    console.print(
        f"[bold]spmdtorch.checkpoint vs raw Orbax[/bold]: {mbs:.0f} MiB in {len(arrays)} float32 arrays "
        f"sharded over a (4, 2) mesh of 8 CPU devices; {os.cpu_count()} cores; median of {reps} "
        f"(after 1 warm-up); orbax {ocp.__version__ if hasattr(ocp, '__version__') else ''} "
        f"jax {jax.__version__}"
    )
    table = Table("operation", "spmdtorch", "raw Orbax", "spmdtorch / Orbax throughput", "target")
    for name, ours, theirs in (("save (blocking)", "save", "orbax_save"), ("restore", "load", "orbax_load")):
        ratio = med[theirs] / med[ours]
        table.add_row(
            name,
            f"{med[ours]:.3f} s  ({mbs / med[ours]:.0f} MiB/s)",
            f"{med[theirs]:.3f} s  ({mbs / med[theirs]:.0f} MiB/s)",
            f"{ratio:.2f}×",
            "≥ 0.90×  " + ("[green]met[/green]" if ratio >= 0.9 else "[red]missed[/red]"),
        )
    console.print(table)
    stall = Table("async save", "save() blocks for", "vs device→host copy", "next step takes", "vs step with no save")
    for name, key, step in (
        ("spmdtorch manager", "stall", "next"),
        ("orbax manager", "orbax_stall", "orbax_next"),
        ("device→host copy", "d2h", None),
    ):
        stall.add_row(
            name,
            f"{med[key]:.3f} s",
            f"{med[key] / med['d2h']:.2f}×",
            "" if step is None else f"{med[step]:.3f} s",
            "" if step is None else f"{med[step] - med['idle_next']:+.3f} s",
        )
    console.print(stall)
    ok = med["stall"] <= med["d2h"]
    console.print(
        "stall target (≤ device→host copy): "
        + ("[green]met[/green]" if ok else "[red]missed[/red]")
        + f"; the next step (one pass over the arrays) takes {med['idle_next']:.3f} s with no save"
    )
    fps = Table("fingerprint of the state (on device)", "seconds", "GB/s")
    for name, key in (
        ("spmdtorch fingerprint (two uint32 lanes)", "fp"),
        ("jax: float32 sum of the same arrays (a memory-bound floor)", "f32_sum"),
    ):
        fps.add_row(name, f"{med[key]:.4f}", f"{nbytes / med[key] / 1e9:.1f}")
    console.print(fps)


if __name__ == "__main__":
    sys.exit(main())
