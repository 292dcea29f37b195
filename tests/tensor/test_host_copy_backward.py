"""Backward through a host copy of an xla tensor (``x.cpu()``), against eager CPU torch.

A loss computed on the CPU from xla results (``F.mse_loss(out.cpu(), y)``)
must send its gradient back to the xla tensors, as with any device in torch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F


def test_sum_of_cpu_copy_backward_matches_cpu():
    x = torch.randn(8, 4)
    xx = x.to("xla").requires_grad_()
    (xx * xx).cpu().sum().backward()
    xc = x.clone().requires_grad_()
    (xc * xc).sum().backward()
    assert xx.grad.device.type == "xla"
    torch.testing.assert_close(xx.grad.cpu(), xc.grad)


@pytest.mark.parametrize("move", [lambda t: t.cpu(), lambda t: t.to("cpu"), lambda t: t.to("cpu", torch.float64)])
def test_cpu_loss_of_a_model_output_trains_like_cpu(move):
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 3)
    model = torch.nn.Linear(6, 3)
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    F.mse_loss(move(model(x.to("xla"))), y.to(move(torch.zeros(())).dtype)).backward()
    F.mse_loss(ref(x), y).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.device.type == "xla"
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_cpu_copy_of_a_non_leaf_inside_a_larger_graph():
    x = torch.randn(4, 4)
    xx = x.to("xla").requires_grad_()
    h = torch.tanh(xx)
    loss = (h.cpu() ** 2).sum() + h.sum().cpu()
    loss.backward()
    xc = x.clone().requires_grad_()
    hc = torch.tanh(xc)
    ((hc**2).sum() + hc.sum()).backward()
    torch.testing.assert_close(xx.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-6)
