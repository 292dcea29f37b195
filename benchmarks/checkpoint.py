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

alternating the two so that machine load hits both alike. The async rows time
how long ``CheckpointManager.save`` blocks the training loop (async_save=True)
against ``orbax.checkpoint.CheckpointManager.save`` (async) and against the
device→host copy of the same data (every replica-0 shard copied to a numpy
array), which is the floor an async save can reach. Medians over repetitions.
Targets: throughput ≥ 0.9× raw Orbax; async stall ≤ the device→host copy.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

_flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", os.environ.get("XLA_FLAGS", "")).split()
os.environ["XLA_FLAGS"] = " ".join(_flags + ["--xla_force_host_platform_device_count=8"])
if int(os.environ.get("NPROC", "0") or 0) < 16:
    os.environ["NPROC"] = "16"  # DESIGN.md, "CPU collective deadlock"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax
import numpy as np
import orbax.checkpoint as ocp
import torch
from rich.console import Console
from rich.table import Table

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def _state(total_mib: int):
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    n = 8
    rows = total_mib * 2**20 // 4 // n // 1024
    gen = torch.Generator().manual_seed(0)
    return {"model": {f"w{i}": mark_sharding(torch.randn(rows, 1024, generator=gen).to("xla"), mesh,
                                             ("a", "b") if i % 2 else ("b", "a")) for i in range(n)}}


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
    shardings = {k: a.sharding for k, a in arrays.items()}
    root = tempfile.mkdtemp(prefix="spmdtorch-ckpt-bench-")
    times: dict = {k: [] for k in ("save", "orbax_save", "load", "orbax_load", "stall", "orbax_stall", "d2h")}
    raw = ocp.PyTreeCheckpointer()
    try:
        for rep in range(reps + 1):  # the first repetition warms up (compiles, opens files)
            ours, theirs = f"{root}/ours{rep}", f"{root}/orbax{rep}"
            t = {
                "save": _timed(checkpoint.save, ours, state),
                "orbax_save": _timed(raw.save, theirs, {"model": _arrays(state)}),
                "load": _timed(checkpoint.load, ours, state),
                "orbax_load": _timed(_orbax_restore, raw, theirs, shardings),
                "d2h": _timed(_d2h, _arrays(state)),
            }
            with checkpoint.CheckpointManager(f"{root}/mgr{rep}", save_on_preemption=False) as mgr:
                t["stall"] = _timed(mgr.save, 0, state)
                mgr.wait_until_finished()
            omgr = ocp.CheckpointManager(f"{root}/omgr{rep}", options=ocp.CheckpointManagerOptions(
                enable_async_checkpointing=True))
            t["orbax_stall"] = _timed(omgr.save, 0, args=ocp.args.PyTreeSave({"model": _arrays(state)}))
            omgr.wait_until_finished()
            omgr.close()
            if rep:
                for k, v in t.items():
                    times[k].append(v)
            for d in (ours, theirs, f"{root}/mgr{rep}", f"{root}/omgr{rep}"):
                shutil.rmtree(d, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mbs = nbytes / 2**20
    console = Console()
    console.print(f"[bold]spmdtorch.checkpoint vs raw Orbax[/bold]: {mbs:.0f} MiB in {len(arrays)} float32 arrays "
                  f"sharded over a (4, 2) mesh of 8 CPU devices; {os.cpu_count()} cores; median of {reps} "
                  f"(after 1 warm-up); orbax {ocp.__version__ if hasattr(ocp, '__version__') else ''} "
                  f"jax {jax.__version__}")
    table = Table("operation", "spmdtorch", "raw Orbax", "spmdtorch / Orbax throughput", "target")
    for name, ours, theirs in (("save (blocking)", "save", "orbax_save"), ("restore", "load", "orbax_load")):
        ratio = med[theirs] / med[ours]
        table.add_row(name, f"{med[ours]:.3f} s  ({mbs / med[ours]:.0f} MiB/s)",
                      f"{med[theirs]:.3f} s  ({mbs / med[theirs]:.0f} MiB/s)", f"{ratio:.2f}×",
                      "≥ 0.90×  " + ("[green]met[/green]" if ratio >= 0.9 else "[red]missed[/red]"))
    console.print(table)
    stall = Table("async save: training-loop stall", "seconds", "vs device→host copy")
    for name, key in (("spmdtorch CheckpointManager.save", "stall"), ("orbax CheckpointManager.save", "orbax_stall"),
                      ("device→host copy of the same shards", "d2h")):
        stall.add_row(name, f"{med[key]:.3f}", f"{med[key] / med['d2h']:.2f}×")
    console.print(stall)
    ok = med["stall"] <= med["d2h"]
    console.print("stall target (≤ device→host copy): " + ("[green]met[/green]" if ok else "[red]missed[/red]"))


if __name__ == "__main__":
    sys.exit(main())
