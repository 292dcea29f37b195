"""Compare the programs of the compiled FSDPv2 training step and its pure-JAX twin.

For one config of ``benchmarks/train_step.py`` (the same model, mesh, shardings
and AdamW), this builds the ``spmdtorch.compile`` step and the ``jax.jit`` twin,
and prints, side by side, how many of each HLO op the two programs contain:

* ``pre-opt``: the program as handed to XLA (the lowered StableHLO converted
  to HLO, before SPMD partitioning and optimisation);
* ``optimized``: the compiled, partitioned per-device program (top-level
  instructions, i.e. not counting the instructions inside fusions, plus the
  number of instructions inside fusions and of distinct fusion kernels, which
  is what the LLVM part of XLA's CPU compile scales with);

and the compile time of each pre-optimisation module (compiled again here, so
it is the same HLO timed the same way for both). ``--rounds N`` also times N
blocking steps of each, alternating between the two so that load from other
processes hits both alike (a cross-check, not the benchmark). ``--dump DIR``
writes the four texts so they can be diffed op by op. ``--no-rewrites`` and
``--no-interning`` turn off ``spmdtorch.lazy.rewrite`` and
``graph.interned_scalar`` to show what each changes; ``--twin-per-param-adamw``
gives the twin one AdamW step count per parameter, the state
``torch.optim.AdamW`` keeps (each parameter then computes its own bias
corrections: a few scalar kernels per parameter).

Usage:
    python tools/hlo_compare.py                    # tiny
    python tools/hlo_compare.py --configs tiny,small --rounds 30 --dump /tmp/hlo
    python tools/hlo_compare.py --no-rewrites --no-interning   # the program as it was recorded before
"""

from __future__ import annotations

import re
import sys

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8
if __name__ == "__main__":  # before anything queries devices
    simulate_cpu_devices(_NUM_DEVICES, unless_accelerator=True)

import argparse
import collections
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "benchmarks"))

# The ops a reader of the two programs compares first: communication, data
# movement and the fusions that on simulated CPU devices each cost a thunk.
KEY_OPS = (
    "all-gather",
    "reduce-scatter",
    "all-reduce",
    "all-to-all",
    "collective-permute",
    "dynamic-slice",
    "fusion",
    "transpose",
    "copy",
    "convert",
    "reshape",
    "broadcast",
    "dot",
    "custom-call",
)

_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


def _opcode(line: str) -> str | None:
    """The opcode of one HLO instruction line (``%x = f32[2]{0} add(%a, %b)``), else None."""
    if "=" not in line or line.lstrip().startswith(("//", "HloModule")):
        return None
    rhs = line.split("=", 1)[1]
    # Skip the result shape: a tuple shape is parenthesised, so drop balanced parens first.
    rhs = rhs.strip()
    if rhs.startswith("("):
        depth = 0
        for i, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                rhs = rhs[i + 1 :]
                break
    m = re.match(r"\s*(?:[\w\[\]{},:\s]*?\s)?([a-z][\w\-]*)\(", rhs)
    return m.group(1) if m else None


def hlo_op_counts(text: str) -> tuple[collections.Counter, int]:
    """``(top-level opcode counts, instructions inside fusions)`` of an HLO module's text.

    Fused computations (those a ``fusion`` instruction ``calls=``) are counted
    apart: on CPU every top-level instruction is a thunk, what is fused is not.

    Example:
        >>> c, fused = hlo_op_counts("ENTRY %m (p: f32[2]) -> f32[2] {\\n"
        ...                          "  %p = f32[2]{0} parameter(0)\\n"
        ...                          "  ROOT %n = f32[2]{0} negate(%p)\\n}\\n")
        >>> c["negate"], fused
        (1, 0)
    """
    comps: dict[str, list[str]] = {}
    fused: set[str] = set()
    current = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:  # a computation header (instructions are indented)
            current = m.group(2)
            comps[current] = []
            continue
        if line.strip() == "}":
            current = None
            continue
        if current is None:
            continue
        op = _opcode(line)
        if op is None:
            continue
        comps[current].append(op)
        if op == "fusion":
            fused.update(_CALLS.findall(line))
    top = collections.Counter()
    inside = 0
    for name, ops in comps.items():
        if name in fused:
            inside += len(ops)
        else:
            top.update(ops)
    return top, inside


