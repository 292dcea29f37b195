"""Dispatch edge cases found by the OpInfo run (each compared with eager CPU torch)."""

from __future__ import annotations

import pytest
import torch

import spmdtorch
from spmdtorch.tensor import XlaTensor
from spmdtorch.tensor.dispatch import DeviceMismatchError, MetaFactoryLeak


def _both(fn, *cpu_args):
    """fn on CPU tensors and on xla copies; returns (xla result on CPU, CPU result)."""
    xla_args = [a.to("xla") if isinstance(a, torch.Tensor) else a for a in cpu_args]
    got = fn(*xla_args)
    want = fn(*cpu_args)
    return torch.utils._pytree.tree_map(lambda t: t.cpu() if isinstance(t, torch.Tensor) else t, got), want


def test_to_copy_on_meta_from_composites_stays_on_xla():
    """softmax(dtype=) casts with ``_to_copy(device=meta)`` from C++ (the storage device)."""
    x = torch.randn(3, 5)
    for dtype in (torch.float64, torch.bfloat16):
        got, want = _both(lambda t, dt=dtype: torch.softmax(t, 1, dtype=dt), x)
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, atol=1e-2 if dtype == torch.bfloat16 else 1e-6, rtol=1e-2)
    got, want = _both(lambda t: torch.log_softmax(t, 0, dtype=torch.float64), x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: torch.nn.functional.cosine_similarity(a, b, dim=1),
        lambda a, b: torch.cov(a),
        lambda a, b: torch.corrcoef(a),
        lambda a, b: torch.quantile(a, 0.3, dim=1),
        lambda a, b: torch.nn.functional.pairwise_distance(a, b),
    ],
    ids=["cosine_similarity", "cov", "corrcoef", "quantile", "pairwise_distance"],
)
def test_helper_tensors_made_inside_composites_land_on_xla(fn):
    """C++ composites build helpers from the input's options (device meta); they become xla tensors."""
    torch.manual_seed(0)
    a, b = torch.randn(4, 6), torch.randn(4, 6)
    got, want = _both(fn, a, b)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_a_real_meta_tensor_next_to_xla_still_raises():
    x = torch.ones(3, device="xla")
    with pytest.raises(DeviceMismatchError, match="xla:0 and meta") as info:
        x + torch.ones(3, device="meta")
    assert isinstance(info.value, MetaFactoryLeak)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: torch.masked_select(x, x > 0),
        lambda x: x[x > 0],
        lambda x: torch.nonzero(x),
        lambda x: torch.argwhere(x > 0),
        lambda x: torch.unique(x.round()),
        lambda x: torch.unique_consecutive(x.round(), return_counts=True),
        lambda x: torch.repeat_interleave(torch.tensor([1, 0, 3], device=x.device)),
        lambda x: torch.repeat_interleave(x[:3], torch.tensor([1, 0, 3], device=x.device), dim=0),
    ],
    ids=["masked_select", "bool_index", "nonzero", "argwhere", "unique", "unique_consecutive",
         "repeat_interleave_counts", "repeat_interleave_no_output_size"],
)
def test_data_dependent_shapes_fall_back_to_cpu_and_continue(fn):
    torch.manual_seed(0)
    x = torch.randn(4, 5) * 3
    got, want = _both(fn, x)
    torch.testing.assert_close(got, want)
    xla = fn(x.to("xla"))
    leaves = xla if isinstance(xla, tuple) else (xla,)
    assert all(isinstance(t, XlaTensor) for t in leaves)
    # The result is an ordinary xla tensor that later (lazy) ops consume.
    torch.testing.assert_close((leaves[0] * 2).cpu(), (want[0] if isinstance(want, tuple) else want) * 2)


def test_inplace_view_ops_whose_overload_names_differ():
    """``transpose_.default`` has the out-of-place twin ``transpose.int`` (stft uses it)."""
    src = torch.arange(6.0).reshape(2, 3)
    x = src.to("xla")
    x.transpose_(0, 1)
    assert x.shape == (3, 2)
    torch.testing.assert_close(x.cpu(), src.t())
    sig = torch.randn(64)
    got, want = _both(lambda s: torch.stft(s, 16, window=torch.hann_window(16, device=s.device),
                                           return_complex=True), sig)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_equal_and_allclose_return_python_bools():
    a = torch.tensor([1.0, 2.0, 3.0], device="xla")
    assert torch.equal(a, a.clone()) is True
    assert torch.equal(a, a + 1) is False
    assert torch.equal(a, a[:2]) is False
    assert torch.allclose(a, a + 1e-9) is True
    assert torch.allclose(a, a + 1) is False
    assert spmdtorch.debug.counter_value("aten::_local_scalar_dense") > 0
