"""``F.linear`` of xla tensors is one op each way (spmdtorch::linear and its two gradient products).

torch would record about twelve ATen calls per layer (transposes, views,
``mm`` of the flattened input and their gradients); the override records
one forward and two backward products that keep every leading dim, the
products ``jax.grad`` of ``x @ w.T`` has. Values and gradients (first and
second order) are compared with eager CPU; the cases the override does not
take must keep torch's behaviour, errors included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def _pair(in_features=4, out_features=6, bias=True, dtype=torch.float32):
    torch.manual_seed(0)
    cpu = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    xla = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype).to("xla")
    xla.load_state_dict(cpu.state_dict())
    return cpu, xla


def _tol(dtype):
    return {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}


@pytest.mark.parametrize("bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("shape", [(4,), (5, 4), (2, 3, 4), (2, 2, 3, 4)], ids=lambda s: f"{len(s)}d")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_linear_equals_eager(shape, bias, dtype):
    cpu, xla = _pair(bias=bias, dtype=dtype)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    ref, out = cpu(x), xla(xx)
    assert type(out.grad_fn).__name__ == "LinearFnBackward"
    ref.float().square().sum().backward()
    out.float().square().sum().backward()
    tol = _tol(dtype)
    torch.testing.assert_close(out.cpu(), ref.detach(), **tol)
    torch.testing.assert_close(xx.grad.cpu(), x.grad, **tol)
    torch.testing.assert_close(xla.weight.grad.cpu(), cpu.weight.grad, **tol)
    if bias:
        torch.testing.assert_close(xla.bias.grad.cpu(), cpu.bias.grad, **tol)


def test_frozen_weight_and_input_without_grad():
    cpu, xla = _pair()
    for mod in (cpu, xla):
        mod.weight.requires_grad_(False)
    x = torch.randn(2, 3, 4, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    cpu(x).sum().backward()
    xla(xx).sum().backward()
    assert xla.weight.grad is None
    torch.testing.assert_close(xx.grad.cpu(), x.grad)
    torch.testing.assert_close(xla.bias.grad.cpu(), cpu.bias.grad)
    with torch.no_grad():
        assert xla(xx).grad_fn is None


def test_second_derivatives_equal_eager():
    """A gradient penalty differentiates the backward products themselves."""
    cpu, xla = _pair(4, 3)

    def penalty(mod, x):
        (g,) = torch.autograd.grad(torch.tanh(mod(x)).sum(), x, create_graph=True)
        return g.square().sum()

    x = torch.randn(2, 5, 4, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    ref, out = penalty(cpu, x), penalty(xla, xx)
    ref.backward()
    out.backward()
    torch.testing.assert_close(out.cpu(), ref.detach())
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xla.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xla.bias.grad.cpu(), cpu.bias.grad, rtol=1e-5, atol=1e-5)


def test_one_op_each_way():
    """A layer's forward and backward record three products and the bias's sum, not ~12 ATen calls."""
    _, xla = _pair()
    x = torch.randn(2, 3, 4).to("xla")
    spmdtorch.sync()
    before = debug.counter_value("DispatchedOps")
    with spmdtorch.step():
        xla(x).sum().backward()
    # linear, its two gradient products, the bias's sum, and the loss's sum and its backward (expand).
    recorded = debug.counter_value("DispatchedOps") - before
    assert recorded <= 8, recorded


def test_program_keeps_leading_dims():
    """The weight's gradient contracts the input's leading dims in place: no reshape to 2-d."""
    w = torch.randn(6, 4).to("xla").requires_grad_()
    x = torch.randn(2, 3, 4).to("xla")
    F.linear(x, w).sum().backward()
    hlo = debug.get_stablehlo([w.grad])
    assert "contracting_dims = [0, 1] x [0, 1]" in hlo, hlo
    assert "stablehlo.reshape" not in hlo


def test_autocast_bfloat16():
    _, xla = _pair()
    x = torch.randn(2, 3, 4)
    with torch.autocast("xla", dtype=torch.bfloat16):
        out = xla(x.to("xla"))
    assert out.dtype == torch.bfloat16
    w, b = xla.weight.detach().cpu(), xla.bias.detach().cpu()
    torch.testing.assert_close(out.cpu().float(), F.linear(x, w, b), rtol=2e-2, atol=5e-2)


def test_sharded_weight_and_batch(devices8):
    """FSDP-style: weight rows and batch sharded over one axis, gradients equal eager."""
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    cpu, xla = _pair(4, 16)
    mark_sharding(xla.weight, mesh, ("fsdp", None))
    x = torch.randn(8, 3, 4, requires_grad=True)
    xx = mark_sharding(x.detach().to("xla"), mesh, ("fsdp", None, None)).requires_grad_()
    cpu(x).square().sum().backward()
    xla(xx).square().sum().backward()
    torch.testing.assert_close(xla.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)


def test_cases_torch_takes_keep_its_behaviour():
    w = torch.randn(6, 4)
    x = torch.randn(2, 4)
    # Mixed dtypes: not the override's (torch's path: its mm lowering then promotes).
    mixed = F.linear(x.double().to("xla").requires_grad_(), w.to("xla"))
    assert type(mixed.grad_fn).__name__ != "LinearFnBackward"
    # Shape mismatch: torch's path reports it.
    with pytest.raises(RuntimeError, match=r"2x5 and 4x6|\[2, 5\] X \[4, 6\]"):  # torch's meta kernel words it
        F.linear(torch.randn(2, 5).to("xla"), w.to("xla")).cpu()
    # A 1-d weight (torch allows it) and integer tensors take torch's path and agree.
    v = torch.randn(4)
    torch.testing.assert_close(F.linear(x.to("xla"), v.to("xla")).cpu(), F.linear(x, v))
    xi, wi = torch.randint(-3, 3, (2, 4)), torch.randint(-3, 3, (6, 4))
    torch.testing.assert_close(F.linear(xi.to("xla"), wi.to("xla")).cpu(), F.linear(xi, wi))


def test_steps_aside_under_non_reentrant_checkpoint():
    """torch.utils.checkpoint recomputes on torch's path: the forward must save what it saves."""
    from torch.utils.checkpoint import checkpoint

    cpu, xla = _pair()
    x = torch.randn(2, 3, 4, requires_grad=True)
    xx = x.detach().to("xla").requires_grad_()
    cpu(x).square().sum().backward()
    checkpoint(lambda t: xla(t).square().sum(), xx, use_reentrant=False).backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xla.weight.grad.cpu(), cpu.weight.grad, rtol=1e-5, atol=1e-5)


def test_cpu_tensors_untouched():
    """On CPU tensors F.linear is torch's (its own autograd node); the ops are torch's products."""
    lin = torch.nn.Linear(4, 6)
    x = torch.randn(3, 4, requires_grad=True)
    assert "Addmm" in type(lin(x).grad_fn).__name__
    w = lin.weight.detach().requires_grad_()
    torch.ops.spmdtorch.linear(x, w).sum().backward()
    torch.testing.assert_close(w.grad, torch.ones(3, 6).T @ x.detach())
    g = torch.randn(3, 6)
    torch.testing.assert_close(torch.ops.spmdtorch.linear_input_grad(g, lin.weight), g @ lin.weight)
    torch.testing.assert_close(torch.ops.spmdtorch.linear_weight_grad(g, x), g.T @ x)
