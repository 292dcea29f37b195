"""Fine-tune a pretrained Hugging Face model, FSDPv2-sharded, and save it back in its own format.

The pretrained model is a Hugging Face model directory (``config.json``,
``model.safetensors.index.json`` and safetensors shards), as ``save_pretrained``
writes and the Hub serves. Without ``--pretrained`` the script makes one: a
tiny random Llama saved locally with ``save_pretrained(max_shard_size=...)``
(nothing is downloaded). Then:

1. the model is built on ``meta`` from the directory's ``config.json``: no
   weights exist anywhere yet;
2. ``spmdtorch.checkpoint.load_pretrained`` reads the shards one file at a
   time and builds every parameter straight into FSDPv2's sharding (each
   device reads only its block), so neither the host nor any device ever holds
   the whole model;
3. ``FSDPv2`` (one wrapper per decoder layer) keeps those shardings and
   shards the activations; a few AdamW steps run, each one XLA program;
4. ``spmdtorch.checkpoint.save_pretrained`` writes the fine-tuned weights
   back in the same layout (same names, same ``max_shard_size``, so the same
   shard files), and transformers' ``from_pretrained`` reloads them: the
   script checks that the reloaded CPU model holds exactly the trained
   values and gives the same logits, and that eager CPU PyTorch fine-tuned
   from the same directory on the same batches has the same losses.

On a CPU-only machine it simulates 8 CPU devices (as ``train_llama.py``).

Usage:
    python examples/finetune_hf.py                         # make a tiny pretrained dir, 8 steps, save
    python examples/finetune_hf.py --pretrained PATH --out PATH --steps 20
    python examples/finetune_hf.py --layers 4 --hidden 128 --max-shard-size 200KB
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 examples/finetune_hf.py   # one job, 2 processes
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time

# Importing spmdtorch joins the job when a launcher started this process as one of several.
from spmdtorch import runtime
from spmdtorch.runtime.cpu_devices import requested_cpu_devices, simulate_cpu_devices

DEFAULT_CPU_DEVICES = 8


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--pretrained", default=None, help="a save_pretrained directory (default: make a tiny one)")
    p.add_argument("--out", default=None, help="where to save the fine-tuned model (default: a temp dir)")
    p.add_argument(
        "--max-shard-size",
        default="100KB",
        help="max_shard_size of the pretrained directory (made with it without --pretrained), used to save back",
    )
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the model made without --pretrained")
    p.add_argument("--hidden", type=int, default=64, help="hidden size of the model made without --pretrained")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary of the model made without --pretrained")
    p.add_argument("--steps", type=int, default=8, help="training steps")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=32, help="tokens per sequence")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed for the made model and the data")
    p.add_argument(
        "--cpu-devices",
        type=int,
        default=None,
        help=f"simulated CPU devices of a single-process run on CPU (default {DEFAULT_CPU_DEVICES}); a "
        "multi-process job's come from its launcher (--devices-per-proc, or SPMDTORCH_CPU_DEVICES under torchrun)",
    )
    return p.parse_args(argv)


def configure_cpu_devices(requested) -> None:
    """Ask XLA for N simulated CPU devices before JAX starts (kept when XLA_FLAGS already sets a count).

    Without ``--cpu-devices`` it does nothing in a multi-process job or when
    ``SPMDTORCH_CPU_DEVICES`` is set: joining the job (``import spmdtorch``)
    already fixed the device count.
    """
    if requested is None and (runtime.is_distributed_initialized() or requested_cpu_devices()):
        return
    existing = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    n = int(existing.group(1)) if existing and requested is None else (requested or DEFAULT_CPU_DEVICES)
    simulate_cpu_devices(n, unless_accelerator=True)


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:
    configure_cpu_devices(ARGS.cpu_devices)

# Only now may JAX start.
import functools
import json

import numpy as np
import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.mesh import Mesh
from spmdtorch.partition import FSDPv2, get_sharding_spec, mark_sharding, transformer_auto_wrap_policy


def make_pretrained(directory: str, args: argparse.Namespace) -> None:
    """Stand-in for a downloaded checkpoint: a tiny random Llama, saved by transformers itself."""
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    torch.manual_seed(args.seed)
    LlamaForCausalLM(config).save_pretrained(directory, max_shard_size=args.max_shard_size)


def batches(vocab: int, batch_size: int, seq_len: int, seed: int):
    """A learnable stream: each sequence follows a fixed random permutation of the vocabulary."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    while True:
        tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, vocab, (batch_size,), generator=g)
        for t in range(1, seq_len):
            tokens[:, t] = perm[tokens[:, t - 1]]
        yield tokens


def shard_batch(output, mesh) -> None:
    """FSDPv2's output rule for every wrapper: the activation (a layer's tensor, the root's logits) on dim 0.

    The root returns a ``CausalLMOutputWithPast``, which FSDPv2's default rule
    (a tensor, or element 0 of a tuple) does not know.
    """
    t = output if isinstance(output, torch.Tensor) else output.logits
    mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))


