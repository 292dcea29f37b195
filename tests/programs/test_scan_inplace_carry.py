"""spmdtorch.scan with a body that updates its carry (or its x) in place, against eager CPU torch.

PyTorch/XLA's ``scan`` traces the body on copies of the carry and of x: the
body's *returned* carry is what flows to the next iteration, and the caller's
``init``/``xs`` are never written. The eager reference is therefore the loop
``carry, y = fn(carry.clone(), x.clone())``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils import _pytree as pytree

import spmdtorch

TOL = {"rtol": 1e-5, "atol": 1e-6}


def eager_scan(fn, init, xs):
    """The reference: fn on copies of the carry and of x, the returned carry flowing on."""
    carry, ys = init, []
    n = pytree.tree_leaves(xs)[0].shape[0]
    for i in range(n):
        c = pytree.tree_map(torch.clone, carry)
        x = pytree.tree_map(lambda t, i=i: t[i].clone(), xs)
        carry, y = fn(c, x)
        ys.append(y)
    return carry, pytree.tree_map(lambda *t: torch.stack(t), *ys)


def cumsum(acc, x):
    acc += x
    return acc, acc


def view_update(carry, x):
    carry[0] += x.sum()  # in place through a view of the carry
    carry.mul_(0.5)
    return carry, carry[1:] * 2


def mutates_x_returns_other(carry, x):
    x.add_(1.0)  # x is the body's own
    carry.add_(100.0)  # discarded: the returned carry is a new tensor
    return x * 2 + 0 * carry.detach(), x.clone()


def dict_carry(carry, x):
    carry["sum"].add_(x)
    carry["count"] += 1.0
    return carry, carry["sum"] / carry["count"]


@pytest.mark.parametrize(
    "fn,init_shape,xs_shape",
    [(cumsum, (3,), (4, 3)), (view_update, (4,), (5, 2)), (mutates_x_returns_other, (3,), (4, 3))],
    ids=["cumsum", "view_update", "mutates_x"],
)
def test_inplace_body_matches_eager_and_keeps_caller_tensors(devices8, fn, init_shape, xs_shape):
    torch.manual_seed(0)
    init, xs = torch.randn(init_shape), torch.randn(xs_shape)
    ref_c, ref_y = eager_scan(fn, init, xs)
    xi, xx = init.to("xla"), xs.to("xla")
    c, y = spmdtorch.scan(fn, xi, xx)
    torch.testing.assert_close(c.cpu(), ref_c, **TOL)
    torch.testing.assert_close(y.cpu(), ref_y, **TOL)
    # The caller's tensors are untouched, both before and after the result is read.
    torch.testing.assert_close(xi.cpu(), init, rtol=0, atol=0)
    torch.testing.assert_close(xx.cpu(), xs, rtol=0, atol=0)


def test_inplace_pytree_carry(devices8):
    init = {"sum": torch.zeros(1), "count": torch.zeros(1)}
    xs = torch.arange(1.0, 6.0)
    ref_c, ref_y = eager_scan(dict_carry, init, xs)
    xinit = {k: v.to("xla") for k, v in init.items()}
    c, y = spmdtorch.scan(dict_carry, xinit, xs.to("xla"))
    for k in ref_c:
        torch.testing.assert_close(c[k].cpu(), ref_c[k], **TOL)
        torch.testing.assert_close(xinit[k].cpu(), init[k], rtol=0, atol=0)
    torch.testing.assert_close(y.cpu(), ref_y, **TOL)


def scale_inplace(carry, x):
    carry.mul_(torch.tanh(x))
    carry.add_(x)
    return carry, carry.sum(-1)


def test_inplace_body_gradients_match_eager(devices8):
    """Autograd through a body that updates a carry requiring grad in place (a leaf would refuse it)."""
    torch.manual_seed(1)
    h0, xs = torch.randn(2, 3), torch.randn(4, 2, 3)
    r0, rx = h0.clone().requires_grad_(), xs.clone().requires_grad_()
    ref_c, ref_y = eager_scan(scale_inplace, r0, rx)
    (ref_c.pow(2).sum() + ref_y.sum()).backward()

    a0, ax = h0.to("xla").requires_grad_(), xs.to("xla").requires_grad_()
    c, y = spmdtorch.scan(scale_inplace, a0, ax)
    (c.pow(2).sum() + y.sum()).backward()
    torch.testing.assert_close(c.detach().cpu(), ref_c.detach(), **TOL)
    torch.testing.assert_close(a0.grad.cpu(), r0.grad, **TOL)
    torch.testing.assert_close(ax.grad.cpu(), rx.grad, **TOL)
    torch.testing.assert_close(a0.detach().cpu(), h0, rtol=0, atol=0)


def test_inplace_carry_under_compile(devices8):
    """The same body inside a compiled step: recorded once, same values, caller's carry kept."""

    @spmdtorch.compile
    def step(init, xs):
        return spmdtorch.scan(cumsum, init, xs)

    for seed in (0, 1):
        torch.manual_seed(seed)
        init, xs = torch.randn(3), torch.randn(4, 3)
        ref_c, ref_y = eager_scan(cumsum, init, xs)
        xi = init.to("xla")
        c, y = step(xi, xs.to("xla"))
        torch.testing.assert_close(c.cpu(), ref_c, **TOL)
        torch.testing.assert_close(y.cpu(), ref_y, **TOL)
        torch.testing.assert_close(xi.cpu(), init, rtol=0, atol=0)
