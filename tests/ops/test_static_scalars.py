"""Lowerings whose scalar arguments choose the formula must see Python numbers.

The engine lifts ``Scalar``/``float`` arguments to 0-d runtime inputs unless a
lowering is registered with ``lift_scalars=False``; a lowering that branches on
such a value in Python (``if p == 0``) would silently take its generic path.
These run end to end on xla tensors (found by tools/opinfo_report.py).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import spmdtorch  # noqa: F401

aten = torch.ops.aten


def _close(fn, *args, **kw):
    want = fn(*args, **kw)
    got = fn(*[a.to("xla") if isinstance(a, torch.Tensor) else a for a in args], **kw)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5, equal_nan=True)


X = torch.randn(3, 4, 5).masked_fill(torch.rand(3, 4, 5) > 0.6, 0.0)
Y = torch.randn(3, 6, 5)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 3.0, float("inf"), float("-inf")])
def test_vector_norm_orders(p):
    _close(torch.linalg.vector_norm, X, p, dim=-1)
    _close(torch.norm, X, p)
    _close(F.normalize, X, p=p if p > 0 else 0.0, dim=-1)


@pytest.mark.parametrize("p", [0.0, 1.0, 2.0, 0.5, float("inf")])
def test_cdist_pdist_orders(p):
    _close(torch.cdist, X, Y, p)
    _close(F.pdist, X[0], p)


def test_group_norm_empty_batch():
    w, b = torch.randn(4), torch.randn(4)
    _close(F.group_norm, torch.randn(0, 4, 3), 2, w, b)
    _close(F.group_norm, torch.randn(0, 4), 1, w, b)


def test_sdpa_dropout_is_applied():
    q = torch.randn(1, 2, 4, 8).to("xla")
    dropped = F.scaled_dot_product_attention(q, q, q, dropout_p=0.5).cpu()
    out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.0)
    want = F.scaled_dot_product_attention(q.cpu(), q.cpu(), q.cpu())
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(dropped, want)


@pytest.mark.parametrize(
    "name",
    [
        "linalg_vector_norm.default",
        "norm.ScalarOpt_dim",
        "_cdist_forward.default",
        "_pdist_forward.default",
        "_scaled_dot_product_attention_math.default",
    ],
)
def test_registered_without_lifting(name):
    from spmdtorch.ops.registry import LOWERINGS, resolve_ops

    (op,) = resolve_ops(name)
    assert LOWERINGS[op].lift_scalars is False


@pytest.mark.parametrize("shapes", [((), (1,)), ((), ()), ((5,), (2, 0)), ((5,), (0,)), ((4, 3), (2, 3))])
def test_gather_edge_ranks(shapes):
    """0-d self with a 1-element index, and empty indices of another rank (OpInfo samples)."""
    x = torch.randn(shapes[0])
    idx = torch.zeros(shapes[1], dtype=torch.long)
    _close(torch.gather, x, 0, idx)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear"])
def test_interpolate_scale_factor(mode):
    x = torch.randn(1, 2, 5, 7)
    _close(F.interpolate, x, scale_factor=1.7, mode=mode)
    _close(F.interpolate, x, scale_factor=0.6, mode=mode, recompute_scale_factor=False)


_POW_INPUT = torch.tensor([-3.5, -1.0, -0.0, 0.0, 0.25, 1.0, 2.5, 1e20, float("inf"), float("-inf"), float("nan")])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("e", [0, 1, 2, 3, 0.5, -1, -2, 2.0, -1.0])
def test_pow_special_exponents_match_eager_bitwise(e, dtype):
    """torch computes these exponents without a general pow (x*x, sqrt, 1/x...): so must we, bit for bit."""
    x = _POW_INPUT.to(dtype)
    got = x.to("xla").pow(e).cpu()
    torch.testing.assert_close(got, x.pow(e), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("e", [1.5, 4, -3, 0.3, -0.5])
def test_pow_other_exponents_stay_lifted(e):
    """Any other exponent is a runtime input: changing it reuses the compiled program."""
    from spmdtorch import debug

    x = torch.rand(6) + 0.5
    xx = x.to("xla")
    torch.testing.assert_close(xx.pow(e).cpu(), x.pow(e), rtol=1e-6, atol=1e-6)
    before = debug.counter_value("UncachedCompile")
    torch.testing.assert_close(xx.pow(e + 0.25).cpu(), x.pow(e + 0.25), rtol=1e-6, atol=1e-6)
    assert debug.counter_value("UncachedCompile") == before


@pytest.mark.parametrize("e", [0, 1, 2, 3, 2.0, 0.5])
def test_pow_special_exponents_integer_tensors(e):
    x = torch.tensor([-7, -1, 0, 1, 3, 46340], dtype=torch.int32)
    got = x.to("xla").pow(e).cpu()
    want = x.pow(e)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0, equal_nan=True)


def test_pow_square_is_a_multiply_in_the_program():
    """``x.pow(2)`` (RMSNorm, its backward's ``pow(x, 1)``) must not leave XLA a general pow."""
    from spmdtorch import debug

    x = (torch.randn(4, 8) + 1).requires_grad_()
    xx = x.detach().to("xla").requires_grad_()
    y = xx.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
    y.sum().backward()
    hlo = debug.get_hlo_text([y, xx.grad])
    assert " power(" not in hlo
    x.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt().sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), x.grad, rtol=1e-6, atol=1e-6)


