"""Generation benchmark: tokens/s and programs compiled, spmdtorch against eager CPU and a pure-JAX twin.

Run:

    python benchmarks/generate.py             # 32 and 128 new tokens, 3 repetitions
    python benchmarks/generate.py --quick     # 16 new tokens, 1 repetition (smoke run)

One process, 8 simulated CPU devices. A transformers ``LlamaForCausalLM``
(random small config: 2 layers, hidden 128, 8 heads of 16, vocabulary 256)
generates greedily from a batch of 2 prompts of 12 tokens, as

* ``eager CPU``: transformers' own ``generate`` on CPU torch (dynamic cache);
* ``xla, HF loop``: transformers' own ``generate(cache_implementation="static")``
  on "xla" (the loop ``torch.cat``s its token and mask tensors every step: one
  compile per token; run at the smallest token count only);
* ``xla, static_decode lazy`` / ``compiled``: ``spmdtorch.models.generate``
  with the decode step recorded lazily each token, or under
  ``spmdtorch.compile`` (replayed without Python);
* ``JAX twin``: the same weights in a hand-written JAX Llama with a static KV
  cache, one ``jax.jit`` prefill and one ``jax.jit`` decode step (donated
  cache), dispatched from a Python loop — the floor for a Python-driven loop;

each replicated on the 8 devices (spmdtorch's placement of unannotated
tensors; the twin's weights as replicated ``NamedSharding``s) and with
tensor-parallel heads over 8 (``tp=8``: the HF model sharded by
``plan_sharding(model, mesh, "tp")``, the twin's weights by the same rules). Every row's tokens are checked equal to
eager CPU's. ``tokens/s`` = batch x new tokens / wall time of one whole
generate call (prefill included), after a warm-up call, median of the
repetitions; ``compiles`` = programs compiled over the warm-up and timed calls
(spmdtorch's ``UncachedCompile``; the twin's jit cache misses). The simulated
devices share this machine's cores, so ``tp=8`` rows measure overhead, not
speed-up.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

simulate_cpu_devices(8, unless_accelerator=True)  # before anything queries devices

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console
from rich.table import Table

from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.models import bucket_length, generate
from spmdtorch.partition import mark_sharding, plan_sharding

BATCH, PROMPT, VOCAB, HIDDEN, HEAD_DIM, LAYERS = 2, 12, 256, 128, 16, 2
HEADS = HIDDEN // HEAD_DIM


def build_model() -> transformers.LlamaForCausalLM:
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


# --------------------------------------------------------------------------
# The pure-JAX twin: transformers' Llama (RMSNorm, rotary embeddings with
# rotate_half, SwiGLU), a static KV cache written at the step's position.


def twin_params(model, mesh, tp: bool) -> dict:
    """The weights on every device of ``mesh``: replicated (as spmdtorch places unannotated tensors), or
    split by the same rules as ``plan_sharding(model, mesh, "tp")``."""
    sd = {k: jnp.asarray(v.detach().numpy()) for k, v in model.state_dict().items()}
    col, row = ("tp", None), (None, "tp")
    rules = {"q_proj": col, "k_proj": col, "v_proj": col, "gate_proj": col, "up_proj": col}
    rules |= {"o_proj": row, "down_proj": row, "embed_tokens": col, "lm_head": col}
    out = {}
    for k, v in sd.items():
        spec = next((s for name, s in rules.items() if f"{name}." in k), ()) if tp else ()
        out[k] = jax.device_put(v, NamedSharding(mesh.jax_mesh, P(*spec)))
    return out


def _rms(x, w, eps=1e-6):
    x32 = x.astype(jnp.float32)
    return w * (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + eps))


def _rope(x, pos, theta=10000.0):
    inv = 1.0 / (theta ** (jnp.arange(0, HEAD_DIM, 2, dtype=jnp.float32) / HEAD_DIM))
    ang = pos[..., None].astype(jnp.float32) * inv  # (b, s, d/2)
    emb = jnp.concatenate([ang, ang], -1)[:, None]  # (b, 1, s, d)
    half = HEAD_DIM // 2
    rot = jnp.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * jnp.cos(emb) + rot * jnp.sin(emb)


def twin_forward(p, cache, tokens, pos, slot, mask2d):
    """Logits of the last position; writes K/V at cache slots ``slot .. slot + s``."""
    b, s = tokens.shape
    h = p["model.embed_tokens.weight"][tokens]
    kv_len = mask2d.shape[1]
    q_idx = slot + jnp.arange(s)
    allowed = (jnp.arange(kv_len)[None, :] <= q_idx[:, None])[None, None] & mask2d[:, None, None, :]
    new_cache = []
    for i in range(LAYERS):
        pre = f"model.layers.{i}."
        x = _rms(h, p[pre + "input_layernorm.weight"])

        def proj(name, x=x, pre=pre):
            return (x @ p[pre + f"self_attn.{name}.weight"].T).reshape(b, s, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)

        q, k, v = _rope(proj("q_proj"), pos), _rope(proj("k_proj"), pos), proj("v_proj")
        ck, cv = cache[i]
        ck = jax.lax.dynamic_update_slice(ck, k, (0, 0, slot, 0))
        cv = jax.lax.dynamic_update_slice(cv, v, (0, 0, slot, 0))
        new_cache.append((ck, cv))
        att = (q @ ck.transpose(0, 1, 3, 2)) / np.sqrt(HEAD_DIM)
        att = jax.nn.softmax(jnp.where(allowed, att, jnp.finfo(att.dtype).min), -1)
        o = (att @ cv).transpose(0, 2, 1, 3).reshape(b, s, HIDDEN)
        h = h + o @ p[pre + "self_attn.o_proj.weight"].T
        x = _rms(h, p[pre + "post_attention_layernorm.weight"])
        g = jax.nn.silu(x @ p[pre + "mlp.gate_proj.weight"].T) * (x @ p[pre + "mlp.up_proj.weight"].T)
        h = h + g @ p[pre + "mlp.down_proj.weight"].T
    h = _rms(h[:, -1], p["model.norm.weight"])
    return h @ p["lm_head.weight"].T, new_cache


@functools.partial(jax.jit, donate_argnums=(1,))
def twin_prefill(p, cache, tokens, pos, mask2d):
    logits, cache = twin_forward(p, cache, tokens, pos, 0, mask2d)
    return jnp.argmax(logits, -1), cache


@functools.partial(jax.jit, donate_argnums=(1, 4))
def twin_step(p, cache, cur, pos, mask2d, slot):
    mask2d = mask2d.at[:, slot].set(True)
    logits, cache = twin_forward(p, cache, cur[:, None], pos[:, None], slot, mask2d)
    return jnp.argmax(logits, -1), cache, mask2d


def twin_generate(p, ids: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy generation with the same bucketing as static_decode (prompt 16, cache a power of two)."""
    b, n = ids.shape
    pb = bucket_length(n, 16)
    cache_len = bucket_length(pb + new_tokens, 32)
    tokens = np.zeros((b, pb), np.int32)
    tokens[:, pb - n :] = ids
    mask = np.zeros((b, cache_len), bool)
    mask[:, pb - n : pb] = True
    pos = np.maximum(np.cumsum(mask[:, :pb], -1) - 1, 0)
    shape = (b, HEADS, cache_len, HEAD_DIM)
    cache = [(jnp.zeros(shape), jnp.zeros(shape)) for _ in range(LAYERS)]  # distinct buffers: donated
    mask_d = jnp.asarray(mask)
    cur, cache = twin_prefill(p, cache, jnp.asarray(tokens), jnp.asarray(pos), mask_d)
    mask_d = mask_d.at[:, pb].set(True)
    out = [cur]
    next_pos = jnp.asarray(np.full((b,), n, np.int32))
    for k in range(1, new_tokens):
        cur, cache, mask_d = twin_step(p, cache, cur, next_pos, mask_d, jnp.int32(pb + k - 1))
        next_pos = next_pos + 1
        out.append(cur)
    return np.concatenate([ids, np.stack([np.asarray(t) for t in out], 1)], 1)