def distinct_fusion_kernels(text: str) -> int:
    """How many different kernels the entry computation's fusions need.

    XLA's CPU backend compiles one kernel per distinct fused computation and
    reuses it for identical ones (same ops, shapes and constants), so this,
    more than the number of fusions, is what the LLVM part of a compile costs.
    """
    bodies: dict[str, list[str]] = {}
    entry = None
    current = None
    for line in text.splitlines():
        m = _COMP.match(line)
        if m:
            current = m.group(2)
            bodies[current] = []
            if m.group(1):
                entry = current
            continue
        if line.strip() == "}":
            current = None
        elif current is not None:
            bodies[current].append(line)

    def normalized(name):  # names and metadata differ between identical computations
        return "\n".join(
            re.sub(r"%[\w.\-]+", "%", re.sub(r", metadata=\{[^}]*\}", "", ln)).strip() for ln in bodies[name]
        )

    called = [c for ln in bodies.get(entry, []) if " fusion(" in ln for c in _CALLS.findall(ln)]
    return len({normalized(c) for c in called if c in bodies})


def _build_spmdtorch(cfg_name: str, dtype: str | None = None):
    """The compiled spmdtorch step, traced until stable; returns its ``_Program``."""
    import train_step as bench

    import spmdtorch

    _, model, tokens = bench._setup(cfg_name, dtype=dtype)
    _, _, tok, step = bench.spmdtorch_step(model, tokens)
    train_step = spmdtorch.compile(step)
    for _ in range(3):  # the third trace is the stable one (the first creates AdamW's state)
        train_step(tok).item()
    entry = next(e for e in train_step._entries.values() if e.stable)

    def run_step():
        return train_step(tok)

    return entry.stable[-1].prog, run_step  # the latest replayable program


def _per_param(tx_factory):
    """One optax transform per parameter (its own step count and bias corrections), the
    way ``torch.optim.AdamW`` keeps a ``step`` per parameter."""
    import optax

    def init(params):
        return {k: tx_factory().init(v) for k, v in params.items()}

    def update(grads, state, params):
        updates, new_state = {}, {}
        for k in grads:
            updates[k], new_state[k] = tx_factory().update(grads[k], state[k], params[k])
        return updates, new_state

    return optax.GradientTransformation(init, update)


def _build_twin(cfg_name: str, per_param_adamw: bool = False, dtype: str | None = None):
    """The JAX twin's ``jax.stages.Lowered`` (``train_step.jax_twin``, as the benchmark runs it)."""
    import train_step as bench

    cfg, model, tokens = bench._setup(cfg_name, dtype=dtype)
    twin = bench.jax_twin(cfg, model, tokens, tx=_per_param(bench.adamw_tx) if per_param_adamw else None)
    lowered = twin.jitted.lower(twin.params, twin.opt_state, twin.tokens)
    state = [twin.params, twin.opt_state]

    def run_step():
        state[0], state[1], loss = twin.jitted(state[0], state[1], twin.tokens)
        return loss

    return lowered, run_step


def _compile_seconds(lowered) -> float:
    t0 = time.perf_counter()
    lowered.compile(compiler_options={})  # any options dict: compiled again, not the cached executable
    return time.perf_counter() - t0


def _interleaved_ms(runs: dict, rounds: int) -> dict:
    """Median ms of one blocking step of each runner, the runners alternating step by step
    (so that load from other processes hits both alike)."""
    import statistics

    import jax

    times = {k: [] for k in runs}
    for _ in range(rounds):
        for k, run in runs.items():
            t0 = time.perf_counter()
            jax.block_until_ready(_as_jax(run()))
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def _as_jax(x):
    from spmdtorch.tensor.dispatch import concrete_value
    from spmdtorch.tensor.xla_tensor import XlaTensor

    return concrete_value(x) if isinstance(x, XlaTensor) else x


