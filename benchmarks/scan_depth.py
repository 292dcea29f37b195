"""First-step time vs depth: spmdtorch unrolled / scanned vs a JAX twin unrolled / scanned.

A decoder of N layers (``LlamaConfig.tiny()`` sizes, ffn_dim 176 so 8 divides
it, batch 8x64) under FSDPv2 on 8 simulated CPU devices (one wrapper per
decoder layer), trained with AdamW. The implementations:

* ``spmdtorch unrolled``: the model's Python loop over its layers (lazy mode);
* ``spmdtorch scan``: the same model after ``spmdtorch.models.scan_decoder_layers``
  (one ``jax.lax.scan`` over the per-layer weights stacked inside the program);
* ``spmdtorch stacked``: ``scan_decoder_layers(..., stack_parameters=True)``:
  the layers' weights are stacked ``Parameter`` objects (one per weight kind),
  so AdamW updates 9 stacked arrays instead of 9 per layer, as the twin does;
* ``spmdtorch scan_layers``: the decoder as a PyTorch/XLA user writes it, its
  ``forward`` calling ``spmdtorch.scan_layers(self.layers, h, layer_args=(cos,
  sin))``; its layers keep their own parameters, so AdamW updates 9 per layer;
* ``jax unrolled``: the decoder in ``jax.numpy`` (``benchmarks/step_time.py``),
  a Python loop over the layers, optax AdamW, one ``jax.jit`` step;
* ``jax scan``: the same layer under ``jax.lax.scan`` over stacked weights
  (the twin keeps its parameters stacked, sharded like one layer's plus a
  replicated leading dim).

The spmdtorch step runs in lazy mode (``with spmdtorch.step():``), or with
``--compiled`` as ``spmdtorch.compile(train_step)`` (which traces the first
two calls: the first creates AdamW's state, the second records the steady
step; replays follow).

Columns (host wall-clock): ``first step s`` = the first step, trace + compile
+ run until the loss is on the host (what depth makes slow); ``CPU s`` = the
CPU time the process spent in it, all threads (XLA compiles on several):
steadier than wall-clock on a loaded machine; ``compile s`` =
the part of it spent lowering and compiling the XLA program (spmdtorch's
``CompileTime`` timer; the twin's ``lower`` + ``compile``); ``2nd step s`` =
the second step (a second trace and compile under ``--compiled``; the twin
only runs); ``step ms`` = the
median steady-state step (after 3 warm-up steps, each step waited for);
``x unrolled`` = the step time over the same framework's unrolled step (issue
18's target: spmdtorch's ratio no larger than the twin's); ``outputs`` and
``fusions`` = the first step's optimized XLA program: the arrays it returns
and its entry computation's fusions (kernels), what its compile time grows
with (``benchmarks/optimizer_layout.py``).

Every (implementation, depth) runs in its own fresh process, so none inherits
another's compile cache. Processes run one at a time, the four
implementations alternating within each depth (rotated per round), so that
load from other tenants hits each alike; with ``--rounds R`` the table shows
the median over rounds.

Usage:
    python benchmarks/scan_depth.py                  # depths 2, 8, 32, 1 round (a few minutes)
    python benchmarks/scan_depth.py --rounds 3
    python benchmarks/scan_depth.py --layers 2 8     # other depths
    python benchmarks/scan_depth.py --compiled --layers 32 --rounds 3 \
        --impls "spmdtorch scan_layers" "spmdtorch stacked" "jax scan"
"""

from __future__ import annotations

import os
import sys

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8
if __name__ == "__main__":  # before anything queries devices (also in each worker process)
    simulate_cpu_devices(_NUM_DEVICES, unless_accelerator=True)

import argparse
import dataclasses
import functools
import json
import statistics
import subprocess
import time
from pathlib import Path

