"""The structure of the compiled FSDPv2 program: what the partitioner gathers.

``jax.grad`` of ``x @ W.T`` reads the same ``W.T`` in the forward and the
backward product, so XLA's SPMD partitioner all-gathers a sharded weight once
per step. torch's autograd re-derives ``t(t(W))`` from the weight's storage;
unless the recorded graph reads the forward's transpose again (see
``spmdtorch.lazy.rewrite``), every weight is gathered twice. Pinned here by
counting the all-gathers in the optimized, partitioned HLO (deterministic,
unlike a timing).
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import re

import numpy as np
import torch

import spmdtorch
from spmdtorch.fsdp import plain_state_dict, transformer_auto_wrap_policy
from spmdtorch.mesh import Mesh
from spmdtorch.models.llama import (
    DecoderLayer,
    LlamaConfig,
    LlamaForCausalLM,
    causal_lm_loss,
)
from spmdtorch.partition import FSDPv2, mark_sharding


def _all_gathers_by_rank(hlo: str) -> collections.Counter:
    """How many all-gathers the program has, by the rank of what they gather."""
    dims = re.findall(r"= \w+\[([\d,]*)\]\S* all-gather(?:-start)?\(", hlo)
    return collections.Counter(len(d.split(",")) if d else 0 for d in dims)


def test_decoder_step_gathers_each_weight_once(devices8):
    # One decoder layer (ffn_dim a multiple of 8: the sharded dims are even).
    cfg = dataclasses.replace(
        LlamaConfig.tiny(), n_layers=1, dim=32, n_heads=4, n_kv_heads=2, ffn_dim=64, vocab_size=64
    )
    torch.manual_seed(0)
    ref = LlamaForCausalLM(cfg)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=policy)
    tokens = torch.randint(0, cfg.vocab_size, (8, 16), generator=torch.Generator().manual_seed(1))

    @spmdtorch.compile
    def loss_and_grads(tok):
        model.zero_grad()
        loss = causal_lm_loss(model(tok), tok)
        loss.backward()
        return loss

    loss = loss_and_grads(mark_sharding(tokens.to("xla"), mesh, ("fsdp", None)))

    hlo = loss_and_grads.executable().as_text()
    gathers = _all_gathers_by_rank(hlo)
    matrices = [p for p in model.parameters() if p.dim() == 2]  # 7 linear weights, embedding, output head
    # Each matrix is gathered once, for its forward and backward products alike (the
    # forward alone needs each of them once); before the rewrites it was 2 per linear weight.
    assert gathers[2] == len(matrices), (gathers, len(matrices))
    # And the values are torch's.
    ref_loss = causal_lm_loss(ref(tokens), tokens)
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    got = plain_state_dict(model, keep_vars=True)
    for name, p_ref in ref.named_parameters():
        torch.testing.assert_close(
            got[name].grad.cpu(), p_ref.grad, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}.grad: {m}"
        )
