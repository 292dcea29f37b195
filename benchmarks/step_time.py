"""Step-time benchmark: spmdtorch (lazy, compiled) against a pure-JAX twin.

Run:

    python benchmarks/step_time.py            # full run (a few minutes on 2 cores)
    python benchmarks/step_time.py --quick    # smoke run (< 60 s)

Measures, in one process on 8 simulated CPU devices (everything runs unsharded
on device 0; the 8 devices only make the runtime look like the test setup):

1. Lazy tracing cost per ATen op: host time of a training step from the start
   of ``zero_grad`` to just before ``spmdtorch.sync()``, divided by the
   ``DispatchedOps`` counter delta (steady state, median); plus a chain of small
   elementwise ops (``x = x * 1.0001 + 0.5``).
2. Host time per training step for an MLP and ``LlamaForCausalLM`` (tiny) in
   three ways: spmdtorch lazy, ``spmdtorch.compile``, and a pure-JAX twin (same
   math and parameter shapes, same initial weights, AdamW by hand, one
   ``jax.jit`` with donated params/optimizer state). Blocking (the loss is read
   every step) and throughput (no blocking until the end) medians, first-step
   (trace + compile) and warm-up times.

See benchmarks/README.md for what each column means and committed results.
"""

from __future__ import annotations

import os

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8
# Before anything queries devices (docs/design.md, hazard "CPU collective deadlock").
simulate_cpu_devices(_NUM_DEVICES, unless_accelerator=True)

import argparse
import contextlib
import copy
import datetime
import math
import platform
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch import nn

import spmdtorch
from spmdtorch import debug
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM, causal_lm_loss

console = Console(width=170)

TRACE_TARGET_US = 20.0  # lazy tracing cost target, µs per ATen op
COMPILED_TARGET = 1.05  # compiled step time target, × the JAX twin

LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW defaults


def now():
    return time.perf_counter()


def median_ms(xs):
    return statistics.median(xs) * 1e3


# =============================================================================
# Models (torch) and their pure-JAX twins
# =============================================================================


class MLP(nn.Module):
    """3 Linear layers, 256 wide, GELU (exact erf form)."""

    def __init__(self, d_in=256, width=256, n_classes=16):
        super().__init__()
        self.fc1 = nn.Linear(d_in, width)
        self.fc2 = nn.Linear(width, width)
        self.fc3 = nn.Linear(width, n_classes)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(F.gelu(self.fc1(x)))))


def mlp_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def jax_linear(p, name, x):
    y = x @ p[name + ".weight"].T
    b = p.get(name + ".bias")
    return y if b is None else y + b


def jax_cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def jax_mlp_loss(p, x, y):
    h = jax.nn.gelu(jax_linear(p, "fc1", x), approximate=False)
    h = jax.nn.gelu(jax_linear(p, "fc2", h), approximate=False)
    return jax_cross_entropy(jax_linear(p, "fc3", h), y)


