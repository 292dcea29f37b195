"""``spmdtorch.step()``'s garbage-collector pause: paused vs not, on ``train_step.py``'s FSDPv2 Llama, lazily.

Three ways to run the same lazy step take turns in one process (who goes
first rotates each round), each for a block of ``--steps`` steps launched
back to back:

* ``step()``: ``with spmdtorch.step():`` as it is (the collector paused while
  the step records, a young-generation collection just before the sync);
* ``paused, no collect``: the collector paused, no collection before the sync
  (the pause alone: cyclic garbage of the step becomes program outputs);
* ``collector on``: ``spmdtorch.step(pause_gc=False)``.

Per block: wall ms/step (launch to the last result), the median host time of
one step call, the slowest step call, the process CPU ms/step (every thread:
on simulated CPU devices the devices' work too) and the full (generation 2)
collections that ran. The summary gives the medians over rounds. On a shared
machine the wall times move with the load; the CPU time and the full
collections much less.

Usage:
    python benchmarks/step_gc.py                    # tiny, 4 rounds of 150 steps (~2 min on 2 cores)
    python benchmarks/step_gc.py --config small --steps 60 --rounds 3
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_step  # (first: it configures the 8 simulated CPU devices before JAX starts)

import spmdtorch
from spmdtorch.lazy import paused_gc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="tiny", choices=("tiny", "small", "deep"))
    p.add_argument("--steps", type=int, default=150, help="steps per block")
    p.add_argument("--rounds", type=int, default=4, help="blocks per variant, taking turns")
    args = p.parse_args(argv)

    _, model, tokens = train_step._setup(args.config)
    _, _, tok, train = train_step.spmdtorch_step(model, tokens)

    def as_step(tok):
        with spmdtorch.step():
            return train(tok)

    def paused_no_collect(tok):
        with paused_gc():
            loss = train(tok)
            spmdtorch.sync()
        return loss

    def collector_on(tok):
        with spmdtorch.step(pause_gc=False):
            return train(tok)

    variants = {"step()": as_step, "paused, no collect": paused_no_collect, "collector on": collector_on}
    full = [0]

    def count_full(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            full[0] += 1

    gc.callbacks.append(count_full)
    for run in variants.values():  # compile each variant's programs (lazy: twice, once AdamW's state exists)
        for _ in range(3):
            run(tok).item()
    names = list(variants)
    results: dict[str, list[tuple[float, float, float, float, int]]] = {n: [] for n in names}
    print(f"{args.config}: {args.rounds} rounds of {args.steps} steps per variant")
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:
            run = variants[name]
            spmdtorch.wait_device_ops()
            full[0] = 0
            host = []
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                h = time.perf_counter()
                loss = run(tok)
                host.append(time.perf_counter() - h)
            spmdtorch.wait_device_ops()
            wall = (time.perf_counter() - t0) / args.steps
            cpu = (time.process_time() - c0) / args.steps
            row = (wall, statistics.median(host), max(host), cpu, full[0])
            results[name].append(row)
            print(
                f"round {r} {name:20s} wall {wall * 1e3:6.1f} ms/step  host median {row[1] * 1e3:6.1f} "
                f"max {row[2] * 1e3:6.1f} ms  CPU {cpu * 1e3:5.1f} ms/step  full collections {full[0]}",
                flush=True,
            )
    print(f"final loss {loss.item():.6f}")
    for name, rows in results.items():
        med = [statistics.median(row[i] for row in rows) * 1e3 for i in range(4)]
        print(
            f"{name:20s} medians: wall {med[0]:6.1f} ms/step, host {med[1]:6.1f} ms, CPU {med[3]:5.1f} ms/step; "
            f"full collections per block {[row[4] for row in rows]}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
