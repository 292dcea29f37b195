"""NLL / cross-entropy with a floating-point class-index target on xla tensors.

PyTorch/XLA accepts float class indices (its nll_loss compares labels with the
class numbers in the labels' dtype), and its own test suite relies on it
(``nn.CrossEntropyLoss()(output, torch.zeros(n))``). spmdtorch reads such a
target as class indices; the reference is eager CPU torch given the same
indices as int64. A float target that is no whole number names no class: its
loss and gradient are NaN, never a truncated index's.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import spmdtorch


def _xla_loss_and_grad(fn, x, target, **kw):
    xx = x.detach().to("xla").requires_grad_()
    kw = {k: v.to("xla") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    loss = fn(xx, target.to("xla"), **kw)
    loss.sum().backward()
    return loss.detach().cpu(), xx.grad.cpu()


def _cpu_loss_and_grad(fn, x, target, **kw):
    xc = x.detach().clone().requires_grad_()
    loss = fn(xc, target, **kw)
    loss.sum().backward()
    return loss.detach(), xc.grad


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_cross_entropy_float_target_matches_int64_on_cpu(reduction, dtype):
    torch.manual_seed(0)
    x = torch.randn(10, 5)
    idx = torch.randint(0, 5, (10,))
    idx[3] = -100  # ignored, as with an int64 target
    weight = torch.rand(5) + 0.5
    got = _xla_loss_and_grad(F.cross_entropy, x, idx.to(dtype), weight=weight, reduction=reduction)
    want = _cpu_loss_and_grad(F.cross_entropy, x, idx, weight=weight, reduction=reduction)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_nll_loss_2d_float_target_matches_int64_on_cpu():
    torch.manual_seed(1)
    x = torch.randn(2, 3, 4, 5).log_softmax(1)
    idx = torch.randint(0, 3, (2, 4, 5))
    got = _xla_loss_and_grad(F.nll_loss, x, idx.float())
    want = _cpu_loss_and_grad(F.nll_loss, x, idx)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)


def test_unbatched_float_target():
    x = torch.randn(4)
    got = _xla_loss_and_grad(F.cross_entropy, x, torch.tensor(2.0))
    want = _cpu_loss_and_grad(F.cross_entropy, x, torch.tensor(2))
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_pytorch_xla_suite_pattern_trains_like_cpu():
    """The upstream suite's loop: Linear(128, 64) -> Linear(64, 1), CE with torch.zeros(n)."""
    torch.manual_seed(2)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    xla = torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
    xla.load_state_dict(cpu.state_dict())
    xla.to("xla")
    data = torch.randn(16, 8)
    target = torch.randint(0, 3, (16,))
    opt_c = torch.optim.SGD(cpu.parameters(), lr=0.5)
    opt_x = torch.optim.SGD(xla.parameters(), lr=0.5)
    for _ in range(3):
        for model, opt, d, t in (
            (cpu, opt_c, data, target),
            (xla, opt_x, data.to("xla"), target.float().to("xla")),
        ):
            opt.zero_grad()
            torch.nn.CrossEntropyLoss()(model(d), t).backward()
            opt.step()
        spmdtorch.sync()
    for (name, p), q in zip(cpu.named_parameters(), xla.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("bad", [1.5, -0.25, math.nan, math.inf])
def test_non_integral_float_target_gives_nan_not_a_truncated_class(bad):
    x = torch.randn(4, 3)
    target = torch.tensor([0.0, bad, 2.0, 1.0])
    loss, grad = _xla_loss_and_grad(F.cross_entropy, x, target, reduction="none")
    assert torch.isnan(loss[1]) and torch.isnan(grad[1]).all()
    # The other samples are untouched.
    keep = torch.tensor([0, 2, 3])
    want_loss, want_grad = _cpu_loss_and_grad(F.cross_entropy, x[keep], target[keep].long(), reduction="none")
    torch.testing.assert_close(loss[keep], want_loss)
    torch.testing.assert_close(grad[keep], want_grad)
    # Reduced, the NaN shows in the loss itself.
    mean_loss, _ = _xla_loss_and_grad(F.cross_entropy, x, target)
    assert torch.isnan(mean_loss)
