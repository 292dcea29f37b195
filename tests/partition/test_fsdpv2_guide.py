"""FSDPv2 written as PyTorch/XLA's FSDPv2 guide and Hugging Face's trainer write it.

The guide: ``FSDPv2(my_module, mesh)`` and ``FSDPv2(my_module, mesh,
shard_output)`` with ``mesh`` and ``shard_output`` by position, and a
``shard_output`` that annotates ``output.logits`` (the view a 3-d ``linear``
returns). Hugging Face (``transformers.integrations.tpu``): no mesh (the
global one), its own ``shard_output`` on ``CausalLMOutputWithPast.logits``
and on decoder-layer outputs, and an ``auto_wrapper_callable`` that forwards
``*args, **kwargs``. Each trains to the losses and parameters of eager CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import numpy as np
import pytest
import torch
import transformers
from training_helpers import train_eager

from spmdtorch.fsdp import FSDPv2, checkpoint_module, transformer_auto_wrap_policy
from spmdtorch.mesh import Mesh, get_global_mesh, set_global_mesh
from spmdtorch.sharding import get_sharding_spec, mark_sharding

ALL8 = "0,1,2,3,4,5,6,7"
ROWS = f"{{devices=[8,1]{ALL8}}}"
BATCH3 = f"{{devices=[8,1,1]{ALL8}}}"


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (8, 1), ("fsdp", "model"))  # the guide's (num_devices, 1) mesh


@dataclasses.dataclass
class Output:
    logits: torch.Tensor


class TokenModel(torch.nn.Module):
    """Returns an object with ``.logits``: the guide's case for a custom ``shard_output``."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.hidden = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, ids):
        return Output(self.head(torch.tanh(self.hidden(self.embed(ids)))))  # 3-d linear: a view


def lm_loss(model, batch):
    logits = model(batch).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 32), batch.reshape(-1))


def batches(n=3):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 32, (8, 6), generator=g) for _ in range(n)]


def train_xla(model, data, loss_fn, mesh):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return train_eager(model, opt, [mark_sharding(b.to("xla"), mesh, ("fsdp", None)) for b in data], loss_fn)


def test_mesh_by_position_is_the_mesh_keyword(mesh):
    torch.manual_seed(0)
    module = torch.nn.Linear(16, 32)
    a = FSDPv2(copy.deepcopy(module), mesh)  # the guide: FSDPv2(my_module, mesh)
    b = FSDPv2(copy.deepcopy(module), mesh=mesh)
    assert a.mesh is mesh
    for model in (a, b):
        assert get_sharding_spec(model.module.weight) == ROWS
        y = model(torch.randn(8, 16, device="xla"))
        assert get_sharding_spec(y) == ROWS


def test_guide_shard_output_on_logits_trains_like_eager(mesh):
    calls = []

    def shard_output(output, mesh):  # verbatim from the guide (plus a record of the call)
        calls.append(output)
        mark_sharding(output.logits, mesh, ("fsdp", None, None))

    torch.manual_seed(0)
    ref = TokenModel()
    model = FSDPv2(copy.deepcopy(ref), mesh, shard_output)  # positional, as the guide writes it
    out = model(torch.randint(0, 32, (8, 6), device="xla"))
    assert len(calls) == 1  # once, on the whole model's output
    assert get_sharding_spec(out.logits) == BATCH3
    data = batches()
    want = train_eager(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), data, lm_loss)
    got = train_xla(model, data, lm_loss, mesh)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for (name, p), q in zip(model.module.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_wrong_positional_mesh_is_a_named_error():
    from spmdtorch.fsdp import FSDPv2MeshError

    with pytest.raises(FSDPv2MeshError, match="must be a spmdtorch.mesh.Mesh, got builtins.tuple"):
        FSDPv2(torch.nn.Linear(4, 4), (8, 1))
    with pytest.raises(TypeError):  # the rest stays keyword-only, as in PyTorch/XLA
        FSDPv2(torch.nn.Linear(4, 4), None, None, None)


def hf_shard_output(output, mesh):
    """``transformers.integrations.tpu``'s shard_output, with spmdtorch's mark_sharding."""
    from transformers.modeling_outputs import CausalLMOutputWithPast

    real_output = None
    if isinstance(output, torch.Tensor):
        real_output = output
    elif isinstance(output, tuple):
        real_output = output[0]
    elif isinstance(output, CausalLMOutputWithPast):
        real_output = output.logits
    if real_output is None:
        raise ValueError("Something went wrong, the output of the model shouldn't be `None`")
    mark_sharding(real_output, mesh, ("fsdp", None, None))


def make_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        attn_implementation="eager",
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(config)


def hf_loss(model, ids):
    return model(input_ids=ids, labels=ids).loss


def test_hugging_face_fsdpv2_wrapping_trains_like_eager(mesh):
    previous = get_global_mesh()
    set_global_mesh(mesh)  # the trainer passes no mesh
    try:
        ref = make_llama()
        layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer
        policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer})

        def auto_wrapper_callable(m, *args, **kwargs):  # as the trainer writes it (grad checkpointing on)
            return FSDPv2(checkpoint_module(m), *args, **kwargs)

        model = FSDPv2(
            copy.deepcopy(ref),
            shard_output=hf_shard_output,
            auto_wrap_policy=policy,
            auto_wrapper_callable=auto_wrapper_callable,
        )
        out = model(input_ids=torch.randint(0, 64, (8, 6), device="xla"))
        assert get_sharding_spec(out.logits) == BATCH3  # the annotated logits (a view)
        g = torch.Generator().manual_seed(2)
        data = [torch.randint(0, 64, (8, 6), generator=g) for _ in range(3)]
        want = train_eager(ref, torch.optim.AdamW(ref.parameters(), lr=1e-3), data, hf_loss)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        got = train_eager(model, opt, [mark_sharding(b.to("xla"), mesh, ("fsdp", None)) for b in data], hf_loss)
        np.testing.assert_allclose(got, want, rtol=1e-5)
        ours = {k.replace("_orig_module.", ""): v for k, v in model.named_parameters()}
        for name, q in ref.named_parameters():
            torch.testing.assert_close(ours[name].cpu(), q, rtol=1e-5, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
    finally:
        set_global_mesh(previous)


def test_default_shard_output_annotates_a_view_in_place(mesh):
    seen = []
    lin = torch.nn.Linear(16, 16)
    # A linear of the flattened batch, unflattened: the output is a view.
    net = torch.nn.Sequential(torch.nn.Flatten(0, 1), lin, torch.nn.Unflatten(0, (8, 4)))
    net.register_forward_hook(lambda m, args, out: seen.append(out))
    model = FSDPv2(net, mesh)
    x = torch.randn(8, 4, 16)
    out = model(x.to("xla"))
    assert out is seen[0] and out._chain  # annotated in place, as PyTorch/XLA does
    assert get_sharding_spec(out) == BATCH3
    torch.testing.assert_close(out.cpu(), torch.nn.functional.linear(x, lin.weight.cpu(), lin.bias.cpu()))
