"""``torch_xla.experimental.gradient_accumulation`` against an eager CPU loop that accumulates gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import spmdtorch
from spmdtorch.compat._gradient_accumulation import GradientAccumulationError

TOL = {"rtol": 1e-5, "atol": 1e-6}


def make_models(seed=0, frozen=False):
    torch.manual_seed(seed)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    if frozen:
        cpu[0].bias.requires_grad_(False)
    return cpu, copy.deepcopy(cpu).to("xla")


def eager_accumulate(model, loss_fn, data, target, *carried):
    """PyTorch/XLA's documented semantics, run eagerly: each loss / N, backward, gradients summed."""
    n = data.shape[0]
    total = torch.zeros(())
    for i in range(n):
        loss = loss_fn(model(data[i]), target[i])
        if carried:
            carried = (carried[0] + loss.detach(), carried[1] * 2)
        loss = loss / n
        loss.backward()
        total = total + loss.detach()
    return (total, *carried) if carried else total


def test_loss_grads_and_carried_match_eager_loop(devices8):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    cpu, xla = make_models(frozen=True)
    data, target = torch.randn(5, 6, 4), torch.randint(0, 3, (5, 6))
    loss_fn = nn.CrossEntropyLoss()
    # Gradients already present are added to, as in PyTorch/XLA.
    for m in (cpu, xla):
        m[2].weight.grad = torch.full_like(m[2].weight, 0.25)
    ref_loss, ref_a, ref_b = eager_accumulate(cpu, loss_fn, data, target, torch.zeros(()), torch.ones(2))

    def train_step(x, y, a, b):
        loss = loss_fn(xla(x), y)
        return loss, a + loss.detach(), b * 2

    loss, a, b = gradient_accumulation(
        train_step,
        (data.to("xla"), target.to("xla")),
        xla,
        torch.zeros((), device="xla"),
        torch.ones(2, device="xla"),
    )
    torch.testing.assert_close(loss.cpu(), ref_loss, **TOL)
    torch.testing.assert_close(a.cpu(), ref_a, **TOL)  # carried tensors keep their order
    torch.testing.assert_close(b.cpu(), ref_b, **TOL)
    for (name, p), q in zip(xla.named_parameters(), cpu.parameters()):
        if not q.requires_grad:
            assert p.grad is None, name
            continue
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL)


def test_no_carried_tensors_returns_the_loss_and_trains_like_eager(devices8):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    cpu, xla = make_models(seed=3)
    opt_c, opt_x = torch.optim.SGD(cpu.parameters(), lr=0.5), torch.optim.SGD(xla.parameters(), lr=0.5)
    loss_fn = nn.MSELoss()
    for step in range(2):
        torch.manual_seed(10 + step)
        data, target = torch.randn(3, 2, 4), torch.randn(3, 2, 3)
        ref = eager_accumulate(cpu, loss_fn, data, target)
        got = gradient_accumulation(lambda x, y: loss_fn(xla(x), y), (data.to("xla"), target.to("xla")), xla)
        assert isinstance(got, torch.Tensor)
        torch.testing.assert_close(got.cpu(), ref, **TOL)
        opt_c.step(), opt_x.step()
        opt_c.zero_grad(), opt_x.zero_grad()
    for p, q in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **TOL)


def test_inside_a_compiled_step(devices8):
    import torch_xla
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    cpu, xla = make_models(seed=5)
    loss_fn = nn.MSELoss()

    def step(data, target):
        return gradient_accumulation(lambda x, y: loss_fn(xla(x), y), (data, target), xla)

    compiled = torch_xla.compile(step)
    for seed in range(3):
        torch.manual_seed(seed)
        data, target = torch.randn(4, 2, 4), torch.randn(4, 2, 3)
        for m in (cpu, xla):
            m.zero_grad(set_to_none=True)
        ref = eager_accumulate(cpu, loss_fn, data, target)
        got = compiled(data.to("xla"), target.to("xla"))
        torch.testing.assert_close(got.cpu(), ref, **TOL)
        torch.testing.assert_close(xla[0].weight.grad.cpu(), cpu[0].weight.grad, **TOL)


def test_bad_arguments_raise_named_value_errors(devices8):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    _, xla = make_models()
    x = torch.randn(3, 2, 4, device="xla")

    def step(v, *carried):
        return xla(v).sum()

    with pytest.raises(GradientAccumulationError, match="cannot be empty"):
        gradient_accumulation(step, (), xla)
    with pytest.raises(ValueError, match="element 1 of iterable_tensors has inconsistent first dimension: 2"):
        gradient_accumulation(step, (x, torch.zeros(2, 3, device="xla")), xla)
    with pytest.raises(GradientAccumulationError, match=r"element 0 of iterable_tensors is a list"):
        gradient_accumulation(step, ([1, 2],), xla)
    with pytest.raises(GradientAccumulationError, match=r"element 0 of iterable_tensors is empty"):
        gradient_accumulation(step, (torch.zeros(0, 2, device="xla"),), xla)
    with pytest.raises(GradientAccumulationError, match="model must be a torch.nn.Module"):
        gradient_accumulation(step, (x,), "model")
    with pytest.raises(GradientAccumulationError, match=r"\(loss, \*carried\) with 1 carried"):
        gradient_accumulation(step, (x,), xla, torch.zeros(1, device="xla"))
    with pytest.raises(GradientAccumulationError, match="one-element tensor, got shape"):
        gradient_accumulation(lambda v: xla(v), (x,), xla)


def test_a_random_train_step_is_refused_by_name(devices8):
    from torch_xla.experimental.gradient_accumulation import gradient_accumulation

    _, xla = make_models()
    drop = nn.Dropout(0.5).train()
    with pytest.raises(spmdtorch.ScanError, match="random"):
        gradient_accumulation(lambda v: drop(xla(v)).sum(), (torch.randn(2, 2, 4, device="xla"),), xla)
