"""einops on xla tensors: rearrange, repeat, reduce, einsum and the torch layers.

Every case runs forward and backward on xla (lazy) and on eager CPU from the
same inputs and compares values and input gradients; a small model built from
``einops.layers.torch`` trains the same under ``spmdtorch.compile`` as eagerly.
einops sees xla tensors as ``torch.Tensor``s and uses its torch backend, so
these check the ops it emits (view/permute/expand/reshape, reductions,
einsum) through spmdtorch's dispatch, not einops itself.
"""

from __future__ import annotations

import copy

import einops
import pytest
import torch
from einops.layers.torch import EinMix, Rearrange, Reduce
from training_helpers import train_eager

import spmdtorch

# name -> (function of the inputs, input shapes)
CASES = {
    "rearrange_transpose": (lambda x: einops.rearrange(x, "b h w c -> b c h w"), [(2, 3, 4, 5)]),
    "rearrange_merge": (lambda x: einops.rearrange(x, "b h w c -> (b h) (w c)"), [(2, 3, 4, 5)]),
    "rearrange_split_patches": (
        lambda x: einops.rearrange(x, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2),
        [(2, 3, 4, 6)],
    ),
    "rearrange_list_of_tensors": (lambda x, y: einops.rearrange([x, y], "n b d -> b n d"), [(3, 4), (3, 4)]),
    "repeat_new_axis": (lambda x: einops.repeat(x, "h w -> h w c", c=3), [(4, 5)]),
    "repeat_upsample": (lambda x: einops.repeat(x, "b h w -> b (h 2) (w 3)"), [(2, 3, 4)]),
    "reduce_mean": (lambda x: einops.reduce(x, "b c h w -> b c", "mean"), [(2, 3, 4, 5)]),
    "reduce_max_pool": (lambda x: einops.reduce(x, "b c (h 2) (w 2) -> b c h w", "max"), [(2, 3, 4, 6)]),
    "reduce_sum_keepdim": (lambda x: einops.reduce(x, "b c h w -> b c 1 1", "sum"), [(2, 3, 4, 5)]),
    "reduce_prod": (lambda x: einops.reduce(x, "b d -> d", "prod"), [(3, 4)]),
    "einsum_matmul": (lambda a, b: einops.einsum(a, b, "b i j, b j k -> b i k"), [(2, 3, 4), (2, 4, 5)]),
    "einsum_attention_scores": (
        lambda q, k: einops.einsum(q, k, "b h i d, b h j d -> b h i j"),
        [(2, 2, 3, 4), (2, 2, 5, 4)],
    ),
    "einsum_trace_outer": (lambda a, b: einops.einsum(a, b, "i i, j -> j"), [(4, 4), (3,)]),
    "pack_unpack": (lambda x, y: einops.unpack(*einops.pack([x, y], "b *"), "b *")[1] * 2, [(2, 3, 4), (2, 5)]),
}


def _inputs(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float32) for s in shapes]


def _run(fn, inputs):
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    # A weighted sum so that every output element gets its own gradient.
    weights = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    if isinstance(out, spmdtorch.XlaTensor):
        weights = weights.to("xla")
    (out * weights).sum().backward()
    return out, [x.grad for x in leaves]


@pytest.mark.parametrize("name", CASES)
def test_einops_forward_backward_match_eager(name):
    fn, shapes = CASES[name]
    cpu_in = _inputs(shapes)
    ref_out, ref_grads = _run(fn, cpu_in)
    out, grads = _run(fn, [x.to("xla") for x in cpu_in])
    assert isinstance(out, spmdtorch.XlaTensor) and out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), ref_out.detach(), rtol=1e-5, atol=1e-6)
    for i, (g, rg) in enumerate(zip(grads, ref_grads)):
        torch.testing.assert_close(g.cpu(), rg, rtol=1e-5, atol=1e-6, msg=lambda m, i=i: f"grad of input {i}: {m}")


def _mixer_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2),  # 4 patches of 12
        torch.nn.Linear(12, 16),
        EinMix("b t c -> b t c2", weight_shape="c c2", bias_shape="c2", c=16, c2=16),
        torch.nn.GELU(),
        EinMix("b t c -> b t2 c", weight_shape="t t2", t=4, t2=4),  # token mixing
        Reduce("b t c -> b c", "mean"),
        torch.nn.Linear(16, 3),
    )


def _batches(n=3):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 4, 4, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)]


def _loss(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_einops_layers_train_like_eager(mode):
    ref = _mixer_model()
    model = copy.deepcopy(ref).to("xla")
    data = _batches()
    ref_losses = train_eager(ref, torch.optim.Adam(ref.parameters(), lr=1e-2), data, _loss)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    def step(x, y):
        opt.zero_grad()
        loss = _loss(model, (x, y))
        loss.backward()
        opt.step()
        return loss

    run = spmdtorch.compile(step) if mode == "compiled" else step
    losses = []
    for x, y in data:
        with spmdtorch.step():
            losses.append(run(x.to("xla"), y.to("xla")))
    torch.testing.assert_close(torch.tensor([l.item() for l in losses]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(
            p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
