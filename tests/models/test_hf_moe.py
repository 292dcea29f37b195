"""Hugging Face mixture-of-experts models train on xla like eager CPU.

Mixtral, Qwen2-MoE and GPT-OSS from small random configs, with transformers'
default expert implementation (``grouped_mm``: tokens sorted by expert,
counted with integer ``torch.histc`` off CPU, multiplied with
``F.grouped_mm``), 2 AdamW steps in lazy mode, under ``spmdtorch.compile``,
and sharded with FSDPv2 over 8 devices; and ``plan_sharding``'s
expert-parallel rule (stacked expert weights split on the expert dim). Eager CPU runs the same default path
(its ``grouped_mm`` kernel, ``histc`` on floats). The routing must not leave
the device: no ``aten::*`` CPU-fallback counter may move.
"""

from __future__ import annotations

import fnmatch
import functools

import numpy as np
import pytest
import torch
import transformers
from model_parity import check_training_parity

from spmdtorch import debug
from spmdtorch.fsdp import FSDPv2, transformer_auto_wrap_policy
from spmdtorch.mesh import Mesh
from spmdtorch.partition import get_sharding_spec, mark_sharding

VOCAB = 128
STEPS = 2
LR = 1e-3
# As in test_hf_transformers.py: losses to rtol 1e-5; parameters to LR / 10
# absolute (Adam turns a rounding-level gradient difference into up to ``lr``).
PARAM_ATOL = LR / 10

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def make_mixtral():
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64, output_router_logits=True, **COMMON
    )
    return transformers.MixtralForCausalLM(config)


def make_qwen2_moe():
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        max_position_embeddings=64,
        **COMMON,
    )
    return transformers.Qwen2MoeForCausalLM(config)


def make_gpt_oss():
    torch.manual_seed(0)
    config = transformers.GptOssConfig(
        num_local_experts=4,
        num_experts_per_tok=2,
        head_dim=8,
        sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=4096,  # its YaRN RoPE's original context
        **COMMON,
    )
    return transformers.GptOssForCausalLM(config)


MODELS = {"mixtral": make_mixtral, "qwen2_moe": make_qwen2_moe, "gpt_oss": make_gpt_oss}
LAYERS = {
    "mixtral": transformers.models.mixtral.modeling_mixtral.MixtralDecoderLayer,
    "qwen2_moe": transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeDecoderLayer,
    "gpt_oss": transformers.models.gpt_oss.modeling_gpt_oss.GptOssDecoderLayer,
}


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


def token_batches(batch=2, seq=16):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, VOCAB, (batch, seq), generator=g),) for _ in range(STEPS)]


def causal_lm_loss(model, batch):
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss  # Mixtral's includes the router's aux loss


def _fallbacks():
    return {
        n: debug.counter_value(n)
        for n in debug.counter_names()
        if n.startswith("aten::") and n != "aten::_local_scalar_dense"
    }


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_experts_implementation_is_grouped_mm(name):
    assert MODELS[name]().config._experts_implementation == "grouped_mm"


# Every model lazily, spmdtorch.compile on one (the ops are the same; each case
# costs seconds of XLA:CPU compiles): GPT-OSS lazily and Mixtral compiled in the
# default suite, the rest in the slow tier.
@pytest.mark.parametrize(
    "name,mode",
    [
        ("gpt_oss", "lazy"),
        pytest.param("mixtral", "lazy", marks=pytest.mark.slow),  # the expert-parallel test runs it lazily
        ("mixtral", "compiled"),
        pytest.param("qwen2_moe", "lazy", marks=pytest.mark.slow),  # shared experts; gpt_oss stands for the rest
    ],
)
def test_moe_trains_like_eager(name, mode):
    before = _fallbacks()
    check_training_parity(MODELS[name], adamw, token_batches(), causal_lm_loss, mode, param_atol=PARAM_ATOL)
    assert _fallbacks() == before, f"ops ran on CPU copies: {before} -> {_fallbacks()}"


@pytest.mark.parametrize(
    "name",
    # All in the slow tier (Mixtral 24 s, the others about 7 s each), to keep the default suite in
    # budget: by default Mixtral trains against eager compiled and expert-parallel, FSDPv2 on a dense Llama.
    [pytest.param(n, marks=pytest.mark.slow) for n in sorted(MODELS)],
)
def test_moe_fsdpv2_on_8_devices_trains_like_eager(name, devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={LAYERS[name]})

    def shard_output(output, mesh):
        t = output if isinstance(output, torch.Tensor) else output.logits
        mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

    def wrap(model):
        return FSDPv2(model, mesh=mesh, auto_wrap_policy=policy, shard_output=shard_output)

    def prepare(batch):
        return tuple(mark_sharding(t.to("xla"), mesh, ("fsdp", None)) for t in batch)

    _, model = check_training_parity(
        MODELS[name],
        adamw,
        token_batches(batch=8),
        causal_lm_loss,
        "lazy",
        wrap=wrap,
        prepare=prepare,
        param_atol=PARAM_ATOL,
    )
    experts = model.model.layers[0]._orig_module.mlp.experts
    # The stacked expert weights are sharded 8 ways too.
    spec = get_sharding_spec(experts.down_proj)
    assert spec.startswith("{devices=[") and "8" in spec.split("]")[0], spec


@pytest.mark.parametrize("name", ["gpt_oss", "mixtral"])
def test_expert_parallel_plan_shards_stacked_experts(name):
    from spmdtorch.plan import plan_sharding

    mesh = Mesh(np.arange(8), (2, 4), ("fsdp", "ep"))
    with torch.device("meta"):
        model = MODELS[name]()
    plan = plan_sharding(model, mesh, "fsdp+ep")
    experts = [n for n, _ in model.named_parameters() if ".experts." in n]
    assert experts
    for n in experts:
        assert plan.roles[n] == "expert", n
        spec = next(v for k, v in plan.rules.items() if fnmatch.fnmatchcase(n, k))
        assert spec[0] == "ep" and "fsdp" in spec[1:], (n, spec)
    others = [n for n in plan.roles if ".experts." not in n]
    assert all(plan.roles[n] in ("fsdp", "replicated") for n in others)
    only_ep = plan_sharding(model, mesh, "ep")
    assert {n for n, r in only_ep.roles.items() if r == "expert"} == set(experts)
    assert all(only_ep.roles[n] == "replicated" for n in others)


def test_mixtral_expert_parallel_trains_like_eager(devices8):
    from spmdtorch.plan import plan_sharding

    mesh = Mesh(np.arange(8), (2, 4), ("fsdp", "ep"))
    rules = dict(plan_sharding(make_mixtral(), mesh, "fsdp+ep").rules)

    def wrap(model):
        model = model.to("xla")
        mark_sharding(model, mesh, rules)
        return model

    _, model = check_training_parity(
        make_mixtral, adamw, token_batches(batch=4), causal_lm_loss, "lazy", wrap=wrap, param_atol=PARAM_ATOL
    )
    w = model.model.layers[0].mlp.experts.gate_up_proj
    assert get_sharding_spec(w).startswith("{devices=[4,"), get_sharding_spec(w)  # 4 experts over "ep"
