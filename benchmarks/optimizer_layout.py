"""XLA compile time of one AdamW update over 32 layers: per-layer vs stacked arrays, in and out.

Why this exists: plain ``spmdtorch.scan_layers`` keeps one ``Parameter`` per
layer, so its first compiled step updates 9 x 32 parameters, each its own
program input and output, where the stacked form (and the JAX twin) updates
9 stacked arrays. This script isolates the optimizer part of that program in
pure JAX (no spmdtorch) to tell which layout costs the compile time: grouping
the update's arithmetic inside the program, or the arrays the program takes
and returns.

The program: the tiny decoder's 9 weight kinds (``LlamaConfig.tiny()`` sizes,
ffn 176) x 32 layers, each FSDP-sharded over 8 simulated CPU devices like
FSDPv2 shards them (the largest dim; a stacked array keeps a replicated
leading dim); the gradients arrive stacked, as the scan's backward makes
them; the first AdamW step (moments from zero); the program returns the new
parameters, both moments and the gradients (kept in ``p.grad``). Layouts:

* ``per-layer``: per-layer parameters in and out, one update per layer, each
  layer's gradient cut at a runtime index (plain ``scan_layers`` today);
* ``stacked``: stacked parameters in and out, one update per weight kind
  (``stack_parameters=True``, the JAX twin);
* ``per-layer in, stacked out``: per-layer parameters stacked inside, one
  update per kind, stacked results;
* ``grouped update``: per-layer in and out, the update on the stacked arrays
  inside and each layer's result cut at a runtime index (grouping only the
  optimizer's arithmetic);
* ``grouped, static cuts``: the same, each layer's result cut at a constant
  offset;
* ``views of stacked``: stacked in and out, each layer read with a
  dynamic slice, updated alone and written back with a dynamic update slice
  (per-layer tensors as views into stacked storage, the update still per
  layer).

Each (layout, round) runs in a fresh process (no compile cache shared), the
layouts taking turns, who goes first rotating. Columns: process CPU time
(all threads) of ``lower`` and of ``compile``, wall-clock of both, the
optimized program's fusions and instructions.

Usage:
    python benchmarks/optimizer_layout.py               # every layout, 2 rounds (~1 min)
    python benchmarks/optimizer_layout.py --rounds 3 --layouts per-layer stacked
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

LAYERS = 32
KINDS = {
    "wq": (64, 64),
    "wk": (32, 64),
    "wv": (32, 64),
    "wo": (64, 64),
    "w1": (176, 64),
    "w2": (64, 176),
    "w3": (176, 64),
    "attention_norm": (64,),
    "ffn_norm": (64,),
}
LR, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 1e-2
LAYOUTS = (
    "per-layer",
    "stacked",
    "per-layer in, stacked out",
    "grouped update",
    "grouped, static cuts",
    "views of stacked",
)
STACKED_IN = ("stacked", "views of stacked")


def worker(layout: str) -> dict:
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))

    def spec(shape: tuple[int, ...], lead: int = 0) -> NamedSharding:
        core = shape[lead:]
        dim = max(range(len(core)), key=lambda d: (core[d], -d))
        return NamedSharding(mesh, P(*([None] * lead), *[("fsdp" if d == dim else None) for d in range(len(core))]))

    def adamw(p, g):  # the first step: both moments start at zero
        m, v = (1 - B1) * g, (1 - B2) * g * g
        p = p * (1 - LR * WD) - (LR / (1 - B1)) * m / (jnp.sqrt(v) / jnp.sqrt(1 - B2) + EPS)
        return p, m, v

    def cut(a, i):
        return jax.lax.dynamic_index_in_dim(a, i, keepdims=False)

    def step(params, grads, index):
        out = {}
        for k in KINDS:
            ps, g = params[k], grads[k]
            if layout == "per-layer":
                out[k] = [(*adamw(ps[i], cut(g, index[i])), cut(g, index[i])) for i in range(LAYERS)]
            elif layout == "stacked":
                out[k] = (*adamw(ps, g), g)
            elif layout == "per-layer in, stacked out":
                out[k] = (*adamw(jnp.stack(ps), g), g)
            elif layout == "grouped update":
                res = (*adamw(jnp.stack(ps), g), g)
                out[k] = [tuple(cut(a, index[i]) for a in res) for i in range(LAYERS)]
            elif layout == "grouped, static cuts":
                res = (*adamw(jnp.stack(ps), g), g)
                out[k] = [tuple(a[i] for a in res) for i in range(LAYERS)]
            else:  # views of stacked
                acc = [ps, jnp.zeros_like(ps), jnp.zeros_like(ps)]
                for i in range(LAYERS):
                    new = adamw(cut(ps, index[i]), cut(g, index[i]))
                    acc = [jax.lax.dynamic_update_index_in_dim(a, x, index[i], 0) for a, x in zip(acc, new)]
                out[k] = (*acc, g)
        return out

    def stacked_arg(shape):
        return jax.ShapeDtypeStruct((LAYERS, *shape), jnp.float32, sharding=spec((LAYERS, *shape), 1))

    if layout in STACKED_IN:
        params = {k: stacked_arg(s) for k, s in KINDS.items()}
    else:
        params = {
            k: [jax.ShapeDtypeStruct(s, jnp.float32, sharding=spec(s)) for _ in range(LAYERS)] for k, s in KINDS.items()
        }
    grads = {k: stacked_arg(s) for k, s in KINDS.items()}
    index = [jax.ShapeDtypeStruct((), jnp.int32) for _ in range(LAYERS)]
    c0, t0 = time.process_time(), time.perf_counter()
    lowered = jax.jit(step).lower(params, grads, index)
    c1 = time.process_time()
    compiled = lowered.compile()
    c2, t2 = time.process_time(), time.perf_counter()
    text = compiled.as_text()
    entry = text.split("\nENTRY", 1)[1]
    return {
        "lower_cpu": c1 - c0,
        "compile_cpu": c2 - c1,
        "wall": t2 - t0,
        "fusions": entry.count(" fusion("),
        "instructions": sum(1 for line in text.splitlines() if " = " in line),
        "outputs": len(jax.tree.leaves(jax.eval_shape(step, params, grads, index))),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS, metavar="LAYOUT")
    p.add_argument("--worker", choices=LAYOUTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker)), flush=True)
        return 0
    results: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        k = r % len(args.layouts)
        for layout in args.layouts[k:] + args.layouts[:k]:  # rotated: each layout goes first in turn
            out = subprocess.run([sys.executable, __file__, "--worker", layout], capture_output=True, text=True)
            line = next((s for s in out.stdout.splitlines() if s.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{layout} failed:\n{out.stderr[-3000:]}")
            res = json.loads(line[len("RESULT ") :])
            results.setdefault(layout, []).append(res)
            print(f"  round {r + 1} {layout:>26}: lower {res['lower_cpu']:.2f} s CPU, compile {res['compile_cpu']:.2f} s CPU, "
                  f"wall {res['wall']:.2f} s", file=sys.stderr, flush=True)  # fmt: skip
    print(f"\nAdamW's first step over {len(KINDS)} weight kinds x {LAYERS} layers, 8 simulated CPU devices, "
          f"median of {args.rounds} round(s) [every round]\n")  # fmt: skip
    print("| layout | outputs | lower CPU s | compile CPU s [rounds] | wall s | fusions | instructions |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for layout in args.layouts:
        rs = results[layout]
        lo, co, wa = (statistics.median(x[f] for x in rs) for f in ("lower_cpu", "compile_cpu", "wall"))
        each = " ".join(f"{x['compile_cpu']:.2f}" for x in rs)
        print(f"| {layout} | {rs[0]['outputs']} | {lo:.2f} | {co:.2f} [{each}] | {wa:.2f} | {rs[0]['fusions']} "
              f"| {rs[0]['instructions']} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