def make_jax_llama_loss(cfg: LlamaConfig, act_sharding=None, remat=False):
    """The decoder's loss in jax.numpy. ``act_sharding``: a sharding each layer's
    output (and the logits) is constrained to, as FSDPv2 shards its wrappers' outputs.
    ``remat``: each decoder layer under ``jax.checkpoint`` (as ``checkpoint_module``)."""
    hd, nh, nkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def constrain(x):
        return x if act_sharding is None else jax.lax.with_sharding_constraint(x, act_sharding)

    def rms(x, w):
        xf = x.astype(jnp.float32)
        xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + cfg.norm_eps)
        return xf.astype(x.dtype) * w

    def rope(x, cos, sin):  # x: (b, h, s, hd); two halves
        # The tables in x's dtype, as apply_rope does: float32 tables would
        # promote a bfloat16 model's attention (and all after it) to float32.
        cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def loss_fn(p, tokens):
        b, s = tokens.shape
        half = hd // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, half, dtype=jnp.float32) / half))
        angles = jnp.outer(jnp.arange(s, dtype=jnp.float32), inv_freq)
        cos, sin = jnp.cos(angles)[None, None], jnp.sin(angles)[None, None]
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        h = p["tok_embeddings.weight"][tokens]
        for i in range(cfg.n_layers):
            pre = f"layers.{i}."
            layer_p = {k: v for k, v in p.items() if k.startswith(pre)}
            h = (jax.checkpoint(layer, static_argnums=(2,)) if remat else layer)(layer_p, h, pre, cos, sin, mask)
        logits = constrain(jax_linear(p, "output", rms(h, p["norm.weight"])))
        return jax_cross_entropy(logits[:, :-1].reshape(-1, cfg.vocab_size), tokens[:, 1:].reshape(-1))

    def layer(p, h, pre, cos, sin, mask):
        b, s = h.shape[:2]
        x = rms(h, p[pre + "attention_norm.weight"])
        q = jax_linear(p, pre + "attention.wq", x).reshape(b, s, nh, hd).transpose(0, 2, 1, 3)
        k = jax_linear(p, pre + "attention.wk", x).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        v = jax_linear(p, pre + "attention.wv", x).reshape(b, s, nkv, hd).transpose(0, 2, 1, 3)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        k = jnp.repeat(k, nh // nkv, axis=1)  # GQA, as repeat_interleave
        v = jnp.repeat(v, nh // nkv, axis=1)
        scores = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hd)
        scores = jnp.where(mask, scores, -jnp.inf)
        att = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype) @ v
        h = h + jax_linear(p, pre + "attention.wo", att.transpose(0, 2, 1, 3).reshape(b, s, -1))
        x = rms(h, p[pre + "ffn_norm.weight"])
        ff = jax.nn.silu(jax_linear(p, pre + "feed_forward.w1", x)) * jax_linear(p, pre + "feed_forward.w3", x)
        h = constrain(h + jax_linear(p, pre + "feed_forward.w2", ff))
        return h

    return loss_fn


def jax_adamw_init(params):
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"step": jnp.zeros((), jnp.float32), "m": zeros, "v": jax.tree.map(jnp.zeros_like, params)}


def jax_adamw_update(params, grads, state):
    """torch.optim.AdamW (amsgrad=False, maximize=False), same defaults."""
    b1, b2 = BETAS
    step = state["step"] + 1
    bc1 = 1 - b1**step
    bc2_sqrt = jnp.sqrt(1 - b2**step)
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)

    def upd(p, m, v):
        p = p * (1 - LR * WD)
        return p - (LR / bc1) * m / (jnp.sqrt(v) / bc2_sqrt + EPS)

    return jax.tree.map(upd, params, m, v), {"step": step, "m": m, "v": v}


def make_jax_step(loss_fn):
    def step(params, opt_state, *batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        params, opt_state = jax_adamw_update(params, grads, opt_state)
        return params, opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))


def to_jax_params(model: nn.Module):
    return {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}


def to_jax_batch(batch):
    out = []
    for t in batch:
        a = t.detach().cpu().numpy()
        out.append(jnp.asarray(a.astype(np.int32) if a.dtype == np.int64 else a))
    return out


# =============================================================================
# Workloads
# =============================================================================


class Workload:
    def __init__(self, name, model, torch_loss, jax_loss, batch):
        self.name = name
        self.model = model  # CPU reference weights
        self.torch_loss = torch_loss  # (model, *batch) -> loss
        self.jax_loss = jax_loss  # (params, *batch) -> loss
        self.batch = batch  # CPU tensors


def mlp_workload():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(64, 256)
    y = torch.randint(0, 16, (64,))
    return Workload("MLP 3×256, GELU, batch 64", model, mlp_loss, jax_mlp_loss, (x, y))


def llama_workload():
    torch.manual_seed(0)
    cfg = LlamaConfig.tiny()
    model = LlamaForCausalLM(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (8, 64))
    return Workload(
        f"Llama tiny (dim {cfg.dim}, {cfg.n_layers} layers, GQA {cfg.n_heads}/{cfg.n_kv_heads}), batch 8×64",
        model,
        lambda m, tok: causal_lm_loss(m(tok), tok),
        make_jax_llama_loss(cfg),
        (tokens,),
    )


def make_torch_step(model, opt, loss_fn):
    def step(*batch):
        opt.zero_grad()
        loss = loss_fn(model, *batch)
        loss.backward()
        opt.step()
        return loss

    return step


