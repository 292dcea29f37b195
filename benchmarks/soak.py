"""Soak: thousands of training steps, watching memory, compiles and step time stay flat.

Usage:
    python benchmarks/soak.py                        # 10,000 steps per mode, tiny Llama
    python benchmarks/soak.py --steps 2000 --every 250
    python benchmarks/soak.py --modes compiled --steps 500

Each mode runs in its own process (so no mode inherits another's caches or
heap), one after the other, on 8 simulated CPU devices:

* ``jax``: the pure-JAX twin of ``benchmarks/train_step.py`` (same decoder,
  shardings and AdamW), saving with Orbax's own ``CheckpointManager``: what the
  libraries underneath cost by themselves;
* ``lazy``: the FSDPv2 tiny Llama of ``benchmarks/train_step.py``, one
  ``with spmdtorch.step():`` per step, a float learning rate set by a
  ``LambdaLR`` schedule every step (a changing Python number: it must stay a
  program input, never a recompile);
* ``compiled``: the same step under ``spmdtorch.compile``, the learning rate a
  0-d xla tensor that the same schedule fills in place (the form the compiled
  step replays; a float is traced every step, and spmdtorch warns).

Every mode takes a new host batch each step (cycling through 16, moved to the
devices and sharded on the batch dim), and saves an async checkpoint every
``--save-every`` steps (``max_to_keep=2``). Every ``--every`` steps the worker
reports: resident set size (RSS, from ``/proc/self/status``), the bytes and
number of live device arrays (``jax.live_arrays()``: the CPU "devices" have no
memory statistics, and a leak of device buffers shows here), the compile count,
the entries held in spmdtorch's caches (``debug.cache_sizes()``), and the median
step time over the interval (each step waited for, so it is the step's own
time). The verdict line checks, after warm-up (the first report): RSS growth
under 64 MiB, no new compiles, live device bytes flat, and the last interval's
step time within 1.25× of the first's.
"""

from __future__ import annotations

import sys

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8
if __name__ == "__main__":  # before anything queries devices (also in each worker process)
    simulate_cpu_devices(_NUM_DEVICES, unless_accelerator=True)

import argparse
import datetime
import json
import math
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("jax", "lazy", "compiled")
RSS_BUDGET_MIB = 64
STEP_TIME_DRIFT = 1.25
N_BATCHES = 16


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _live_device_arrays() -> tuple[int, int]:
    """(bytes on the devices, number of arrays) of every live jax.Array in this process."""
    import jax

    arrays = jax.live_arrays()
    nbytes = sum(s.data.nbytes for a in arrays for s in a.addressable_shards)
    return int(nbytes), len(arrays)


def _schedule(step: int, total: int) -> float:
    """Linear warm-up over 100 steps, then cosine decay to 10%: the multiplier of the base LR."""
    if step < 100:
        return (step + 1) / 100
    frac = min(1.0, (step - 100) / max(1, total - 100))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))


def _batches(cfg_name: str):
    import torch
    import train_step as bench

    cfg, model, _ = bench._setup(cfg_name)
    batch, seq = bench.CONFIGS[cfg_name]
    gen = torch.Generator().manual_seed(2)
    return cfg, model, [torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen) for _ in range(N_BATCHES)]


def _spmdtorch_worker(mode: str, cfg_name: str, steps: int, every: int, save_every: int, ckpt_dir: str):
    import numpy as np
    import torch
    import train_step as bench

    import spmdtorch
    from spmdtorch import debug
    from spmdtorch.checkpoint import CheckpointManager
    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding

    _, model, host_batches = _batches(cfg_name)
    model, opt, _, train_step = bench.spmdtorch_step(model, host_batches[0])
    mesh = Mesh(np.arange(_NUM_DEVICES), (_NUM_DEVICES,), ("fsdp",))
    if mode == "compiled":
        for group in opt.param_groups:  # the form a compiled step replays (see the module docstring)
            group["lr"] = torch.tensor(group["lr"], device="xla")
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _schedule(s, steps))
    run = spmdtorch.compile(train_step) if mode == "compiled" else None

    def one_step(i):
        tok = mark_sharding(host_batches[i % N_BATCHES].to("xla"), mesh, ("fsdp", None))
        if run is not None:
            loss = run(tok)
        else:
            with spmdtorch.step():
                loss = train_step(tok)
        sched.step()
        return loss

    with CheckpointManager(ckpt_dir, save_interval_steps=save_every, max_to_keep=2) as mgr:
        _loop(
            steps,
            every,
            one_step,
            lambda i: mgr.save(i, {"model": model.state_dict(), "optim": opt.state_dict(), "step": i}),
            debug,
        )
        mgr.wait_until_finished()


