"""Generate text with a Hugging Face Llama sharded tensor-parallel over every device.

A transformers ``LlamaForCausalLM`` (a small random config, so nothing is
downloaded; any causal LM with full causal attention works the same way) is
moved to ``"xla"`` and sharded Megatron-style by ``plan_sharding(model, mesh,
"tp")``: q/k/v and the MLP's gate/up projections split by output features
(attention heads), o_proj and down_proj by input features, the vocabulary
split across devices. The KV cache is split by heads too
(``cache_sharding``). GSPMD inserts the all-reduces.

The decode loop is ``spmdtorch.models.generate`` (transformers' ``generate``
with ``custom_generate=spmdtorch.models.static_decode``): the prompt is
left-padded to a power-of-two bucket, the KV cache is transformers'
``StaticCache`` of a bucketed length, and every decode step has the same
shapes (tokens and mask are written by index at the cache position), so the
whole generation is one prefill and one decode program, whatever the number
of new tokens; the decode step runs under ``spmdtorch.compile`` (``--mode
compiled``, replayed without Python) or lazily (``--mode lazy``).

The script generates once to compile (warm-up), then again to time it, and
reports decode tokens/s, the programs compiled, and (``--check``, the
default) whether the tokens equal transformers' eager CPU ``generate`` (greedy)
or lie in eager's top-k (``--sample``). It exits non-zero if they do not.

Usage:
    python examples/generate.py                        # 8 simulated CPU devices, tp=8, greedy
    python examples/generate.py --sample --top-k 8     # sampled
    python examples/generate.py --mode lazy --new-tokens 64
    PJRT_DEVICE=TPU python examples/generate.py --hidden 1024 --layers 8
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 examples/generate.py   # one job, 2 processes

Needs transformers (``pip install -e '.[test]'``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

# Importing spmdtorch joins the job when a launcher started this process as one of several.
from spmdtorch import runtime
from spmdtorch.runtime.cpu_devices import requested_cpu_devices, simulate_cpu_devices

DEFAULT_CPU_DEVICES = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--hidden", type=int, default=128, help="hidden size (heads = hidden / head-dim)")
    p.add_argument("--head-dim", type=int, default=16, help="dimension of one attention head")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size")
    p.add_argument("--batch-size", type=int, default=2, help="prompts generated together")
    p.add_argument("--prompt-len", type=int, default=12, help="prompt tokens")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens to generate")
    p.add_argument("--mode", choices=("compiled", "lazy"), default="compiled", help="decode step mode")
    p.add_argument("--sample", action="store_true", help="sample (top-k) instead of greedy decoding")
    p.add_argument("--top-k", type=int, default=8, help="top-k when sampling")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the eager CPU comparison")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, prompts and samples")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help=f"simulated CPU devices of a single-process run on CPU (default {DEFAULT_CPU_DEVICES}); a "
        "multi-process job's come from its launcher (--devices-per-proc, or SPMDTORCH_CPU_DEVICES under torchrun)",
    )
    args = p.parse_args(argv)
    if args.hidden % args.head_dim:
        p.error(f"--hidden {args.hidden} is not a multiple of --head-dim {args.head_dim}")
    for name in ("layers", "batch_size", "prompt_len", "new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    return args


ARGS = parse_args() if __name__ == "__main__" else None
# A multi-process job's device count was fixed when importing spmdtorch joined it.
if ARGS is not None and (
    ARGS.cpu_devices is not None or not (runtime.is_distributed_initialized() or requested_cpu_devices())
):
    existing = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    n_cpu = ARGS.cpu_devices or (int(existing.group(1)) if existing else DEFAULT_CPU_DEVICES)
    simulate_cpu_devices(n_cpu, unless_accelerator=True)

# Only now may JAX start.
import numpy as np
import torch
import transformers

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.models import generate, last_generation_stats
from spmdtorch.partition import get_sharding_spec, mark_sharding, plan_sharding


def build_model(args) -> transformers.LlamaForCausalLM:
    heads = args.hidden // args.head_dim
    cfg = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=args.head_dim,
        max_position_embeddings=4096,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,  # generate exactly --new-tokens
    )
    torch.manual_seed(args.seed)
    return transformers.LlamaForCausalLM(cfg).eval()


def check_sampled(cpu_model, out, prompt_len, top_k) -> bool:
    """Every sampled token is among eager's top-k for its prefix (teacher-forced on the output)."""
    with torch.no_grad():
        logits = cpu_model(input_ids=out).logits
    top = logits[:, prompt_len - 1 : -1].topk(top_k, dim=-1).indices
    return bool((top == out[:, prompt_len:, None]).any(-1).all())


def main(args) -> int:
    n = runtime.global_runtime_device_count()  # every process's: the mesh spans the whole job
    platform = spmdtorch.runtime.device_type()
    print(f"devices: {n} x {platform}")
    mesh = Mesh(np.arange(n), (n,), ("tp",))
    print(f"mesh: tp={n}")

    cpu_model = build_model(args)
    model = build_model(args)
    model.load_state_dict(cpu_model.state_dict())
    model = model.to("xla")
    rules = plan_sharding(model, mesh, "tp").rules
    mark_sharding(model, mesh, rules)  # heads, MLP features and vocabulary over "tp"
    for name in ("self_attn.q_proj.weight", "self_attn.o_proj.weight", "mlp.down_proj.weight"):
        print(f"{name}: {get_sharding_spec(model.get_parameter('model.layers.0.' + name))}")

    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(1, args.vocab, (args.batch_size, args.prompt_len), generator=g)
    kw = dict(
        max_new_tokens=args.new_tokens,
        do_sample=args.sample,
        top_k=args.top_k if args.sample else None,
        compiled=args.mode == "compiled",
        cache_sharding=(mesh, (None, "tp", None, None)),  # (batch, kv_heads, length, head_dim)
    )

    compiles0 = debug.counter_value("UncachedCompile")
    t0 = time.perf_counter()
    generate(model, ids.to("xla"), **kw)  # warm-up: compiles the prefill and the decode step
    warm_s = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    out = generate(model, ids.to("xla"), **kw).cpu()
    total_s = time.perf_counter() - t0
    stats = last_generation_stats()
    compiles = debug.counter_value("UncachedCompile") - compiles0
    assert stats is not None
    per_seq = stats.tokens_per_s
    print(
        f"prompt: {args.batch_size} x {args.prompt_len} tokens (bucket {stats.prompt_bucket}), cache {stats.cache_length}"
    )
    print(f"warm-up generate (compiles): {warm_s:.2f} s")
    print(f"generate: {stats.new_tokens} new tokens in {total_s:.3f} s (prefill {stats.prefill_s * 1e3:.1f} ms)")
    print(f"decode tokens/s: {per_seq:.1f} per sequence, {per_seq * args.batch_size:.1f} total")
    print(f"compiles: {compiles} (UncachedCompile, both generations)")
    print(f"sample tokens: {out[0, args.prompt_len :].tolist()}")

    ok = True
    if args.check:
        t0 = time.perf_counter()
        if args.sample:
            ok = check_sampled(cpu_model, out, args.prompt_len, args.top_k)
            label = f"sampled tokens in eager CPU top-{args.top_k}"
        else:
            ref = cpu_model.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
            ok = torch.equal(out, ref)
            label = "tokens equal eager CPU"
        eager_s = time.perf_counter() - t0
        if not args.sample:
            print(f"eager CPU generate (transformers' loop, dynamic cache): {eager_s:.3f} s")
        print(f"{'OK' if ok else 'FAIL'}: {label}")
    if compiles > 3:
        print(f"FAIL: {compiles} programs compiled (want <= 3)")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
