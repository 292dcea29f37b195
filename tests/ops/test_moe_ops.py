"""The ops of mixture-of-experts layers on the device, against eager CPU torch.

``histc`` (float and integer inputs), ``bincount`` and ``F.grouped_mm``
(``aten._grouped_mm``, lowered to ``jax.lax.ragged_dot``) in all four of its
layouts, forward and backward. None of them may take the CPU fallback.
"""

import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch import debug


@pytest.mark.parametrize(
    "x,kw",
    [
        (torch.rand(1000), dict(bins=10, min=0, max=1)),
        (torch.randn(1000), dict(bins=7)),
        (torch.randn(1000), dict(bins=7, min=-1, max=1)),
        (torch.tensor([1.0, 1.0, 1.0]), dict(bins=4)),
        (torch.tensor([1.0, 2.0, 3.0]), dict(bins=4, min=2, max=2)),
        (torch.tensor([0.1, 0.2, 0.3, 0.7, 0.9, 1.0]), dict(bins=10, min=0, max=1)),
        (torch.tensor([float("nan"), 1.0, 2.0]), dict(bins=4, min=0, max=3)),
        (torch.arange(30.0).reshape(5, 6), dict(bins=9, min=3, max=25)),
        (torch.tensor([]), dict(bins=4)),
        (torch.randn(100).bfloat16(), dict(bins=5)),
    ],
)
def test_histc_float_matches_eager(x, kw):
    want = torch.histc(x, **kw)
    got = torch.histc(x.to("xla"), **kw)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("kw", [dict(bins=8, min=0, max=7), dict(bins=3, min=1, max=6), dict(bins=5)])
def test_histc_of_integers_on_device(dtype, kw):
    """CPU has no integer histc; the counts equal those of the same values as floats."""
    ids = torch.randint(0, 8, (257,), dtype=dtype)
    before = debug.counter_value("aten::histc")
    got = torch.histc(ids.to("xla"), **kw)
    assert got.dtype == dtype
    torch.testing.assert_close(got.cpu(), torch.histc(ids.float(), **kw).to(dtype), rtol=0, atol=0)
    assert debug.counter_value("aten::histc") == before, "histc took the CPU fallback"


