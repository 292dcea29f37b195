"""Mixed precision: bfloat16 compute, float32 master weights, training works.

The eager reference applies the same policy to the same model on CPU
(``MixedPrecision.run`` is device-agnostic), so the two runs do the same
bfloat16 arithmetic; they differ only in how XLA and torch's CPU kernels
accumulate bfloat16 matmuls, hence the bfloat16-level loss tolerance.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch
from training_helpers import train_eager

import spmdtorch
from spmdtorch.mesh import Mesh
from spmdtorch.models.llama import (
    DecoderLayer,
    LlamaConfig,
    LlamaForCausalLM,
    causal_lm_loss,
)
from spmdtorch.partition import (
    FSDPv2,
    FSDPv2Error,
    MixedPrecision,
    MixedPrecisionError,
    get_sharding_spec,
    mark_sharding,
    transformer_auto_wrap_policy,
)

STEPS = 6
POLICY = MixedPrecision(param_dtype=torch.bfloat16, output_dtype=torch.float32)


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (8,), ("fsdp",))


def batches():
    g = torch.Generator().manual_seed(1)
    # One batch repeated: the loss must go down when training works.
    tokens = torch.randint(0, 256, (8, 16), generator=g)
    return [(tokens,)] * STEPS


def loss_fn(model, batch):
    return causal_lm_loss(model(batch[0]), batch[0])


class EagerMixed(torch.nn.Module):
    """The same policy on CPU: the reference."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return POLICY.run(self.module, args, {})


# spmdtorch.compile traces its first two steps lazily, so one run covers both
# paths (a decoder step costs ~10 s of XLA compiles on 8 CPU devices).
def test_bf16_compute_fp32_master_trains_like_eager(mesh):
    torch.manual_seed(0)
    ref = LlamaForCausalLM(LlamaConfig.tiny())
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=policy, mixed_precision=POLICY)
    ref_wrapped = EagerMixed(ref)
    data = batches()
    ref_losses = train_eager(ref_wrapped, torch.optim.AdamW(ref.parameters(), lr=1e-2), data, loss_fn)

    seen = []
    model.layers[0].register_forward_hook(lambda m, a, out: seen.append(out.dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(tokens):
        opt.zero_grad()
        loss = loss_fn(model, (tokens,))
        loss.backward()
        opt.step()
        return loss

    run = spmdtorch.compile(step)
    losses = []
    for (tokens,) in data:
        tokens = mark_sharding(tokens.to("xla"), mesh, ("fsdp", None))
        with spmdtorch.step():
            losses.append(run(tokens))
    losses = [loss.item() for loss in losses]

    assert seen and set(seen) == {torch.bfloat16}, "decoder layers must compute in bfloat16"
    for p in model.parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
    assert losses[-1] < 0.8 * losses[0], f"bf16 training did not reduce the loss: {losses}"
    # Measured: within 5e-4 of eager over 6 steps (bfloat16 matmuls accumulate
    # in another order in XLA than in torch's CPU kernels).
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=5e-3, atol=5e-3)
    # The optimizer kept the float32 masters sharded as FSDPv2 placed them.
    assert get_sharding_spec(model.module.tok_embeddings.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


def test_policy_validation():
    with pytest.raises(MixedPrecisionError, match="param_dtype must be a floating torch.dtype"):
        MixedPrecision(param_dtype=torch.int8)
    with pytest.raises(MixedPrecisionError, match="output_dtype"):
        MixedPrecision(output_dtype="float32")
    with pytest.raises(MixedPrecisionError, match="cast_forward_inputs must be a bool"):
        MixedPrecision(cast_forward_inputs="yes")
    with pytest.raises(AttributeError):
        POLICY.param_dtype = torch.float16  # frozen


def test_fsdp_rejects_a_non_policy(mesh):
    with pytest.raises(FSDPv2Error, match="mixed_precision must be a spmdtorch.partition.MixedPrecision"):
        FSDPv2(torch.nn.Linear(8, 8), mesh=mesh, mixed_precision=torch.bfloat16)


def test_inputs_cast_and_integer_inputs_left_alone():
    policy = MixedPrecision(param_dtype=torch.bfloat16)
    seen = []

    class Probe(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x, ids, scale=None):
            seen.extend([x.dtype, ids.dtype, scale.dtype, self.w.dtype])
            return x * self.w

    out = policy.run(Probe(), (torch.ones(3), torch.arange(3)), {"scale": torch.ones(1)})
    assert seen == [torch.bfloat16, torch.int64, torch.bfloat16, torch.bfloat16]
    assert out.dtype == torch.bfloat16


def test_doctests(devices8):
    import doctest

    import spmdtorch.fsdp._mixed_precision as mod

    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
