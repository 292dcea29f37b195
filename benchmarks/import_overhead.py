"""What ``import spmdtorch`` costs plain CPU torch, per op.

Usage:
    python benchmarks/import_overhead.py            # 5 rounds
    python benchmarks/import_overhead.py --rounds 9

Each round starts two fresh interpreters, one that imports spmdtorch first and
one that does not, in alternating order, and times the same plain CPU calls
in both (best of several ``timeit`` repeats, per call). The table gives the
median time per call over rounds and the ratio with/without, with the
round-by-round ratios; the target is <= 1.10 for every call. Its first row is
the import itself, in milliseconds: ``import torch, jax`` (the floor: spmdtorch
needs both) against ``import spmdtorch`` (which imports both), then the first
use of ``spmdtorch.checkpoint`` (imported on demand: torch.distributed.checkpoint
and Orbax).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent(
    r"""
    import json, sys, time, timeit
    t0 = time.perf_counter()
    if sys.argv[1] == "with":
        import spmdtorch  # noqa: F401
    else:
        import jax  # noqa: F401
    import torch
    imported = time.perf_counter() - t0
    t0 = time.perf_counter()
    if sys.argv[1] == "with":
        spmdtorch.checkpoint.CheckpointManager  # noqa: B018
    checkpoint_import = time.perf_counter() - t0
    torch.set_num_threads(1)
    a = torch.randn(16, 16); b = torch.randn(16, 16); img = torch.randn(1, 3, 8, 8)
    m = torch.nn.Linear(16, 16)
    calls = {
        "a + b (16x16)": lambda: a + b,
        "torch.add(a, b)": lambda: torch.add(a, b),
        "a @ b": lambda: a @ b,
        "a.sum()": lambda: a.sum(),
        "a.shape": lambda: a.shape,
        "a[0]": lambda: a[0],
        "torch.zeros(16)": lambda: torch.zeros(16),
        "a.to(float32) (no-op)": lambda: a.to(torch.float32),
        "a.to(float64)": lambda: a.to(torch.float64),
        "a.to('cpu')": lambda: a.to("cpu"),
        "a.to(float32, copy=True)": lambda: a.to(torch.float32, copy=True),
        "img.to(channels_last)": lambda: img.to(memory_format=torch.channels_last),
        "torch.tensor([1., 2.])": lambda: torch.tensor([1.0, 2.0]),
        "torch.as_tensor(a)": lambda: torch.as_tensor(a),
        "Linear(16,16)(a)": lambda: m(a),
    }
    # Import times are reported in ms (the table's unit column says so).
    out = {"import (ms)": imported * 1e3, "first spmdtorch.checkpoint use (ms)": checkpoint_import * 1e3}
    for name, fn in calls.items():
        n = 20000
        out[name] = min(timeit.repeat(fn, number=n, repeat=7)) / n * 1e6
    print(json.dumps(out))
    """
)


def _run(mode: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", WORKER, mode], capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import torch

    print(f"python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, rounds={args.rounds}")
    without: list[dict[str, float]] = []
    with_import: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = ("without", "with") if r % 2 == 0 else ("with", "without")
        for mode in order:
            (without if mode == "without" else with_import).append(_run(mode))
    names = list(without[0])
    print("\n| call | without µs | with µs | ratio (median) | ratio per round | ≤ 1.10 every round |")
    print("|---|---|---|---|---|---|")
    for name in names:
        w0 = statistics.median(d[name] for d in without)
        w1 = statistics.median(d[name] for d in with_import)
        if name.startswith("first"):  # nothing to compare it with
            print(f"| {name} | — | {w1:.0f} | — | — | — |")
            continue
        per_round = [b[name] / a[name] for a, b in zip(without, with_import)]
        ok = "yes" if all(x <= 1.10 for x in per_round) else "no"
        rounds = " ".join(f"{x:.2f}" for x in per_round)
        print(f"| `{name}` | {w0:.3f} | {w1:.3f} | {w1 / w0:.2f} | {rounds} | {ok} |")


if __name__ == "__main__":
    main()
