"""A decoder-only language model trained with FSDPv2, written as PyTorch/XLA's SPMD guides write it.

Nothing here imports spmdtorch: run it unchanged under the compatibility layer,

    python -m spmdtorch.compat examples/torch_xla_style/train_fsdpv2_decoder.py --steps 10

(or with PyTorch/XLA itself: ``PJRT_DEVICE=TPU python train_fsdpv2_decoder.py``).
Each decoder layer is wrapped by FSDPv2 with activation checkpointing
(``auto_wrap_policy`` + ``auto_wrapper_callable``); the batch is sharded over the
``fsdp`` mesh axis by ``MpDeviceLoader``; ``shard_output`` shards the logits.
"""

import argparse
import dataclasses
import functools

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch_xla.distributed.fsdp import checkpoint_module
from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

xr.use_spmd()


@dataclasses.dataclass
class ModelOutput:
    logits: torch.Tensor


class DecoderLayer(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.pos = nn.Parameter(torch.randn(seq, dim) * 0.02)
        self.layers = nn.ModuleList([DecoderLayer(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, tokens):
        h = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h)
        # Output head tied to the embedding (GPT-2 style).
        return ModelOutput(logits=self.norm(h) @ self.embed.weight.t())


def shard_output(output, mesh):
    # FSDPv2 passes shard_output to the wrapped layers too (their output is a tensor), as Hugging Face's does.
    real_output = output.logits if isinstance(output, ModelOutput) else output
    xs.mark_sharding(real_output, mesh, ("fsdp", None, None))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    torch.manual_seed(0)
    num_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(num_devices)), (num_devices, 1), ("fsdp", "model"))
    device = xm.xla_device()

    model = Decoder(args.vocab, args.dim, 4, args.layers, args.seq).to(device)
    auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(
        model,
        mesh,
        shard_output,
        auto_wrap_policy=auto_wrap_policy,
        auto_wrapper_callable=lambda m, *a, **kw: FSDPv2(checkpoint_module(m), *a, **kw),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    # A fixed synthetic corpus: the model can learn it, so the loss must fall.
    data = torch.randint(0, args.vocab, (args.batch_size * 4, args.seq + 1))
    dataset = torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:])
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, drop_last=True)
    device_loader = pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ("fsdp", None)))

    losses = []

    def log(step, loss):
        losses.append(loss.item())
        xm.master_print(f"step {step} loss {losses[-1]:.4f}")

    step = 0
    while step < args.steps:
        for tokens, targets in device_loader:
            optimizer.zero_grad()
            logits = model(tokens).logits
            loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
            loss.backward()
            optimizer.step()
            xm.add_step_closure(log, args=(step, loss))
            step += 1
            if step >= args.steps:
                break
    xm.mark_step()
    xm.wait_device_ops()
    print(f"weight sharding: {torch_xla._XLAC._get_xla_sharding_spec(model.module.embed.weight)}")
    print(f"first -> last loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(met.short_metrics_report())


if __name__ == "__main__":
    main()
