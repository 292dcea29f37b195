"""``plan_sharding``: rules from module structure, that train like eager and cost what they say.

* On ``LlamaForCausalLM(LlamaConfig.tiny())`` the planner finds Megatron's
  pairs (attention q/k/v column, o row; feed-forward w1/w3 column, w2 row),
  the vocabulary split of the embedding and the output head, and FSDP on
  the other dim; the same holds for a renamed copy (structure, not names).
* Those rules on a (2, 4) ("fsdp", "tp") mesh train three AdamW steps inside
  ``spmdtorch.compile`` with eager CPU's losses, and the plan's per-device
  parameter + optimizer bytes are within 10% of the arguments of the compiled
  step (XLA's memory analysis).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn
from training_helpers import train_eager

import spmdtorch
from spmdtorch.mesh import Mesh
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM, causal_lm_loss
from spmdtorch.partition import (
    PlanError,
    ShardingPlan,
    compiled_memory,
    mark_sharding,
    plan_sharding,
)

STEPS = 3


def llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig.tiny())


@pytest.fixture(scope="module")
def mesh(devices8):
    return Mesh(np.arange(8), (2, 4), ("fsdp", "tp"))


def test_llama_fsdp_tp_rules(mesh):
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig.tiny())
    plan = plan_sharding(model, mesh, "fsdp+tp")
    assert isinstance(plan, ShardingPlan)
    assert dict(plan.rules) == {
        "tok_embeddings.weight": ("tp", "fsdp"),
        "layers.*.attention_norm.weight": ("fsdp",),
        "layers.*.attention.wq.weight": ("tp", "fsdp"),
        "layers.*.attention.wk.weight": ("tp", "fsdp"),
        "layers.*.attention.wv.weight": ("tp", "fsdp"),
        "layers.*.attention.wo.weight": ("fsdp", "tp"),
        "layers.*.ffn_norm.weight": ("fsdp",),
        "layers.*.feed_forward.w1.weight": ("tp", "fsdp"),
        "layers.*.feed_forward.w2.weight": ("fsdp", "tp"),
        "layers.*.feed_forward.w3.weight": ("tp", "fsdp"),
        "norm.weight": ("fsdp",),
        "output.weight": ("tp", "fsdp"),
    }
    assert plan.roles["layers.1.attention.wk.weight"] == "column"
    assert plan.roles["layers.1.feed_forward.w2.weight"] == "row"
    assert plan.roles["output.weight"] == "vocab"


def test_rules_come_from_structure_not_names(mesh):
    class Block(nn.Module):  # attention-like: every Linear reads d; "mix" (last) writes d back
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16)
            self.mix = nn.Linear(32, 32)

    class Mlp(nn.Module):  # registration order up, back, side: back is the row
        def __init__(self):
            super().__init__()
            self.up, self.back, self.side = nn.Linear(32, 96), nn.Linear(96, 32), nn.Linear(32, 96)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(100, 32)
            self.block, self.mlp = Block(), Mlp()
            self.head = nn.Linear(32, 100)

    plan = plan_sharding(Net(), mesh, "tp")
    roles = dict(plan.roles)
    assert {k: roles[k] for k in ("block.a.weight", "block.b.weight", "block.c.weight", "block.mix.weight")} == {
        "block.a.weight": "column",
        "block.b.weight": "column",
        "block.c.weight": "column",
        "block.mix.weight": "row",
    }
    assert (roles["mlp.up.weight"], roles["mlp.back.weight"], roles["mlp.side.weight"]) == ("column", "row", "column")
    assert roles["table.weight"] == roles["head.weight"] == "vocab"
    assert plan.rules["block.a.bias"] == ("tp",) and plan.rules["block.mix.bias"] == (None,)
    assert plan.rules["mlp.back.weight"] == (None, "tp") and plan.rules["head.weight"] == ("tp", None)


def test_fsdp_strategy_is_fsdpv2s_rule(mesh):
    plan = plan_sharding(nn.Sequential(nn.Linear(8, 48), nn.Linear(48, 8)), mesh, "fsdp")
    # (the biases share a spec, and "*.bias" matches exactly them)
    assert dict(plan.rules) == {"0.weight": ("fsdp", None), "*.bias": ("fsdp",), "1.weight": (None, "fsdp")}


def test_bad_strategy_or_mesh(mesh):
    with pytest.raises(PlanError, match="strategy='zero3'"):
        plan_sharding(nn.Linear(2, 2), mesh, "zero3")
    with pytest.raises(PlanError, match=r"\['fsdp', 'model'\].*tp_axis="):
        plan_sharding(nn.Linear(2, 2), mesh, "fsdp+tp", tp_axis="model")


def test_planned_llama_trains_like_eager_and_memory_matches_xla(mesh):
    g = torch.Generator().manual_seed(1)
    data = [torch.randint(0, 256, (4, 16), generator=g) for _ in range(STEPS)]
    ref = llama()
    model = copy.deepcopy(ref).to("xla")

    plan = plan_sharding(model, mesh, "fsdp+tp", optimizer="adamw")
    mark_sharding(model, mesh, plan.rules)

    def make_opt(params):
        return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1)

    ref_losses = train_eager(ref, make_opt(ref.parameters()), data, lambda m, t: causal_lm_loss(m(t), t))

    opt = make_opt(model.parameters())

    @spmdtorch.compile
    def step(tokens):
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        return loss

    losses = [step(mark_sharding(t.to("xla"), mesh, ("fsdp", None))) for t in data]
    torch.testing.assert_close(torch.tensor([x.item() for x in losses]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)

    xla = compiled_memory(step)
    planned = plan.memory.parameter_bytes + plan.memory.gradient_bytes + plan.memory.optimizer_bytes
    print(
        f"planned params+grads+optimizer {planned} B/device, compiled step arguments {xla.argument_bytes} B/device, "
        f"temporaries {xla.temp_bytes} B"
    )
    # The step's arguments are the parameters, the buffers its gradients are
    # written into and the AdamW state (plus the token batch and the
    # optimizer's scalars): the planner's per-device state, as XLA sees it.
    assert abs(xla.argument_bytes - planned) <= 0.1 * planned, (xla.argument_bytes, planned)
    full = sum(p.numel() * 4 for p in model.parameters())
    assert planned < full  # 4 copies (parameters, gradients, 2 moments) sharded 8 ways

    with_step = spmdtorch.partition.memory_plan(model, mesh, optimizer=opt, compiled=step)
    assert with_step.activation_bytes == xla.temp_bytes
    assert with_step.parameter_bytes == plan.memory.parameter_bytes  # read back from the annotations