# =============================================================================
# Runners. Each returns a dict of measurements.
# =============================================================================


def run_lazy(w: Workload, warmup: int, steps: int, in_step_block: bool = False):
    """Lazy mode, the loop as ``step(); spmdtorch.sync()`` or (``in_step_block``) as the
    README writes it, ``with spmdtorch.step(): step()`` (leaving the block syncs; it
    also pauses Python's cyclic GC while the step records)."""
    model = copy.deepcopy(w.model).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    batch = [t.to("xla") for t in w.batch]
    torch_step = make_torch_step(model, opt, w.torch_loss)
    spmdtorch.wait_device_ops()

    class _Barrier:
        """The step's barrier: ``spmdtorch.sync()`` after the body, or the ``spmdtorch.step()`` block's exit."""

        def __enter__(self):
            self.block = spmdtorch.step() if in_step_block else None
            if self.block is not None:
                self.block.__enter__()

        def __exit__(self, *exc):
            if self.block is not None:
                return self.block.__exit__(*exc)
            spmdtorch.sync()
            return False

    barrier = _Barrier()

    def step(*batch):
        with barrier:
            return torch_step(*batch)

    res = {"losses": []}
    compiles0 = debug.counter_value("UncachedCompile")
    warm_t0 = now()
    for i in range(warmup):
        t0 = now()
        loss = step(*batch)
        res["losses"].append(loss.item())
        if i == 0:
            res["first"] = now() - t0
    res["warmup"] = now() - warm_t0
    res["warmup_compiles"] = debug.counter_value("UncachedCompile") - compiles0

    # Blocking steady state: trace | sync (host) | wait for the result.
    trace, sync_host, total, per_op, ops = [], [], [], [], []
    compiles1 = debug.counter_value("UncachedCompile")
    for _ in range(steps):
        d0 = debug.counter_value("DispatchedOps")
        t0 = now()
        with barrier:
            loss = torch_step(*batch)  # zero_grad ... opt.step()
            t1 = now()
            n = debug.counter_value("DispatchedOps") - d0
        t2 = now()
        res["losses"].append(loss.item())
        t3 = now()
        trace.append(t1 - t0)
        sync_host.append(t2 - t1)
        total.append(t3 - t0)
        ops.append(n)
        per_op.append((t1 - t0) / n)
    res["steady_compiles"] = debug.counter_value("UncachedCompile") - compiles1
    res.update(trace=trace, sync_host=sync_host, blocking=total, per_op=per_op, ops=ops)

    # Throughput: no blocking until the end.
    spmdtorch.wait_device_ops()
    t0 = now()
    for _ in range(steps):
        loss = step(*batch)
    spmdtorch.wait_device_ops()
    res["throughput"] = (now() - t0) / steps
    return res


def run_compiled(w: Workload, warmup: int, steps: int):
    model = copy.deepcopy(w.model).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    batch = [t.to("xla") for t in w.batch]
    step = spmdtorch.compile(make_torch_step(model, opt, w.torch_loss))
    spmdtorch.wait_device_ops()

    res = {"losses": []}
    compiles0 = debug.counter_value("UncachedCompile")
    replays0 = debug.counter_value("CompiledReplay")
    warm_t0 = now()
    n_warm = 0
    # Warm up until the function replays (it is stable), then `warmup` more.
    while True:
        t0 = now()
        loss = step(*batch)
        res["losses"].append(loss.item())
        if n_warm == 0:
            res["first"] = now() - t0
        n_warm += 1
        if debug.counter_value("CompiledReplay") > replays0:
            break
        if n_warm > 20:
            raise RuntimeError("spmdtorch.compile never reached replay in 20 calls")
    res["traces_until_replay"] = n_warm - 1
    res["warmup_until_replay"] = now() - warm_t0
    for _ in range(max(0, warmup - n_warm)):
        res["losses"].append(step(*batch).item())
    res["warmup"] = now() - warm_t0
    res["warmup_compiles"] = debug.counter_value("UncachedCompile") - compiles0
    res["warmup_steps"] = len(res["losses"])

    total = []
    compiles1 = debug.counter_value("UncachedCompile")
    traces1 = debug.counter_value("CompiledTrace")
    for _ in range(steps):
        t0 = now()
        loss = step(*batch)
        res["losses"].append(loss.item())
        total.append(now() - t0)
    res["steady_compiles"] = debug.counter_value("UncachedCompile") - compiles1
    res["steady_traces"] = debug.counter_value("CompiledTrace") - traces1
    res["blocking"] = total

    spmdtorch.wait_device_ops()
    t0 = now()
    for _ in range(steps):
        loss = step(*batch)
    spmdtorch.wait_device_ops()
    res["throughput"] = (now() - t0) / steps
    return res


