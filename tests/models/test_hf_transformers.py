"""Hugging Face transformers models train on xla with the same numbers as eager CPU.

Each model is built from a small random config (no download), copied to xla,
and trained a few AdamW steps next to the eager CPU original from the same
initial weights; the per-step losses and the final parameters must agree to
float32 rounding (rtol 1e-5). Dropout is 0 (the xla stream draws different
masks than torch's CPU generator: dropout is covered by
``tests/lazy/test_random.py``). The Llama-style decoder of
``spmdtorch.models.llama`` is covered by ``tests/lazy/test_training.py``;
here are transformers' own implementations: Llama (eager and SDPA attention,
lazy and ``spmdtorch.compile``), GPT-2, BERT with a padding mask, and Llama
sharded with FSDPv2 over an 8-device mesh. (Parameter tolerance: see
``PARAM_ATOL``.)

transformers is a test-only dependency (the ``test`` extra): a missing
install fails these tests at import, it does not skip them.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import transformers
from model_parity import check_training_parity

from spmdtorch.fsdp import FSDPv2, transformer_auto_wrap_policy
from spmdtorch.mesh import Mesh
from spmdtorch.partition import get_sharding_spec, mark_sharding

VOCAB = 128
STEPS = 3


LR = 1e-3


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=0.01)


# Losses are held to rtol 1e-5. Parameters get an absolute slack of LR / 10:
# Adam moves every weight by about ``lr * g / |g|``, so where a gradient is
# itself float32 rounding noise (a position embedding row that gets almost
# nothing), a rounding difference changes that weight's step by up to ``lr``.
# Eager CPU-vs-CUDA training shows the same; everything else agrees to 1e-5.
PARAM_ATOL = LR / 10
check_training_parity = functools.partial(check_training_parity, param_atol=PARAM_ATOL)


def token_batches(batch=2, seq=16, with_mask=False, n_labels=None):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
        b = (ids,)
        if with_mask:  # right padding of a different length per row
            lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=g)
            b += ((torch.arange(seq)[None, :] < lengths[:, None]).long(),)
        if n_labels:
            b += (torch.randint(0, n_labels, (batch,), generator=g),)
        out.append(b)
    return out


def causal_lm_loss(model, batch):
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss


def make_llama(attn_implementation):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn_implementation,
    )
    return transformers.LlamaForCausalLM(config)


def make_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    return transformers.GPT2LMHeadModel(config)


def make_bert():
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
        attn_implementation="sdpa",
    )
    return transformers.BertForSequenceClassification(config)


def bert_loss(model, batch):
    ids, mask, labels = batch
    return model(input_ids=ids, attention_mask=mask, labels=labels).loss


@pytest.mark.parametrize(
    "attn,mode",
    [("eager", "lazy"), ("sdpa", "compiled")],
)
def test_llama_trains_like_eager(attn, mode):
    check_training_parity(functools.partial(make_llama, attn), adamw, token_batches(), causal_lm_loss, mode)


def test_gpt2_with_tied_embeddings_trains_like_eager():
    # Plain ``.to("xla")`` (check_training_parity's default): the tie must survive it.
    ref, _ = check_training_parity(make_gpt2, adamw, token_batches(), causal_lm_loss, "lazy")
    assert ref.lm_head.weight is ref.transformer.wte.weight  # the tie was exercised


def test_module_to_xla_keeps_tied_parameters_and_their_identity():
    model = make_gpt2()
    wte = model.transformer.wte.weight
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built before the move, as PyTorch/XLA allows
    model.to("xla")
    assert model.lm_head.weight is model.transformer.wte.weight is wte
    assert wte.device.type == "xla" and isinstance(wte, torch.nn.Parameter)
    assert opt.param_groups[0]["params"][0].device.type == "xla"


def test_bert_with_padding_mask_trains_like_eager():
    batches = token_batches(with_mask=True, n_labels=3)
    assert any(int(m.sum()) < m.numel() for _, m, _ in batches), "the batches should contain padding"
    check_training_parity(make_bert, adamw, batches, bert_loss, "lazy")


@pytest.mark.slow
def test_llama_fsdpv2_on_8_devices_trains_like_eager():
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={transformers.models.llama.modeling_llama.LlamaDecoderLayer}
    )

    def shard_output(output, mesh):
        # HF returns a ModelOutput (or a tensor from a decoder layer): shard the batch dim.
        t = output if isinstance(output, torch.Tensor) else output.logits
        mark_sharding(t, mesh, ("fsdp",) + (None,) * (t.dim() - 1))

    def wrap(model):
        return FSDPv2(model, mesh=mesh, auto_wrap_policy=policy, shard_output=shard_output)

    def prepare(batch):  # the batch over "fsdp", like the outputs
        return tuple(mark_sharding(t.to("xla"), mesh, ("fsdp", None)) for t in batch)

    _, model = check_training_parity(
        functools.partial(make_llama, "sdpa"),
        adamw,
        token_batches(batch=8),
        causal_lm_loss,
        "lazy",
        wrap=wrap,
        prepare=prepare,
    )
    # The weights really are split 8 ways (FSDPv2 shards each on its largest dim).
    w = model.model.embed_tokens.weight
    assert get_sharding_spec(w) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert [type(layer).__name__ for layer in model.model.layers] == ["FSDPv2", "FSDPv2"]


def test_llama_with_hf_gradient_checkpointing_trains_like_eager():
    """HF's gradient_checkpointing_enable() runs torch.utils.checkpoint on xla tensors."""

    def make():
        model = make_llama("eager")
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
        model.train()
        return model

    ref, model = check_training_parity(make, adamw, token_batches(), causal_lm_loss, "lazy")
    assert model.model.gradient_checkpointing and model.model.layers[0].gradient_checkpointing