def main(args: argparse.Namespace) -> int:
    console = Console()
    spmdtorch.runtime.initialize_distributed()
    n_dev = runtime.global_runtime_device_count()  # every process's: the mesh spans the whole job
    mesh = Mesh(np.arange(n_dev), (n_dev,), ("fsdp",))
    console.print(f"[bold]devices:[/] {n_dev} x {spmdtorch.runtime.device_type()}  [bold]mesh:[/] fsdp={n_dev}")

    # The processes of a job share process 0's directories (one machine, or a shared file system):
    # process 0 makes the pretrained directory and save_pretrained writes from process 0 only.
    first = runtime.process_index() == 0
    work = runtime.rendezvous("finetune_hf.work", tempfile.mkdtemp(prefix="finetune_hf-").encode() if first else b"")
    work = work[0].decode()
    src = args.pretrained or os.path.join(work, "pretrained")
    if args.pretrained is None and first:
        make_pretrained(src, args)
    runtime.rendezvous("finetune_hf.pretrained")  # the others read it once it is written
    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    console.print(f"[bold]pretrained:[/] {src} ({len(files)} shard file(s))")

    # 1. The model on meta: shapes only.
    config = AutoConfig.from_pretrained(src)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)

    # 2. Straight into FSDPv2's sharding, one shard file at a time.
    t0 = time.perf_counter()
    report = checkpoint.load_pretrained(src, model, mesh, "fsdp")
    load_s = time.perf_counter() - t0
    console.print(f"[bold]loaded[/] in {load_s:.2f} s; initialised (not in the checkpoint): {list(report.initialized)}")

    # 3. FSDPv2 keeps the loaded shardings (already "fsdp" on the largest dim) and shards activations.
    layer_cls = type(model.model.layers[0])
    wrapped = FSDPv2(
        model,
        mesh=mesh,
        shard_output=shard_batch,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer_cls}),
    )
    emb = model.get_input_embeddings().weight
    console.print(f"[bold]embedding[/] {tuple(emb.shape)} sharding {get_sharding_spec(emb)}")
    optimizer = torch.optim.AdamW(wrapped.parameters(), lr=args.lr, weight_decay=0.0)
    data = batches(config.vocab_size, args.batch_size, args.seq_len, args.seed)

    def train_step(tokens):
        optimizer.zero_grad()
        loss = wrapped(input_ids=tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        return loss

    losses = []
    for i in range(args.steps):
        tokens = mark_sharding(next(data).to("xla"), mesh, ("fsdp", None))
        with spmdtorch.step():
            loss = train_step(tokens)
        losses.append(loss.item())
        console.print(f"step {i:3d}  loss {losses[-1]:.4f}")

    # 4. Save back in the pretrained layout. Wrapped layers add "_orig_module." to the names.
    out = args.out or os.path.join(work, "finetuned")
    layout = checkpoint.save_pretrained(
        model, out, max_shard_size=args.max_shard_size, rename=lambda name: name.replace("_orig_module.", "")
    )
    runtime.rendezvous("finetune_hf.saved")  # the others reload it once process 0 wrote it
    same_files = sorted(layout.files) == files
    index = "model.safetensors.index.json"
    same_map = layout.indexed == os.path.isfile(os.path.join(src, index))
    if same_map and layout.indexed:
        with open(os.path.join(src, index)) as f, open(os.path.join(out, index)) as g:
            same_map = json.load(f)["weight_map"] == json.load(g)["weight_map"]

    # transformers reloads it on the CPU: the trained values exactly, and the same logits.
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    trained = {k.replace("_orig_module.", ""): v for k, v in model.state_dict().items()}
    max_diff = max((trained[k].cpu() - v).abs().max().item() for k, v in reloaded.state_dict().items())
    probe = next(data)
    logits_diff = (wrapped(input_ids=probe.to("xla")).logits.cpu() - reloaded(input_ids=probe).logits).abs().max()

    # The same fine-tuning in eager CPU PyTorch, from the same pretrained directory and batches.
    eager = AutoModelForCausalLM.from_pretrained(src)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=args.lr, weight_decay=0.0)
    eager_data = batches(config.vocab_size, args.batch_size, args.seq_len, args.seed)
    eager_losses = []
    for _ in range(args.steps):
        tokens = next(eager_data)
        eager_opt.zero_grad()
        loss = eager(input_ids=tokens, labels=tokens).loss
        loss.backward()
        eager_opt.step()
        eager_losses.append(loss.item())
    eager_diff = max(abs(a - b) for a, b in zip(losses, eager_losses))

    summary = Table(title="Summary", show_header=False)
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("first -> last loss", f"{losses[0]:.4f} -> {losses[-1]:.4f} ({losses[-1] - losses[0]:+.4f})")
    summary.add_row("eager CPU max |loss diff|", f"{eager_diff:.3g}")
    summary.add_row("saved to", out)
    summary.add_row("shard files", f"{len(layout.files)} (same as pretrained: {same_files and same_map})")
    summary.add_row("reloaded max |param diff|", f"{max_diff:.3g}")
    summary.add_row("reloaded max |logit diff|", f"{logits_diff.item():.3g}")
    console.print(summary)
    ok = (
        losses[-1] < losses[0]
        and eager_diff < 1e-3
        and max_diff == 0.0
        and logits_diff.item() < 1e-4
        and same_files
        and same_map
    )
    if not ok:
        console.print(
            "[bold red]FAILED[/]: the loss did not drop, differs from eager, or the saved model does not "
            "reload as trained"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(ARGS))