def _jax_worker(cfg_name: str, steps: int, every: int, save_every: int, ckpt_dir: str):
    import jax
    import numpy as np
    import optax
    import orbax.checkpoint as ocp
    import step_time  # noqa: F401  (first: it checks that jax has not started)
    import train_step as bench

    cfg, model, host_batches = _batches(cfg_name)
    import jax.numpy as jnp

    def schedule(count):  # _schedule, traced
        frac = jnp.clip((count - 100) / max(1, steps - 100), 0.0, 1.0)
        decay = 0.1 + 0.9 * 0.5 * (1 + jnp.cos(jnp.pi * frac))
        return bench.LR * jnp.where(count < 100, (count + 1) / 100, decay)

    tx = optax.adamw(schedule, b1=bench.BETAS[0], b2=bench.BETAS[1], eps=bench.EPS, weight_decay=bench.WD)
    twin = bench.jax_twin(cfg, model, host_batches[0], tx=tx)
    tok_sharding = twin.tokens.sharding
    state = {"params": twin.params, "opt": twin.opt_state}
    options = ocp.CheckpointManagerOptions(save_interval_steps=save_every, max_to_keep=2, create=True)
    with ocp.CheckpointManager(ckpt_dir, options=options) as mgr:

        def one_step(i):
            tok = jax.device_put(np.asarray(host_batches[i % N_BATCHES].numpy(), dtype=np.int32), tok_sharding)
            state["params"], state["opt"], loss = twin.jitted(state["params"], state["opt"], tok)
            return loss

        def save(i):
            mgr.save(i, args=ocp.args.StandardSave({"params": state["params"], "opt": state["opt"]}))

        _loop(steps, every, one_step, save, None)
        mgr.wait_until_finished()


def _loop(steps, every, one_step, save, debug) -> None:
    """Run ``steps`` steps; print one JSON report line every ``every`` steps."""

    times: list[float] = []
    compiles0 = debug.counter_value("UncachedCompile") if debug is not None else 0
    for i in range(steps):
        t0 = time.perf_counter()
        loss = one_step(i)
        float(loss.item() if hasattr(loss, "item") else loss)  # wait for the step
        times.append(time.perf_counter() - t0)
        save(i)
        if (i + 1) % every == 0:
            live_bytes, live_count = _live_device_arrays()
            report = {
                "step": i + 1,
                "rss_mib": _rss_mib(),
                "live_mib": live_bytes / 2**20,
                "live_arrays": live_count,
                "compiles": (debug.counter_value("UncachedCompile") - compiles0) if debug is not None else None,
                "cache_entries": sum(debug.cache_sizes().values()) if debug is not None else None,
                "step_ms": statistics.median(times) * 1e3,
                "loss": float(loss.item() if hasattr(loss, "item") else loss),
            }
            print(json.dumps(report), flush=True)
            times = []


def _run_mode(mode: str, args) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix=f"soak-{mode}-") as ckpt:
        cmd = [sys.executable, __file__, "--worker", mode, "--config", args.config, "--steps", str(args.steps)]
        cmd += ["--every", str(args.every), "--save-every", str(args.save_every), "--ckpt", ckpt]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        rows = []
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("{"):
                row = json.loads(line)
                rows.append(row)
                print(f"  [{mode}] " + " ".join(f"{k}={_fmt(v)}" for k, v in row.items()), flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"soak worker {mode!r} failed with exit code {proc.returncode}")
        return rows


def _fmt(v) -> str:
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def _verdict(rows: list[dict]) -> tuple[str, bool]:
    if len(rows) < 2:
        return "too few reports (raise --steps or lower --every)", False
    first, last = rows[0], rows[-1]
    rss = last["rss_mib"] - first["rss_mib"]
    live = last["live_mib"] - first["live_mib"]
    new_compiles = (last["compiles"] - first["compiles"]) if first["compiles"] is not None else 0
    drift = last["step_ms"] / first["step_ms"]
    ok = rss < RSS_BUDGET_MIB and new_compiles == 0 and abs(live) < 1 and drift <= STEP_TIME_DRIFT
    text = (
        f"RSS +{rss:.1f} MiB (< {RSS_BUDGET_MIB}), live device {live:+.2f} MiB, "
        f"compiles after warm-up {new_compiles}, step time x{drift:.2f} (<= {STEP_TIME_DRIFT})"
    )
    return text, ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--config", default="tiny", choices=("tiny", "small"))
    p.add_argument("--steps", type=int, default=10_000)
    p.add_argument("--every", type=int, default=1000, help="report every N steps")
    p.add_argument("--save-every", type=int, default=500, help="async checkpoint every N steps")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker == "jax":
        _jax_worker(args.config, args.steps, args.every, args.save_every, args.ckpt)
        return 0
    if args.worker:
        _spmdtorch_worker(args.worker, args.config, args.steps, args.every, args.save_every, args.ckpt)
        return 0

    import jax
    import torch

    print(
        f"# soak: {args.config} Llama, {args.steps} steps, report every {args.every}, "
        f"async checkpoint every {args.save_every}; {datetime.date.today()}, {platform.machine()}, "
        f"python {platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}"
    )
    results = {mode: _run_mode(mode, args) for mode in args.modes.split(",")}
    print()
    print("| mode | step | RSS MiB | live device MiB | live arrays | compiles | cache entries | step ms |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, rows in results.items():
        for r in rows:
            print(
                f"| {mode} | {r['step']} | {r['rss_mib']:.0f} | {r['live_mib']:.2f} | {r['live_arrays']} | "
                f"{_fmt(r['compiles'])} | {_fmt(r['cache_entries'])} | {r['step_ms']:.1f} |"
            )
    print()
    all_ok = True
    for mode, rows in results.items():
        text, ok = _verdict(rows)
        all_ok &= ok or mode == "jax"
        print(f"{mode}: {text} -> {'ok' if ok else 'NOT MET'}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
