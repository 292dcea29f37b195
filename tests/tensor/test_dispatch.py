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
    ids=[
        "masked_select",
        "bool_index",
        "nonzero",
        "argwhere",
        "unique",
        "unique_consecutive",
        "repeat_interleave_counts",
        "repeat_interleave_no_output_size",
    ],
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
    got, want = _both(
        lambda s: torch.stft(s, 16, window=torch.hann_window(16, device=s.device), return_complex=True), sig
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_equal_and_allclose_return_python_bools():
    a = torch.tensor([1.0, 2.0, 3.0], device="xla")
    assert torch.equal(a, a.clone()) is True
    assert torch.equal(a, a + 1) is False
    assert torch.equal(a, a[:2]) is False
    assert torch.allclose(a, a + 1e-9) is True
    assert torch.allclose(a, a + 1) is False
    assert spmdtorch.debug.counter_value("aten::_local_scalar_dense") > 0


def test_inplace_ops_use_the_out_of_place_op_with_the_same_signature():
    """``pow_.Scalar`` is ``pow.Tensor_Scalar``, not ``pow.Scalar`` (Scalar base)."""
    src = torch.tensor([1.5, 2.0, 3.0])
    x = src.to("xla")
    x.pow_(3)
    torch.testing.assert_close(x.cpu(), src.pow(3))
    x.pow_(torch.tensor([1.0, 0.5, 2.0], device="xla"))
    torch.testing.assert_close(x.cpu(), src.pow(3).pow(torch.tensor([1.0, 0.5, 2.0])))


def test_backward_formulas_that_build_tensors_from_grad_options():
    """Backward formulas make helpers from the gradient's options (device meta):
    pow's where(exponent == 0, 0, ...), vector_norm's pow_, sgn's zero tensor."""
    torch.manual_seed(0)
    a = torch.randn(3, 4)
    for fn in (
        lambda t: torch.pow(t.abs(), 2.5).sum(),
        lambda t: torch.linalg.vector_norm(t, 3),
        lambda t: torch.nn.functional.margin_ranking_loss(t[0], t[1], torch.ones_like(t[2])),
        lambda t: torch.sgn(t).sum() + t.sum(),
    ):
        xa = a.to("xla").requires_grad_()
        fn(xa).backward()
        ca = a.clone().requires_grad_()
        fn(ca).backward()
        torch.testing.assert_close(xa.grad.cpu(), ca.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "index",
    [[0, 2], (Ellipsis, [1, 2]), ([0, 1], [2, 3]), (slice(None), [[0, 1], [2, 3]]), [True, False, True, False, True]],
    ids=["list", "ellipsis_list", "two_lists", "nested_list", "bool_list"],
)
def test_python_index_lists(index):
    """torch turns index lists into tensors on self's storage device (meta) with
    the Python key masked; the device mode hands them over as host tensors."""
    src = torch.arange(125.0).reshape(5, 5, 5)
    x = src.to("xla")
    torch.testing.assert_close(x[index].cpu(), src[index])
    y, ref = x.clone(), src.clone()
    y[index] = -1.0
    ref[index] = -1.0
    torch.testing.assert_close(y.cpu(), ref)


def test_conj_and_neg_views_carry_their_values():
    """An XlaTensor has no conj/neg bit: the view's value is conjugated itself."""
    src = torch.randn(4, dtype=torch.complex64)
    x = src.to("xla")
    torch.testing.assert_close(x.conj().cpu(), src.conj().resolve_conj())
    torch.testing.assert_close(torch.fft.ifft(src.real.to("xla")).cpu(), torch.fft.ifft(src.real))


def test_composite_returning_its_meta_helper_is_rerun_on_xla():
    """linalg.norm of an empty matrix returns at::zeros(..., self.options()) itself."""
    got = torch.linalg.norm(torch.zeros(0, 0, device="xla"), float("inf"), keepdim=True)
    assert isinstance(got, XlaTensor)
    torch.testing.assert_close(got.cpu(), torch.linalg.norm(torch.zeros(0, 0), float("inf"), keepdim=True))


def test_batch_norm_in_eval_mode_returns_cpu_shaped_saved_stats():
    x, rm, rv = torch.randn(3, 2, 4), torch.zeros(2), torch.ones(2)
    want = torch.ops.aten.native_batch_norm(x, None, None, rm, rv, False, 0.1, 1e-5)
    got = torch.ops.aten.native_batch_norm(x.to("xla"), None, None, rm.to("xla"), rv.to("xla"), False, 0.1, 1e-5)
    assert [tuple(t.shape) for t in got] == [tuple(t.shape) for t in want] == [(3, 2, 4), (0,), (0,)]
    torch.testing.assert_close(got[0].cpu(), want[0])


def test_equal_views_share_view_steps_and_see_each_others_writes():
    x = torch.arange(12.0).reshape(3, 4)
    xx = x.to("xla")
    a, b = xx[:, 1:3], xx[:, 1:3]
    assert a._chain == b._chain  # one ViewStep per (op, arguments, input metadata)
    a.add_(10)
    x[:, 1:3].add_(10)
    torch.testing.assert_close(b.cpu(), x[:, 1:3])
    torch.testing.assert_close(xx.t()[1:3].cpu(), x.t()[1:3])


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "sliced"])
@pytest.mark.parametrize("name", ["det", "slogdet", "logdet"])
def test_determinant_gradients_match_eager_for_every_input_layout(name, layout):
    """torch's det backward reads the saved input's strides to know which LU
    factors the forward returned (of A, or of A^T): views must get the right ones."""
    fn = {"det": torch.linalg.det, "slogdet": lambda a: torch.linalg.slogdet(a)[1], "logdet": torch.logdet}[name]

    def view(t):
        if layout == "transposed":
            return t.mT
        if layout == "sliced":
            return torch.cat([t, t], -1)[..., :5]  # non-contiguous, not a transpose
        return t

    torch.manual_seed(0)
    base = torch.randn(3, 5, 5) + 4 * torch.eye(5)  # well conditioned, positive determinant
    cpu = base.clone().requires_grad_(True)
    xla = base.to("xla").requires_grad_(True)
    out_cpu, out_xla = fn(view(cpu)), fn(view(xla))
    out_cpu.sum().backward()
    out_xla.sum().backward()
    torch.testing.assert_close(out_xla.cpu(), out_cpu.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xla.grad.cpu(), cpu.grad, rtol=1e-4, atol=1e-5)


def test_router_refuses_a_second_special_handler_for_one_op():
    from spmdtorch.tensor import _router

    with pytest.raises(ValueError, match=r"copy_\.default already has the special handler copy_"):
        _router.special("copy_.default")(lambda func, args, kwargs, facts: None)


def test_router_names_the_valid_path_kinds():
    from spmdtorch.tensor import _router

    with pytest.raises(ValueError, match=r"unknown dispatch path 'fast'; expected one of \('view', 'mutation'"):
        _router.path("fast")


def test_every_op_resolves_once_to_one_route():
    """The route is cached on the op's facts: a view, an in-place op, a lowered op, a special op."""
    from spmdtorch.tensor import dispatch

    aten = torch.ops.aten
    x = torch.ones(2, 3, device="xla")
    x.t()
    x.add_(1)
    x.exp()
    x.cpu()
    names = {op: dispatch.facts_of(op).route.__name__ for op in (aten.t.default, aten.add_.Tensor, aten.exp.default)}
    assert names == {
        aten.t.default: "dispatch_view",
        aten.add_.Tensor: "dispatch_mutation",
        aten.exp.default: "dispatch_lowering",
    }
    assert dispatch.facts_of(aten._to_copy.default).route.__name__ == "_to_copy"