IMPLS = (
    "spmdtorch unrolled",
    "spmdtorch scan",
    "spmdtorch stacked",
    "spmdtorch scan_layers",
    "jax unrolled",
    "jax scan",
)
BATCH, SEQ = 8, 64
WARMUP, STEPS = 3, 5
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW defaults


def now() -> float:
    return time.perf_counter()


def setup(n_layers: int, scan_layers: bool = False):
    import torch

    import spmdtorch
    from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM, rope_tables

    class ScanLayersLlama(LlamaForCausalLM):
        """The same decoder, its layer loop written with PyTorch/XLA's ``scan_layers``."""

        def forward(self, tokens):
            cos, sin = rope_tables(self.cfg, tokens.shape[1], device=tokens.device)
            h = spmdtorch.scan_layers(self.layers, self.tok_embeddings(tokens), layer_args=(cos, sin))
            return self.output(self.norm(h))

    cfg = dataclasses.replace(LlamaConfig.tiny(), n_layers=n_layers, ffn_dim=176)
    torch.manual_seed(0)
    model = (ScanLayersLlama if scan_layers else LlamaForCausalLM)(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return cfg, model, tokens


def run_spmdtorch(impl: str, n_layers: int, compiled: bool) -> dict:
    import numpy as np
    import torch

    import spmdtorch
    from spmdtorch import debug
    from spmdtorch.mesh import Mesh
    from spmdtorch.models import scan_decoder_layers
    from spmdtorch.models.llama import DecoderLayer, causal_lm_loss
    from spmdtorch.partition import FSDPv2, mark_sharding, transformer_auto_wrap_policy

    _, model, tokens = setup(n_layers, scan_layers=impl == "spmdtorch scan_layers")
    mesh = Mesh(np.arange(_NUM_DEVICES), (_NUM_DEVICES,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(model, mesh=mesh, auto_wrap_policy=policy)
    if impl in ("spmdtorch scan", "spmdtorch stacked"):
        scan_decoder_layers(model.module, stack_parameters=impl == "spmdtorch stacked")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    tok = mark_sharding(tokens.to("xla"), mesh, ("fsdp", None))
    spmdtorch.sync(wait=True)

    def train_step(tokens):
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        return loss

    compiled_step = spmdtorch.compile(train_step)

    def step() -> float:
        if compiled:
            return compiled_step(tok).item()
        with spmdtorch.step():
            loss = train_step(tok)
        return loss.item()

    debug.clear_timers()
    c0, t0 = time.process_time(), now()
    loss0 = step()
    first, first_cpu = now() - t0, time.process_time() - c0
    compile_s = (debug.metric_data("CompileTime") or (0, 0.0, 0.0))[1]
    program = debug.last_executable()  # the first step's program (read after the timing: as_text costs)
    shape = program_shape(program, len(debug.last_executable_outputs())) if program is not None else {}
    t0 = now()
    step()
    second = now() - t0
    for _ in range(WARMUP - 1):
        step()
    times = []
    for _ in range(STEPS):
        t0 = now()
        step()
        times.append(now() - t0)
    return {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "compile_s": compile_s,
        "second_s": second,
        "step_ms": 1e3 * statistics.median(times),
        "loss": loss0,
        **shape,
    }


def program_shape(compiled, outputs: int) -> dict:
    """What the first step's optimized XLA program holds: its outputs, its entry's fusions (kernels)."""
    entry = compiled.as_text().split("\nENTRY", 1)[-1]
    return {"outputs": outputs, "fusions": entry.count(" fusion(")}


def run_jax(n_layers: int, scanned: bool) -> dict:
    sys.path.insert(0, str(Path(__file__).parent))
    import math

    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from step_time import jax_cross_entropy, jax_linear, make_jax_llama_loss

    cfg, model, tokens = setup(n_layers)
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))

    def fsdp_spec(shape, lead=0):  # FSDPv2's rule on the per-layer shape; stacked dims replicated
        core = shape[lead:]
        dim = max(range(len(core)), key=lambda d: (core[d], -d))
        return NamedSharding(mesh, P(*([None] * lead), *[("fsdp" if d == dim else None) for d in range(len(core))]))

    act = NamedSharding(mesh, P("fsdp", None, None))
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    if not scanned:
        params = {k: jax.device_put(v, fsdp_spec(v.shape)) for k, v in state.items()}
        loss_fn = make_jax_llama_loss(cfg, act_sharding=act)
    else:
        names = sorted({k.split(".", 2)[2] for k in state if k.startswith("layers.")})
        params = {k: jax.device_put(v, fsdp_spec(v.shape)) for k, v in state.items() if not k.startswith("layers.")}
        for n in names:
            stacked = np.stack([state[f"layers.{i}.{n}"] for i in range(n_layers)])
            params["layers." + n] = jax.device_put(stacked, fsdp_spec(stacked.shape, lead=1))
        loss_fn = scanned_loss(cfg, act, jax, jnp, math, jax_linear, jax_cross_entropy)
    tx = optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD)
    replicated = NamedSharding(mesh, P())
    p_sh = jax.tree.map(lambda a: a.sharding, params)
    opt_state = jax.jit(tx.init)(params)
    tok = jax.device_put(tokens.numpy().astype(np.int32), NamedSharding(mesh, P("fsdp", None)))

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(step, donate_argnums=(0, 1), out_shardings=(p_sh, None, replicated))
    c0, t0 = time.process_time(), now()
    compiled = jitted.lower(params, opt_state, tok).compile()
    compile_s = now() - t0
    params, opt_state, loss = compiled(params, opt_state, tok)
    loss0 = float(loss)
    first, first_cpu = now() - t0, time.process_time() - c0
    shape = program_shape(compiled, len(jax.tree.leaves(compiled.out_info)))
    t0 = now()
    params, opt_state, loss = compiled(params, opt_state, tok)
    float(loss)
    second = now() - t0
    for _ in range(WARMUP - 1):
        params, opt_state, loss = compiled(params, opt_state, tok)
        float(loss)
    times = []
    for _ in range(STEPS):
        t0 = now()
        params, opt_state, loss = compiled(params, opt_state, tok)
        float(loss)
        times.append(now() - t0)
    return {
        "first_s": first,
        "first_cpu_s": first_cpu,
        "compile_s": compile_s,
        "second_s": second,
        "step_ms": 1e3 * statistics.median(times),
        "loss": loss0,
        **shape,
    }


