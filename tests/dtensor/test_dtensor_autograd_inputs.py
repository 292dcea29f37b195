"""``backward(inputs=)`` and ``torch.autograd.grad`` from a DTensor loss, against eager CPU (issue 43).

A DTensor loss (``ColwiseParallel(use_local_output=False)``) runs these calls through ``XlaDTensor``'s
torch-function handler. The roots and the ``inputs`` must be the DTensors' own graph positions: unwrapping them
to their global tensors makes new graph nodes, so ``inputs=`` would name tensors the loss does not depend on.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.utils.checkpoint
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel

from spmdtorch.dtensor import XlaDTensor, init_device_mesh, parallelize_module


@pytest.fixture
def mesh(devices8):
    return init_device_mesh("xla", (8,), mesh_dim_names=("tp",))


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, XlaDTensor) else t).detach().cpu()


def _pair(mesh):
    """An eager CPU Linear and its ColwiseParallel copy on xla whose output (and so the loss) is a DTensor."""
    torch.manual_seed(0)
    ref = nn.Linear(8, 16)
    model = parallelize_module(copy.deepcopy(ref).to("xla"), mesh, ColwiseParallel(use_local_output=False))
    x = torch.randn(4, 8, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    return ref, model, x, xx


def test_backward_inputs_fills_only_the_named_dtensor(mesh):
    ref, model, x, xx = _pair(mesh)
    loss_ref = ref(x).square().sum()
    loss = model(xx).square().sum()
    assert isinstance(loss, XlaDTensor)
    loss_ref.backward(inputs=[ref.weight])
    loss.backward(inputs=[model.weight])
    assert isinstance(model.weight.grad, XlaDTensor)
    assert model.weight.grad.placements == model.weight.placements
    torch.testing.assert_close(_full(model.weight.grad), ref.weight.grad)
    assert model.bias.grad is None and xx.grad is None


def test_autograd_backward_inputs_with_grad_tensors(mesh):
    ref, model, x, xx = _pair(mesh)
    out_ref, out = ref(x), model(xx)
    seed = torch.randn(4, 16)
    torch.autograd.backward(out_ref, seed, inputs=[ref.bias, x])
    seed_d = XlaDTensor.from_local(seed.to("xla"), mesh, out.placements)
    torch.autograd.backward(out, seed_d, inputs=[model.bias, xx])
    torch.testing.assert_close(_full(model.bias.grad), ref.bias.grad)
    torch.testing.assert_close(xx.grad.cpu(), x.grad)
    assert model.weight.grad is None


def test_autograd_grad_returns_dtensors_with_the_inputs_placements(mesh):
    ref, model, x, xx = _pair(mesh)
    expected = torch.autograd.grad(ref(x).square().sum(), [ref.weight, x])
    got = torch.autograd.grad(model(xx).square().sum(), [model.weight, xx])
    assert isinstance(got[0], XlaDTensor)
    assert got[0].placements == model.weight.placements
    torch.testing.assert_close(_full(got[0]), expected[0])
    assert not isinstance(got[1], XlaDTensor)
    torch.testing.assert_close(got[1].cpu(), expected[1])
    assert model.weight.grad is None and xx.grad is None


def test_autograd_grad_of_a_non_scalar_with_grad_outputs(mesh):
    ref, model, x, xx = _pair(mesh)
    out_ref, out = ref(x), model(xx)
    seed = torch.randn(4, 16)
    (expected,) = torch.autograd.grad(out_ref, [ref.weight], grad_outputs=[seed])
    seed_d = XlaDTensor.from_local(seed.to("xla"), mesh, out.placements)
    (got,) = torch.autograd.grad(out, [model.weight], grad_outputs=[seed_d])
    assert isinstance(got, XlaDTensor) and got.placements == model.weight.placements
    torch.testing.assert_close(_full(got), expected)


def test_autograd_grad_create_graph_and_allow_unused(mesh):
    ref, model, x, xx = _pair(mesh)
    unused = nn.Parameter(torch.ones(3)).to("xla")
    (g_ref,) = torch.autograd.grad(ref(x).square().sum(), [x], create_graph=True)
    got = torch.autograd.grad(model(xx).square().sum(), [xx, unused], create_graph=True, allow_unused=True)
    assert got[1] is None
    torch.testing.assert_close(got[0].detach().cpu(), g_ref.detach())
    # The gradient is itself differentiable (create_graph): second order against eager.
    g_ref.sum().backward(inputs=[ref.weight])
    got[0].sum().backward(inputs=[model.weight])
    torch.testing.assert_close(_full(model.weight.grad), ref.weight.grad)


@pytest.mark.parametrize(
    "f",
    [lambda w: w * w * w, lambda w: (w * w).sin() * w, lambda w: w.pow(3), lambda w: (w @ w.T).tanh()],
    ids=["product", "intermediate_dtensor", "pow", "matmul"],
)
def test_second_order_through_dtensor_ops_equals_eager(mesh, f):
    # create_graph: the first gradient is a DTensor whose history a second backward must reach, through
    # intermediate DTensors too (their joints' backward once returned the bare local tensor, a detached
    # alias: (w * w) * w gave 4w instead of 6w, and the gradient wrapper dropped its history with a warning).
    from torch.distributed.tensor import Shard

    from spmdtorch.dtensor import distribute_tensor

    w0 = torch.arange(16.0).reshape(8, 2) / 10 + 1
    w = nn.Parameter(distribute_tensor(w0, mesh, [Shard(0)]))
    ref = w0.clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(f(ref).sum(), [ref], create_graph=True)
    g_ref.square().sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (g,) = torch.autograd.grad(f(w).sum(), [w], create_graph=True)
        assert isinstance(g, XlaDTensor) and g.requires_grad
        g.square().sum().backward()
    torch.testing.assert_close(_full(g.detach()), g_ref.detach())
    torch.testing.assert_close(_full(w.grad), ref.grad)


def test_plain_backward_still_equals_eager(mesh):
    ref, model, x, xx = _pair(mesh)
    ref(x).square().sum().backward()
    model(xx).square().sum().backward()
    for name in ("weight", "bias"):
        got = getattr(model, name).grad
        assert isinstance(got, XlaDTensor) and got.placements == getattr(model, name).placements
        torch.testing.assert_close(_full(got), getattr(ref, name).grad)
    torch.testing.assert_close(xx.grad.cpu(), x.grad)


def test_backward_inputs_non_leaf_dtensor_gets_its_grad(mesh):
    ref, model, x, xx = _pair(mesh)
    out_ref, out = ref(x), model(xx)
    out_ref.square().sum().backward(inputs=[out_ref, ref.weight])
    out.square().sum().backward(inputs=[out, model.weight])
    assert isinstance(out.grad, XlaDTensor)
    torch.testing.assert_close(_full(out.grad), out_ref.grad)
    torch.testing.assert_close(_full(model.weight.grad), ref.weight.grad)
    assert model.bias.grad is None and xx.grad is None


def test_under_non_reentrant_checkpoint(mesh):
    # The recomputation runs inside the engine started here: it must see the forward's tensor types.
    ref, model, x, xx = _pair(mesh)
    expected = torch.autograd.grad(ref(x).square().sum(), [ref.weight, x])
    loss = torch.utils.checkpoint.checkpoint(model, xx, use_reentrant=False).square().sum()
    got = torch.autograd.grad(loss, [model.weight, xx])
    assert isinstance(got[0], XlaDTensor) and got[0].placements == model.weight.placements
    torch.testing.assert_close(_full(got[0]), expected[0])
    torch.testing.assert_close(got[1].cpu(), expected[1])


def test_backward_inputs_mixing_non_leaf_and_leaf_runs_the_leafs_hooks(mesh):
    # As torch: a non-leaf input retains its grad, a leaf accumulates through its own node (its hooks run).
    ref, model, x, xx = _pair(mesh)
    seen = []
    model.weight.register_post_accumulate_grad_hook(lambda p: seen.append(type(p.grad).__name__))
    out_ref, out = ref(x), model(xx)
    out_ref.square().sum().backward(inputs=[out_ref, ref.weight])
    out.square().sum().backward(inputs=[out, model.weight])
    assert seen == ["XlaDTensor"]
    assert out.retains_grad and out_ref.retains_grad
    torch.testing.assert_close(_full(out.grad), out_ref.grad)
    torch.testing.assert_close(_full(model.weight.grad), ref.weight.grad)
