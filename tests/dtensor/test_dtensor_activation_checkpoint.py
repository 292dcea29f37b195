"""torch's non-reentrant activation checkpointing on DTensor-parallel layers, against eager CPU (issue 43, item 5).

``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` (torchtitan's default, and what
``checkpoint_wrapper`` runs) recomputes the forward inside backward. The recomputation must record the same ops on
the same tensor types as the forward did: backward runs with subclass torch-function handling on, as the forward.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import XlaDTensor, init_device_mesh, parallelize_module


@pytest.fixture
def mesh(devices8):
    return init_device_mesh("xla", (8,), mesh_dim_names=("tp",))


class _Checkpointed(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.inner, x, use_reentrant=False)


def _wrap(module: nn.Module, how: str) -> nn.Module:
    return checkpoint_wrapper(module) if how == "checkpoint_wrapper" else _Checkpointed(module)


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, XlaDTensor) else t).detach().cpu()


@pytest.mark.parametrize("how", ["checkpoint", "checkpoint_wrapper"])
@pytest.mark.parametrize("use_local_output", [True, False])
def test_colwise_linear_backward_equals_eager(mesh, how, use_local_output):
    torch.manual_seed(0)
    ref = nn.Linear(8, 16)
    model = _wrap(
        parallelize_module(copy.deepcopy(ref).to("xla"), mesh, ColwiseParallel(use_local_output=use_local_output)), how
    )
    x = torch.randn(4, 8, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()

    _wrap(ref, how)(x).square().sum().backward()
    loss = model(xx).square().sum()
    assert isinstance(loss, XlaDTensor) is not use_local_output
    loss.backward()

    inner = model.inner if how == "checkpoint" else model._checkpoint_wrapped_module
    assert isinstance(inner.weight.grad, XlaDTensor)
    torch.testing.assert_close(_full(inner.weight.grad), ref.weight.grad)
    torch.testing.assert_close(_full(inner.bias.grad), ref.bias.grad)
    torch.testing.assert_close(xx.grad.cpu(), x.grad)


@pytest.mark.parametrize("call", ["grad", "backward_inputs", "retain_graph"])
def test_grad_and_backward_inputs_equal_eager(mesh, call):
    torch.manual_seed(0)
    ref = nn.Linear(8, 16)
    model = _Checkpointed(parallelize_module(copy.deepcopy(ref).to("xla"), mesh, ColwiseParallel()))
    x = torch.randn(4, 8, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    loss_ref = _Checkpointed(ref)(x).square().sum()
    loss = model(xx).square().sum()
    w_ref, w = ref.weight, model.inner.weight
    if call == "grad":
        expected = torch.autograd.grad(loss_ref, [w_ref, x])
        got = torch.autograd.grad(loss, [w, xx])
        torch.testing.assert_close(_full(got[0]), expected[0])
        torch.testing.assert_close(got[1].cpu(), expected[1])
        assert w.grad is None and xx.grad is None
    elif call == "backward_inputs":
        loss_ref.backward(inputs=[w_ref])
        loss.backward(inputs=[w])
        torch.testing.assert_close(_full(w.grad), w_ref.grad)
        assert xx.grad is None and model.inner.bias.grad is None
    else:  # twice through the kept graph: the recomputation runs again, gradients add up
        torch.autograd.backward(loss_ref, retain_graph=True)
        torch.autograd.backward(loss_ref)
        torch.autograd.backward(loss, retain_graph=True)
        torch.autograd.backward(loss)
        torch.testing.assert_close(_full(w.grad), w_ref.grad)
        torch.testing.assert_close(xx.grad.cpu(), x.grad)


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(16, 32)
        self.w2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Mlp() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def test_compiled_tp_training_equals_eager_and_replays(mesh):
    torch.manual_seed(0)
    ref = _Net()
    model = copy.deepcopy(ref).to("xla")
    for block in model.blocks:
        parallelize_module(block, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    model.blocks = nn.ModuleList(checkpoint_wrapper(b) for b in model.blocks)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @spmdtorch.compile
    def step(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    traces = debug.counter_value("CompiledTrace") or 0
    replays = debug.counter_value("CompiledReplay") or 0
    for i in range(4):
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(i))
        loss_ref = torch.utils.checkpoint.checkpoint(ref, x, use_reentrant=False).square().mean()
        loss_ref.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(step(x.to("xla")).cpu(), loss_ref.detach(), atol=2e-5, rtol=2e-5)
    assert (debug.counter_value("CompiledReplay") or 0) - replays >= 2
    assert (debug.counter_value("CompiledTrace") or 0) - traces <= 2
    for name, p in ref.named_parameters():
        got = model.get_parameter(
            name.replace("blocks.0.", "blocks.0._checkpoint_wrapped_module.").replace(
                "blocks.1.", "blocks.1._checkpoint_wrapped_module."
            )
        )
        assert isinstance(got, XlaDTensor), name
        torch.testing.assert_close(_full(got), p.detach(), atol=2e-5, rtol=2e-5, msg=name)


def test_plain_xla_attention_under_checkpoint_equals_eager():
    # No DTensor: the recomputation's fused attention and a custom Function's backward on xla tensors.
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t * 2

        @staticmethod
        def backward(ctx, g):
            return g.clone() * 2

    def block(q, k, v):
        return Scale.apply(F.scaled_dot_product_attention(q, k, v, is_causal=True)).sum()

    torch.manual_seed(0)
    qkv = [torch.randn(2, 4, 8, 16, requires_grad=True) for _ in range(3)]
    xla = [t.detach().to("xla").requires_grad_() for t in qkv]
    torch.utils.checkpoint.checkpoint(block, *qkv, use_reentrant=False).backward()
    torch.utils.checkpoint.checkpoint(block, *xla, use_reentrant=False).backward()
    for got, want in zip(xla, qkv, strict=True):
        torch.testing.assert_close(got.grad.cpu(), want.grad, atol=1e-5, rtol=1e-5)