def scanned_loss(cfg, act, jax, jnp, math, jax_linear, jax_cross_entropy):
    """The twin (``step_time.make_jax_llama_loss``) with its layer loop as ``jax.lax.scan``."""
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def rms(x, w):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
        return xf.astype(x.dtype) * w

    def rope(x, cos, sin):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def loss_fn(p, tokens):
        b, s = tokens.shape
        half = hd // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, half, dtype=jnp.float32) / half))
        angles = jnp.outer(jnp.arange(s, dtype=jnp.float32), inv_freq)
        cos, sin = jnp.cos(angles)[None, None], jnp.sin(angles)[None, None]
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        stacked = {k[len("layers.") :]: v for k, v in p.items() if k.startswith("layers.")}

        def layer(h, lp):
            x = rms(h, lp["attention_norm.weight"])
            q = jax_linear(lp, "attention.wq", x).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
            k = jax_linear(lp, "attention.wk", x).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
            v = jax_linear(lp, "attention.wv", x).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            k = jnp.repeat(k, nh // nkv, axis=1)
            v = jnp.repeat(v, nh // nkv, axis=1)
            scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hd)
            scores = jnp.where(mask, scores, -jnp.inf)
            att = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype) @ v
            h = h + jax_linear(lp, "attention.wo", att.transpose(0, 2, 1, 3).reshape(b, s, -1))
            x = rms(h, lp["ffn_norm.weight"])
            ff = jax.nn.silu(jax_linear(lp, "feed_forward.w1", x)) * jax_linear(lp, "feed_forward.w3", x)
            return jax.lax.with_sharding_constraint(h + jax_linear(lp, "feed_forward.w2", ff), act), None

        h = p["tok_embeddings.weight"][tokens]
        h, _ = jax.lax.scan(layer, h, stacked)
        logits = jax.lax.with_sharding_constraint(jax_linear(p, "output", rms(h, p["norm.weight"])), act)
        return jax_cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))

    return loss_fn