def test_histc_under_compile_and_errors():
    @spmdtorch.compile
    def count(ids):
        return torch.histc(ids, bins=4, min=0, max=3)

    ids = torch.tensor([0, 1, 1, 3, 3, 3], dtype=torch.int32)
    for _ in range(3):
        got = count(ids.to("xla"))
    torch.testing.assert_close(got.cpu(), torch.tensor([1, 2, 0, 3], dtype=torch.int32))
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(torch.ones(3, device="xla"), bins=3, min=2, max=1)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"minlength": 20},
        {"weights": torch.randn(50)},
        {"weights": torch.randint(0, 4, (50,))},
        {"weights": torch.randn(50, dtype=torch.float64)},
    ],
)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_bincount_matches_eager(kw, dtype):
    x = torch.randint(0, 9, (50,), dtype=dtype)
    want = torch.bincount(x, **kw)
    xkw = {k: v.to("xla") if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    got = torch.bincount(x.to("xla"), **xkw)
    assert got.dtype == want.dtype and got.shape == want.shape
    # float64 lives as float32 on the device (docs/design.md, hazard "64-bit types").
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


def test_bincount_edges():
    empty = torch.tensor([], dtype=torch.long)
    torch.testing.assert_close(torch.bincount(empty.to("xla"), minlength=3).cpu(), torch.bincount(empty, minlength=3))
    assert torch.bincount(empty.to("xla")).shape == (0,)
    with pytest.raises(RuntimeError, match="non-negative"):
        torch.bincount(torch.tensor([-1, 2]).to("xla"))
    with pytest.raises(RuntimeError, match="1-d"):
        torch.bincount(torch.ones(2, 2, dtype=torch.long).to("xla"))


OFFS = torch.tensor([2, 5, 5, 8], dtype=torch.int32)  # one empty group


def _grouped_case(a, b, offs, keep=(slice(None),)):
    """Forward and both gradients of ``F.grouped_mm`` on xla vs CPU; ``keep`` selects
    the region of the output and of ``a``'s gradient that torch defines (it leaves
    rows past ``offs[-1]`` uninitialised)."""
    a, b = a.clone().requires_grad_(), b.clone().requires_grad_()
    out = F.grouped_mm(a, b, offs=offs)
    g = torch.zeros_like(out)
    g[keep] = torch.randn_like(out[keep])
    out.backward(g)
    xa, xb = a.detach().to("xla").requires_grad_(), b.detach().to("xla").requires_grad_()
    xout = F.grouped_mm(xa, xb, offs=None if offs is None else offs.to("xla"))
    xout.backward(g.to("xla"))
    assert xout.shape == out.shape and xout.dtype == out.dtype
    torch.testing.assert_close(xout.cpu()[keep], out.detach()[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xa.grad.cpu()[keep], a.grad[keep], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xb.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


def test_grouped_mm_ragged_rows():  # (M, K) x (G, K, N): the MoE forward
    _grouped_case(torch.randn(8, 8), torch.randn(4, 8, 4), OFFS)


def test_grouped_mm_ragged_rows_with_tail():  # rows past offs[-1] belong to no group
    offs = torch.tensor([2, 5, 5, 7], dtype=torch.int32)
    _grouped_case(torch.randn(12, 8), torch.randn(4, 8, 4), offs, keep=(slice(0, 7),))
    got = F.grouped_mm(torch.randn(12, 8).to("xla"), torch.randn(4, 8, 4).to("xla"), offs=offs.to("xla"))
    assert (got.cpu()[7:] == 0).all()


def test_grouped_mm_ragged_contraction():  # (M, K) x (K, N) -> (G, M, N): the weight gradient
    _grouped_case(torch.randn(4, 8), torch.randn(8, 4), OFFS)


def test_grouped_mm_ragged_columns():  # (G, M, K) x (K, N)
    _grouped_case(torch.randn(4, 4, 8), torch.randn(8, 8), OFFS)


def test_grouped_mm_batched():  # (G, M, K) x (G, K, N), no offs
    _grouped_case(torch.randn(4, 4, 8), torch.randn(4, 8, 4), None)


def test_grouped_mm_transposed_weight_view_and_bfloat16():
    """HF passes ``weight.transpose(-2, -1)`` (a view); bf16 accumulates in f32."""
    a, w = torch.randn(8, 8), torch.randn(4, 8, 8)  # (G, N, K) stored, used as (G, K, N)
    want = F.grouped_mm(a, w.transpose(-2, -1), offs=OFFS)
    got = F.grouped_mm(a.to("xla"), w.to("xla").transpose(-2, -1), offs=OFFS.to("xla"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
    ab, wb = a.bfloat16(), w.bfloat16()
    want = F.grouped_mm(ab, wb.transpose(-2, -1), offs=OFFS)
    got = F.grouped_mm(ab.to("xla"), wb.to("xla").transpose(-2, -1), offs=OFFS.to("xla"))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu(), want, rtol=1.6e-2, atol=1e-2)
    # out_dtype=float32 (CUDA's f32 output; the CPU kernel refuses it): the
    # f32 product of the bf16 values.
    got = F.grouped_mm(ab.to("xla"), wb.to("xla").transpose(-2, -1), offs=OFFS.to("xla"), out_dtype=torch.float32)
    want = F.grouped_mm(ab.float(), wb.float().transpose(-2, -1), offs=OFFS)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_grouped_mm_shape_errors():
    x = torch.randn(8, 8, device="xla")
    with pytest.raises(RuntimeError, match="offs is required"):
        F.grouped_mm(x, torch.randn(4, 8, 4, device="xla"))
    with pytest.raises(RuntimeError, match="contraction dims differ"):
        F.grouped_mm(x, torch.randn(4, 4, 4, device="xla"), offs=OFFS.to("xla"))
    with pytest.raises(RuntimeError, match="int32"):
        F.grouped_mm(x, torch.randn(4, 8, 4, device="xla"), offs=OFFS.long().to("xla"))
