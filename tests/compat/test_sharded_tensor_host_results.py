"""Host results of ops on an ``XLAShardedTensor`` keep PyTorch/XLA's return form.

PyTorch/XLA's ``XLAShardedTensor.__torch_dispatch__`` wraps every tensor an op
returns, so ``xst.cpu()`` is a wrapper too and its users read
``xst.cpu().global_tensor`` (PyTorch/XLA's test_dtensor_integration3 does).
Values are compared with eager CPU torch.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch


@pytest.fixture
def xs():
    import torch_xla.distributed.spmd as xs

    return xs


def _sharded(xs, t):
    return xs.mark_sharding(t.to("xla"), xs.Mesh(np.arange(8), (8, 1)), (0, None))


def test_cpu_of_a_sharded_tensor_has_global_tensor(xs):
    t = torch.randn(8, 4)
    out = (_sharded(xs, t) * 2).cpu()
    assert out.device.type == "cpu"
    g = out.global_tensor
    assert type(g) is torch.Tensor
    np.testing.assert_allclose(g.numpy(), (t * 2).numpy(), rtol=1e-6)
    assert repr(out).startswith("XLAShardedTensor(tensor(")
    assert out.to("cpu").global_tensor.shape == (8, 4)


def test_ops_on_the_host_result_stay_wrapped_and_compute_as_cpu(xs):
    t = torch.randn(8, 4)
    host = _sharded(xs, t).cpu()
    y = torch.relu(host) + 1
    assert hasattr(y, "global_tensor") and y.device.type == "cpu"
    torch.testing.assert_close(y.global_tensor, torch.relu(t) + 1)
    assert host.add_(1) is host  # in place: the same object comes back
    torch.testing.assert_close(host.global_tensor, t + 1)
    assert bool(torch.allclose(host, t + 1))


def test_host_result_moves_back_to_xla_as_an_xla_tensor(xs):
    import spmdtorch

    t = torch.arange(8.0).reshape(8, 1)
    back = _sharded(xs, t).cpu().to("xla")
    assert back.device.type == "xla" and not hasattr(back, "global_tensor")
    spmdtorch.sync()
    torch.testing.assert_close(back.cpu(), t)


def test_host_result_with_a_0d_operand_in_an_xla_op(xs):
    t = torch.randn(8, 4)
    xst = _sharded(xs, t)
    scale = xst.cpu().sum()  # a 0-d host tensor, as torch allows in xla ops
    out = xst.global_tensor * scale
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), t * t.sum(), rtol=1e-5, atol=1e-5)


def test_host_result_saves_as_a_plain_tensor(xs):
    t = torch.randn(8, 4)
    buf = io.BytesIO()
    torch.save({"w": _sharded(xs, t).cpu()}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)  # weights_only refuses unknown tensor subclasses
    assert type(loaded["w"]) is torch.Tensor
    torch.testing.assert_close(loaded["w"], t)


def test_host_result_keeps_autograd_history(xs):
    t = torch.randn(8, 4)
    w = t.to("xla").requires_grad_()
    xst = xs.mark_sharding(w, xs.Mesh(np.arange(8), (8, 1)), (0, None))
    host = (xst * w).cpu()
    assert host.requires_grad and host.grad_fn is not None
    host.sum().backward()  # the wrapper is a leaf of its own (PyTorch/XLA's rule): d/dw sum(xst * w) = xst
    torch.testing.assert_close(w.grad.cpu(), t)
