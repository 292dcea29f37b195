"""Where the CPU time of a compiled FSDPv2 training step goes, next to its pure-JAX twin.

On simulated CPU devices the host and the "devices" share the machine's cores,
so a step's time follows the CPU its threads use. For one config of
``benchmarks/train_step.py`` this builds, in one process:

* ``spmdtorch``: the ``spmdtorch.compile`` step as the benchmark writes it
  (``opt.zero_grad()`` first, so the program returns the gradients);
* ``spmdtorch, zero_grad last``: the same step ending with ``opt.zero_grad()``
  (the gradients die inside the program);
* ``twin``: the ``jax.jit`` twin;
* ``twin + grads out``: the twin also returning its gradients, as torch's
  semantics make spmdtorch's program do;
* ``twin + grads recycled``: the same, given last step's gradient buffers back
  (donated, unused), as spmdtorch's replay does (design decision 23);

then runs blocks of steps launched back to back (the benchmark's throughput
measure), the four taking turns block by block so that load from other
processes hits each alike, and prints per step: wall time, CPU time of the
whole process, of the main (Python) thread, of XLA's intra-op (Eigen) pool and
of the other threads (PjRt's client threads, which run each device's program
unless XLA hands its thunks to the intra-op pool). Medians over the turns.
CPU per thread comes from ``/proc/self/task`` (Linux only; clock ticks, so a
block needs to be long enough: 40 steps by default).

Usage:
    python tools/step_cpu.py                  # tiny, 8 turns of 40 steps
    python tools/step_cpu.py --turns 16 --steps 40
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "benchmarks"))
sys.path.insert(0, str(_ROOT / "tools"))


def _thread_ticks() -> dict:
    """``{thread id: (name, user + system clock ticks)}`` of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended between listdir and open
            continue
        out[tid] = (name, int(fields[11]) + int(fields[12]))
    return out


def _group(tid: str, name: str) -> str:
    if tid == str(os.getpid()):
        return "main"
    return "intra-op pool" if "Eigen" in name else "other"


def measure(run, steps: int, block_until_ready) -> dict:
    """One block of ``steps`` back-to-back steps: ms of wall and of CPU per step, by thread group."""
    block_until_ready(run())
    before, t0 = _thread_ticks(), time.perf_counter()
    for _ in range(steps):
        out = run()
    block_until_ready(out)
    wall = time.perf_counter() - t0
    ticks = collections.Counter()
    for tid, (name, t) in _thread_ticks().items():
        ticks[_group(tid, name)] += t - before.get(tid, (name, 0))[1]
    ms_per_tick = 1e3 / os.sysconf("SC_CLK_TCK")
    res = {k: v * ms_per_tick / steps for k, v in ticks.items()}
    res["process"] = sum(ticks.values()) * ms_per_tick / steps
    res["wall"] = wall * 1e3 / steps
    return res


def build(cfg_name: str) -> dict:
    """The five step functions (each returns its loss, not yet waited on)."""
    import hlo_compare
    import jax
    import optax
    import train_step as bench
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import spmdtorch
    from spmdtorch.models.llama import causal_lm_loss

    _, run_spmd = hlo_compare._build_spmdtorch(cfg_name)
    _, run_twin = hlo_compare._build_twin(cfg_name)

    _, model, tokens = bench._setup(cfg_name)
    model, opt, tok, _ = bench.spmdtorch_step(model, tokens)

    @spmdtorch.compile
    def zero_grad_last(tokens):
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(3):  # the third trace is the stable one
        zero_grad_last(tok).item()

    cfg, model2, tokens2 = bench._setup(cfg_name)
    twin = bench.jax_twin(cfg, model2, tokens2)
    tx = bench.adamw_tx()

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(twin.loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    param_sh = jax.tree.map(lambda a: a.sharding, twin.params)
    opt_sh = jax.tree.map(lambda a: a.sharding, twin.opt_state)
    replicated = NamedSharding(jax.tree.leaves(param_sh)[0].mesh, P())
    jitted = jax.jit(step, donate_argnums=(0, 1), out_shardings=(param_sh, opt_sh, replicated, param_sh))
    state = [twin.params, twin.opt_state, None]

    def run_twin_grads():
        state[0], state[1], loss, state[2] = jitted(state[0], state[1], twin.tokens)
        return loss

    def step_recycled(params, opt_state, old_grads, tokens):
        del old_grads  # only its buffers: XLA writes the new gradients into them
        return step(params, opt_state, tokens)

    recycling = jax.jit(
        step_recycled,
        donate_argnums=(0, 1, 2),
        keep_unused=True,
        out_shardings=(param_sh, opt_sh, replicated, param_sh),
    )
    cfg3, model3, tokens3 = bench._setup(cfg_name)
    twin3 = bench.jax_twin(cfg3, model3, tokens3)
    state3 = [twin3.params, twin3.opt_state, jax.tree.map(jax.numpy.zeros_like, twin3.params)]

    def run_twin_recycled():
        state3[0], state3[1], loss, state3[2] = recycling(state3[0], state3[1], state3[2], twin3.tokens)
        return loss

    return {
        "spmdtorch": lambda: run_spmd(),
        "spmdtorch, zero_grad last": lambda: zero_grad_last(tok),
        "twin": run_twin,
        "twin + grads out": run_twin_grads,
        "twin + grads recycled": run_twin_recycled,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="tiny", choices=("tiny", "small"))
    p.add_argument("--turns", type=int, default=8, help="blocks per step function, taken in turn")
    p.add_argument("--steps", type=int, default=40, help="steps per block")
    args = p.parse_args(argv)
    if not os.path.isdir("/proc/self/task"):
        p.error("per-thread CPU times come from /proc/self/task (Linux only)")

    # First: importing it sets up 8 simulated devices (XLA_FLAGS, NPROC) and
    # checks that jax has not started; the twin's code lives there too.
    import hlo_compare
    import step_time  # noqa: F401
    from rich.console import Console
    from rich.table import Table

    runs = build(args.config)

    def ready(x):
        import jax

        jax.block_until_ready(hlo_compare._as_jax(x))

    blocks = {k: [] for k in runs}
    for _ in range(args.turns):
        for k, run in runs.items():
            blocks[k].append(measure(run, args.steps, ready))
    cols = ("wall", "process", "main", "intra-op pool", "other")
    table = Table(
        title=f"Llama {args.config}, compiled step, ms per step (median of {args.turns} blocks "
        f"of {args.steps} steps, taken in turn)"
    )
    table.add_column("step")
    for c in cols:
        table.add_column(c if c == "wall" else f"CPU {c}", justify="right")
    twin_wall = statistics.median(b["wall"] for b in blocks["twin"])
    for k, bs in blocks.items():
        med = {c: statistics.median(b.get(c, 0.0) for b in bs) for c in cols}
        table.add_row(k, f"{med['wall']:.2f} ({med['wall'] / twin_wall:.2f}x)", *(f"{med[c]:.2f}" for c in cols[1:]))
    Console(width=160).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