def run_jax(w: Workload, warmup_steps: int, steps: int, replicated: bool = False):
    params = to_jax_params(w.model)
    opt_state = jax_adamw_init(params)
    batch = to_jax_batch(w.batch)
    if replicated:  # spmdtorch's default placement: replicated over all devices
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("_all",))
        rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        params, opt_state, batch = jax.device_put((params, opt_state, batch), rep)
    step = make_jax_step(w.jax_loss)
    jax.block_until_ready((params, opt_state))

    res = {"losses": [], "initial_loss": float(jax.jit(w.jax_loss)(params, *batch))}
    warm_t0 = now()
    for i in range(warmup_steps):
        t0 = now()
        params, opt_state, loss = step(params, opt_state, *batch)
        res["losses"].append(float(loss))
        if i == 0:
            res["first"] = now() - t0
    res["warmup"] = now() - warm_t0

    total = []
    for _ in range(steps):
        t0 = now()
        params, opt_state, loss = step(params, opt_state, *batch)
        res["losses"].append(float(loss))
        total.append(now() - t0)
    res["blocking"] = total

    jax.block_until_ready(params)
    t0 = now()
    for _ in range(steps):
        params, opt_state, loss = step(params, opt_state, *batch)
    jax.block_until_ready((params, opt_state, loss))
    res["throughput"] = (now() - t0) / steps
    return res


def run_chain(n_ops: int, reps: int, in_step_block: bool = False):
    """``x = x * 1.0001 + 0.5`` repeated: µs per recorded op, and the sync cost
    (``in_step_block``: each repetition inside ``with spmdtorch.step():``)."""
    x0 = torch.ones(16, 16, device="xla")
    spmdtorch.wait_device_ops()
    per_op, sync_host, ops = [], [], []
    for _ in range(reps):
        x = x0
        d0 = debug.counter_value("DispatchedOps")
        block = spmdtorch.step() if in_step_block else contextlib.nullcontext()
        t0 = now()
        with block:
            for _ in range(n_ops // 2):
                x = x * 1.0001 + 0.5
            t1 = now()
            n = debug.counter_value("DispatchedOps") - d0
            if not in_step_block:
                spmdtorch.sync()
        t2 = now()
        x.cpu()
        per_op.append((t1 - t0) / n)
        sync_host.append((t2 - t1) / n)
        ops.append(n)
    skip = 2 if reps > 3 else 1  # the first reps compile
    return {"per_op": per_op[skip:], "sync_per_op": sync_host[skip:], "ops": ops[-1], "reps": reps - skip}


# =============================================================================
# Reporting
# =============================================================================


def machine_info():
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), platform.processor())
    except OSError:
        cpu = platform.processor() or "?"
    return [
        ("date", datetime.date.today().isoformat()),
        ("platform", platform.platform()),
        ("cpu", f"{cpu}, {os.cpu_count()} cores (os.cpu_count)"),
        ("load average", " ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1/5/15 min, at start)"),
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("jax / jaxlib", f"{jax.__version__} / {jax.lib.__version__ if hasattr(jax.lib, '__version__') else '?'}"),
        ("spmdtorch", spmdtorch.__version__),
        (
            "jax devices",
            f"{jax.device_count()} × {jax.devices()[0].platform} "
            f"(XLA_FLAGS={os.environ['XLA_FLAGS']!s}, NPROC={os.environ['NPROC']})",
        ),
    ]