def test_static_numbers_equal_in_python_are_different_programs():
    """``2 == 2.0 == True`` and ``0.0 == -0.0`` in Python, but torch gives different results for them."""
    assert torch.arange(3, device="xla").dtype == torch.int64
    b = torch.arange(3.0, device="xla")
    assert b.dtype == torch.float32
    torch.testing.assert_close(b.cpu(), torch.arange(3.0))
    assert torch.full((2,), 1, device="xla").dtype == torch.int64
    assert torch.full((2,), True, device="xla").dtype == torch.bool
    x = torch.randn(4).to("xla")
    assert torch.equal(x.pow(2).cpu(), x.cpu().pow(2))
    assert torch.equal(x.pow(2.0).cpu(), x.cpu().pow(2.0))
    i = torch.arange(-2, 3, dtype=torch.int32)
    assert i.to("xla").pow(2).dtype == torch.int32
    assert i.to("xla").pow(2.0).dtype == torch.float32


def test_lerp_number_weight_picks_one_formula_on_the_host():
    """A Python-number weight (AdamW's ``1 - beta1``): one formula, no per-element select between two."""
    from spmdtorch import debug

    a, b = torch.randn(64), torch.randn(64)
    xa, xb = a.to("xla"), b.to("xla")
    for w in (0.1, 0.9):
        hlo = debug.get_stablehlo([torch.lerp(xa, xb, w)])
        assert "select" not in hlo, w
        assert "abs" not in hlo, w
    # A 0-d tensor weight is only known on the device: both formulas, selected there.
    assert "select" in debug.get_stablehlo([torch.lerp(xa, xb, torch.tensor(0.1).to("xla"))])


@pytest.mark.parametrize("inplace", [False, True])
def test_lerp_number_weight_stays_a_runtime_input(inplace):
    """Weights on the same side of 0.5 share one program (an EMA's changing decay does not recompile);
    crossing 0.5 compiles the other formula once. Bit for bit with eager on both sides."""
    from spmdtorch import debug

    a, b = torch.randn(32), torch.randn(32) * 10

    def run(w):
        xa = a.to("xla")
        out = xa.lerp_(b.to("xla"), w) if inplace else torch.lerp(xa, b.to("xla"), w)
        torch.testing.assert_close(out.cpu(), a.clone().lerp_(b, w), rtol=0, atol=0)

    run(0.1)
    before = debug.counter_value("UncachedCompile")
    run(0.2)
    run(-0.3)
    assert debug.counter_value("UncachedCompile") == before
    run(0.7)
    assert debug.counter_value("UncachedCompile") == before + 1
    run(0.95)
    run(0.1)
    assert debug.counter_value("UncachedCompile") == before + 1


def test_lowering_registered_again_without_branch_is_not_passed_one():
    """``Lowering.branch`` belongs to the lowering: replacing it drops the branch (its in-place variant's too)."""
    from spmdtorch.ops.registry import LOWERINGS, get_branch, register

    op, inplace = aten.lerp.Scalar, aten.lerp_.Scalar
    saved = LOWERINGS[op]
    assert get_branch(op) is saved.branch and get_branch(inplace) is saved.branch
    try:
        register("lerp.Scalar")(lambda self, end, weight: self + weight * (end - self))
        assert get_branch(op) is None and get_branch(inplace) is None
    finally:
        register("lerp.Scalar", branch=saved.branch)(saved.fn)
        LOWERINGS[op] = saved
    assert get_branch(op) is saved.branch and get_branch(inplace) is saved.branch