def compare(
    cfg_name: str, dump: Path | None = None, rounds: int = 0, per_param_adamw: bool = False, dtype: str | None = None
) -> dict:
    """Counts (and compile times) of both programs for ``cfg_name``; see the module docstring."""
    prog, run_spmd = _build_spmdtorch(cfg_name, dtype)
    twin, run_twin = _build_twin(cfg_name, per_param_adamw, dtype)
    texts = {
        ("spmdtorch", "pre-opt"): prog.lowered.as_text(dialect="hlo"),
        ("twin", "pre-opt"): twin.as_text(dialect="hlo"),
        ("spmdtorch", "optimized"): prog.compiled.as_text(),
        ("twin", "optimized"): twin.compile().as_text(),
    }
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        for (who, stage), text in texts.items():
            (dump / f"{cfg_name}_{who}_{stage}.hlo").write_text(text)
    counts = {k: hlo_op_counts(v) for k, v in texts.items()}
    kernels = {who: distinct_fusion_kernels(texts[(who, "optimized")]) for who in ("spmdtorch", "twin")}
    import jax

    jax.clear_caches()  # compile again, not from JAX's in-memory cache
    times = {"spmdtorch": _compile_seconds(prog.lowered), "twin": _compile_seconds(twin)}
    step_ms = _interleaved_ms({"spmdtorch": run_spmd, "twin": run_twin}, rounds) if rounds else None
    return {"counts": counts, "kernels": kernels, "compile_s": times, "step_ms": step_ms}


def _print(cfg_name: str, res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    counts = res["counts"]
    table = Table(title=f"Llama {cfg_name}: HLO op counts, spmdtorch compiled step vs JAX twin")
    for col in ("op", "pre-opt spmdtorch", "pre-opt twin", "optimized spmdtorch", "optimized twin"):
        table.add_column(col, justify="left" if col == "op" else "right")
    ops = list(KEY_OPS)
    extra = set()
    for c, _ in counts.values():
        extra.update(c)
    ops += sorted(extra - set(ops))
    for op in ops:
        row = [counts[(w, s)][0].get(op, 0) for s in ("pre-opt", "optimized") for w in ("spmdtorch", "twin")]
        if not any(row):
            continue
        style = "bold" if op in KEY_OPS and row[2] != row[3] else None
        table.add_row(op, *map(str, row), style=style)
    totals = [sum(counts[(w, s)][0].values()) for s in ("pre-opt", "optimized") for w in ("spmdtorch", "twin")]
    table.add_row("(all top-level)", *map(str, totals), style="bold")
    table.add_row(
        "(inside fusions)", "", "", str(counts[("spmdtorch", "optimized")][1]), str(counts[("twin", "optimized")][1])
    )
    table.add_row(
        "(distinct fusion kernels)", "", "", str(res["kernels"]["spmdtorch"]), str(res["kernels"]["twin"]), style="bold"
    )
    Console(width=120).print(table)
    t = res["compile_s"]
    print(
        f"compile time of the pre-opt module: spmdtorch {t['spmdtorch']:.2f} s, twin {t['twin']:.2f} s "
        f"({t['spmdtorch'] / t['twin']:.2f}x)"
    )
    if res["step_ms"]:
        m = res["step_ms"]
        print(
            f"blocking step, interleaved, median: spmdtorch {m['spmdtorch']:.2f} ms, twin {m['twin']:.2f} ms "
            f"({m['spmdtorch'] / m['twin']:.2f}x)"
        )


def main(argv=None) -> int:
    import step_time  # noqa: F401  (first: it checks that jax has not started, and the twin's code lives there)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--configs", default="tiny", help="comma-separated: tiny, small")
    p.add_argument("--dump", type=Path, default=None, help="write the four HLO texts per config here")
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="also time N blocking steps of each, alternating (median ms; not a benchmark)",
    )
    p.add_argument(
        "--no-rewrites",
        action="store_true",
        help="record the graph without spmdtorch.lazy.rewrite's folds (to see what they change)",
    )
    p.add_argument(
        "--no-interning",
        action="store_true",
        help="give every Python number its own program input (as before graph.interned_scalar)",
    )
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None, help="parameter dtype (default float32)")
    p.add_argument(
        "--twin-per-param-adamw",
        action="store_true",
        help="the twin keeps one AdamW step count per parameter, as torch.optim.AdamW does",
    )
    args = p.parse_args(argv)
    if args.no_rewrites:
        from spmdtorch.lazy import rewrite

        rewrite.RULES.clear()
    if args.no_interning:
        from spmdtorch.lazy.graph import Scalar
        from spmdtorch.tensor.dispatch import _args

        _args.interned_scalar = lambda value, context: Scalar(value)
    for cfg in [c.strip() for c in args.configs.split(",") if c.strip()]:
        _print(cfg, compare(cfg, args.dump, args.rounds, args.twin_per_param_adamw, args.dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main())