def verdict(ok):
    return "[green]meets[/green]" if ok else "[red]misses[/red]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps (smoke run, < 60 s)")
    args = ap.parse_args(argv)
    warmup = 3
    steps = 4 if args.quick else 20
    chain_ops = 400 if args.quick else 1000
    chain_reps = 3 if args.quick else 7
    t_start = now()

    info = Table(title="Machine", show_header=False)
    for k, v in machine_info():
        info.add_row(k, v)
    console.print(info)
    console.print(
        f"mode: {'--quick' if args.quick else 'full'}; warm-up {warmup} steps, "
        f"{steps} measured steps per mode (blocking) + {steps} (throughput)\n"
    )

    workloads = [mlp_workload(), llama_workload()]
    results = {}
    for w in workloads:
        # Apples to apples: the twin computes the torch model's loss.
        ref = float(w.torch_loss(w.model, *w.batch))
        console.print(f"[bold]{w.name}[/bold]")
        r_jax = run_jax(w, warmup, steps)
        r_jax8 = run_jax(w, warmup, steps, replicated=True)
        r_lazy = run_lazy(w, warmup, steps)
        r_comp = run_compiled(w, warmup, steps)
        init = {
            "torch eager (CPU)": ref,
            "spmdtorch lazy": r_lazy["losses"][0],
            "spmdtorch compiled": r_comp["losses"][0],
            "JAX twin": r_jax["initial_loss"],
        }
        console.print("  initial loss: " + ", ".join(f"{k} {v:.6f}" for k, v in init.items()))
        for k, v in init.items():
            assert abs(v - r_jax["initial_loss"]) < 1e-4, f"{k} initial loss {v} != JAX twin {r_jax['initial_loss']}"
        k = warmup + steps - 1  # every mode read the loss of this step
        later = {
            "lazy": r_lazy["losses"][k],
            "compiled": r_comp["losses"][k],
            "JAX twin": r_jax["losses"][k],
            "JAX twin 8-dev": r_jax8["losses"][k],
        }
        console.print(f"  loss before AdamW step {k + 1}: " + ", ".join(f"{n} {v:.6f}" for n, v in later.items()))
        results[w.name] = {"lazy": r_lazy, "compiled": r_comp, "jax": r_jax, "jax8": r_jax8}
    r_chain = run_chain(chain_ops, chain_reps)

    # The same lazy loops written as the README writes them: `with spmdtorch.step():`
    # (its exit is the barrier; it pauses Python's cyclic GC while the step records).
    for w in workloads:
        results[w.name]["lazy_block"] = run_lazy(w, warmup, steps, in_step_block=True)
    r_chain_block = run_chain(chain_ops, chain_reps, in_step_block=True)
    console.print()

    # -- table 1: tracing cost ---------------------------------------------------
    t1 = Table(title=f"1. Lazy tracing cost per ATen op (target < {TRACE_TARGET_US:.0f} µs/op)")
    for col in (
        "workload",
        "ATen ops / step",
        "trace ms / step",
        "µs / op (median)",
        "µs / op (min)",
        "sync host µs / op",
        "target",
    ):
        t1.add_column(col, justify="left" if col == "workload" else "right")
    for suffix, key, chain in (("", "lazy", r_chain), (" (spmdtorch.step)", "lazy_block", r_chain_block)):
        for name, rs in results.items():
            r_lazy = rs[key]
            us = statistics.median(r_lazy["per_op"]) * 1e6
            n = statistics.median(r_lazy["ops"])
            t1.add_row(
                f"{name.split(' (')[0].split(',')[0]} training step{suffix}",
                f"{n:.0f}",
                f"{median_ms(r_lazy['trace']):.2f}",
                f"{us:.1f}",
                f"{min(r_lazy['per_op']) * 1e6:.1f}",
                f"{statistics.median(r_lazy['sync_host']) / n * 1e6:.1f}",
                verdict(us < TRACE_TARGET_US),
            )
        us = statistics.median(chain["per_op"]) * 1e6
        t1.add_row(
            f"chain x = x*1.0001 + 0.5 (16×16){suffix}",
            f"{chain['ops']}",
            f"{statistics.median(chain['per_op']) * chain['ops'] * 1e3:.2f}",
            f"{us:.1f}",
            f"{min(chain['per_op']) * 1e6:.1f}",
            f"{statistics.median(chain['sync_per_op']) * 1e6:.1f}",
            verdict(us < TRACE_TARGET_US),
        )
    console.print(t1)

    # -- table 2: step time ----------------------------------------------------
    t2 = Table(title=f"2. Host time per training step, steady state (target: compiled ≤ {COMPILED_TARGET}× JAX twin)")
    for col in (
        "model",
        "mode",
        "first step s",
        "warm-up s (steps, compiles)",
        "blocking ms (median)",
        "min ms",
        "× twin",
        "× twin 8-dev",
        "thru-put ms/step",
        "× twin",
        "× twin 8-dev",
        "target (twin / 8-dev)",
    ):
        t2.add_column(col, justify="left" if col in ("model", "mode") else "right")
    for name, rs in results.items():
        r_lazy, r_comp, r_jax, r_jax8 = rs["lazy"], rs["compiled"], rs["jax"], rs["jax8"]
        jb, jt = median_ms(r_jax["blocking"]), r_jax["throughput"] * 1e3
        jb8, jt8 = median_ms(r_jax8["blocking"]), r_jax8["throughput"] * 1e3
        short = name.split(" (")[0].split(",")[0]
        rows = (
            ("lazy", r_lazy),
            ("lazy, spmdtorch.step()", rs["lazy_block"]),
            ("compiled", r_comp),
            ("JAX twin (dev 0)", r_jax),
            ("JAX twin (8-dev repl.)", r_jax8),
        )
        for mode, r in rows:
            b, t = median_ms(r["blocking"]), r["throughput"] * 1e3
            if r is r_comp:
                warm = f"{r['warmup_until_replay']:.2f} ({r['traces_until_replay']} traces, {r['warmup_compiles']})"
            elif r is r_jax or r is r_jax8:
                warm = f"{r['warmup']:.2f} ({warmup}, 1)"
            else:
                warm = f"{r['warmup']:.2f} ({warmup}, {r['warmup_compiles']})"
            target = ""
            if r is r_comp:
                target = f"{verdict(b / jb <= COMPILED_TARGET)} / {verdict(b / jb8 <= COMPILED_TARGET)}"
            t2.add_row(
                short,
                mode,
                f"{r['first']:.2f}",
                warm,
                f"{b:.2f}",
                f"{min(r['blocking']) * 1e3:.2f}",
                f"{b / jb:.2f}",
                f"{b / jb8:.2f}",
                f"{t:.2f}",
                f"{t / jt:.2f}",
                f"{t / jt8:.2f}",
                target,
            )
        t2.add_section()
    console.print(t2)

    # -- lazy breakdown --------------------------------------------------------
    t3 = Table(title="Lazy step breakdown (blocking mode, medians)")
    for col in ("model", "trace ms", "sync() host ms", "wait + .item() ms", "total ms", "recompiles in steady state"):
        t3.add_column(col, justify="left" if col == "model" else "right")
    for name, rs in results.items():
        r_lazy, r_comp = rs["lazy"], rs["compiled"]
        tr, sh, tot = median_ms(r_lazy["trace"]), median_ms(r_lazy["sync_host"]), median_ms(r_lazy["blocking"])
        t3.add_row(
            name.split(" (")[0].split(",")[0],
            f"{tr:.2f}",
            f"{sh:.2f}",
            f"{tot - tr - sh:.2f}",
            f"{tot:.2f}",
            f"lazy {r_lazy['steady_compiles']}, compiled {r_comp['steady_compiles']} "
            f"(+{r_comp['steady_traces']} re-traces)",
        )
    console.print(t3)
    ct = debug.metric_data("CompileTime")
    if ct is not None:
        console.print(
            f"CompileTime metric (spmdtorch, whole run): {ct[0]} compiles, {ct[1]:.2f} s total, max {ct[2]:.2f} s"
        )
    console.print(
        f"UncachedCompile {debug.counter_value('UncachedCompile')}, "
        f"CachedCompile {debug.counter_value('CachedCompile')}, "
        f"DispatchedOps {debug.counter_value('DispatchedOps')}"
    )
    console.print(f"total benchmark wall time: {now() - t_start:.1f} s")


if __name__ == "__main__":
    main()