def worker(impl: str, n_layers: int, compiled: bool) -> None:
    if impl.startswith("spmdtorch"):
        result = run_spmdtorch(impl, n_layers, compiled)
    else:
        result = run_jax(n_layers, impl == "jax scan")
    print("RESULT " + json.dumps(result), flush=True)


def run_one(impl: str, n_layers: int, timeout: int, compiled: bool) -> dict:
    cmd = [sys.executable, __file__, "--worker", impl, "--layers", str(n_layers)] + (["--compiled"] if compiled else [])
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")])
    )
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"{impl} at {n_layers} layers failed:\n{out.stderr[-3000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS, metavar="IMPL")
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--compiled", action="store_true", help="spmdtorch steps under spmdtorch.compile (default: lazy)")
    p.add_argument("--worker", choices=IMPLS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.worker, args.layers[0], args.compiled)
        return 0
    results: dict = {}
    for r in range(args.rounds):
        for n in args.layers:
            k = (r + args.layers.index(n)) % len(args.impls)
            for impl in args.impls[k:] + args.impls[:k]:  # rotated: each impl goes first in turn
                res = run_one(impl, n, args.timeout, args.compiled)
                results.setdefault((impl, n), []).append(res)
                print(f"  round {r + 1} {impl:>21} {n:>3} layers: first step {res['first_s']:.2f} s "
                      f"(CPU {res['first_cpu_s']:.2f} s, compile {res['compile_s']:.2f} s), 2nd step {res['second_s']:.2f} s, "
                      f"step {res['step_ms']:.1f} ms; program {res.get('outputs')} outputs, {res.get('fusions')} fusions",
                      file=sys.stderr, flush=True)  # fmt: skip
    mode = "under spmdtorch.compile" if args.compiled else "lazy"
    print(f"\nFirst step (trace + compile + run) and steady step, FSDPv2 on {_NUM_DEVICES} devices, "
          f"spmdtorch steps {mode}, median of {args.rounds} round(s)\n")  # fmt: skip
    print(
        "| layers | implementation | first step s | x jax scan | CPU s | x jax scan | compile s | 2nd step s "
        "| step ms | x jax scan | x unrolled | outputs | fusions |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def med(impl: str, n: int, field: str) -> float | None:
        rs = results.get((impl, n))
        return statistics.median(r[field] for r in rs) if rs else None

    for n in args.layers:
        bf, bs, bc = med("jax scan", n, "first_s"), med("jax scan", n, "step_ms"), med("jax scan", n, "first_cpu_s")
        for impl in args.impls:
            f, c, s = med(impl, n, "first_s"), med(impl, n, "compile_s"), med(impl, n, "step_ms")
            if f is None:
                continue
            s2, fc = med(impl, n, "second_s"), med(impl, n, "first_cpu_s")
            cr = f"{fc / bc:.2f}" if bc else "-"
            unrolled = med(impl.split()[0] + " unrolled", n, "step_ms")
            fr = f"{f / bf:.2f}" if bf else "-"
            sr = f"{s / bs:.2f}" if bs else "-"
            ur = f"{s / unrolled:.2f}" if unrolled else "-"
            outs, fus = results[(impl, n)][0].get("outputs", "-"), results[(impl, n)][0].get("fusions", "-")
            print(f"| {n} | {impl} | {f:.2f} | {fr} | {fc:.2f} | {cr} | {c:.2f} | {s2:.2f} | {s:.1f} | {sr} | {ur} "
                  f"| {outs} | {fus} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