def _twin_cache_size() -> int:
    return twin_prefill._cache_size() + twin_step._cache_size()


# --------------------------------------------------------------------------


def _timed(fn, reps: int) -> tuple[float, object]:
    fn()  # warm-up (compiles)
    times, out = [], None
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 new tokens, 1 repetition")
    parser.add_argument("--reps", type=int, default=None)
    args = parser.parse_args()
    token_counts = [16] if args.quick else [32, 128]
    reps = args.reps or (1 if args.quick else 3)

    console = Console(width=160)
    cpu_model = build_model()
    ids = torch.randint(1, VOCAB, (BATCH, PROMPT), generator=torch.Generator().manual_seed(0))
    mesh = Mesh(np.arange(8), (8,), ("tp",))
    table = Table(title=f"greedy generation, Llama {LAYERS}x{HIDDEN}, batch {BATCH}, prompt {PROMPT}")
    for col in ("new tokens", "devices", "loop", "tokens/s", "s / generate", "compiles", "= eager"):
        table.add_column(col, justify="right" if col not in ("loop", "devices") else "left")

    failures = 0
    for n in token_counts:
        ref_s, ref = _timed(lambda n=n: cpu_model.generate(ids, max_new_tokens=n, do_sample=False), reps)
        table.add_row(str(n), "CPU", "eager CPU (transformers)", f"{BATCH * n / ref_s:.1f}", f"{ref_s:.3f}", "-", "-")
        for tp in (False, True):
            devices = "tp=8" if tp else "8, replicated"
            model = build_model()
            model.load_state_dict(cpu_model.state_dict())
            model = model.to("xla")
            kw: dict = {}
            if tp:
                mark_sharding(model, mesh, plan_sharding(model, mesh, "tp").rules)
                kw["cache_sharding"] = (mesh, (None, "tp", None, None))
            loops = []
            if n == token_counts[0] and not tp:
                loops.append(
                    (
                        "xla, HF loop (static cache)",
                        lambda n=n, model=model: model.generate(
                            ids.to("xla"), max_new_tokens=n, do_sample=False, cache_implementation="static"
                        ).cpu(),
                    )
                )
            for mode in ("lazy", "compiled"):
                loops.append(
                    (
                        f"xla, static_decode {mode}",
                        lambda n=n, model=model, mode=mode, kw=kw: generate(
                            model, ids.to("xla"), max_new_tokens=n, compiled=mode == "compiled", **kw
                        ).cpu(),
                    )
                )
            for name, fn in loops:
                debug.clear_caches()
                c0 = debug.counter_value("UncachedCompile")
                s, out = _timed(fn, reps)
                ok = torch.equal(out, ref)
                failures += not ok
                compiles = debug.counter_value("UncachedCompile") - c0
                table.add_row(str(n), devices, name, f"{BATCH * n / s:.1f}", f"{s:.3f}", str(compiles), str(ok))
            params = twin_params(cpu_model, mesh, tp)
            c0 = _twin_cache_size()
            s, out = _timed(lambda n=n, params=params: twin_generate(params, ids.numpy(), n), reps)
            ok = np.array_equal(out, ref.numpy())
            failures += not ok
            compiles = _twin_cache_size() - c0
            table.add_row(
                str(n),
                devices,
                "JAX twin (jit prefill + step)",
                f"{BATCH * n / s:.1f}",
                f"{s:.3f}",
                str(compiles),
                str(ok),
            )
            console.print(table)  # progress: the table so far
    console.print(table)
    if failures:
        sys.exit(f"{failures} rows gave tokens other than eager CPU's")


if __name__ == "__main__":
    main()
