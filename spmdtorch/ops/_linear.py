"""``spmdtorch::linear`` and its two gradient products: a linear layer as one op each way.

torch's ``F.linear`` of an n-d input decomposes in C++ into ``t``, ``view``,
``mm`` and ``_unsafe_view`` (``addmm`` with a bias), and its gradient into
two more ``mm`` with three ``t`` and the views back: about twelve ATen calls
per layer and step, each recorded by the lazy engine on the host, and a
weight gradient whose product, flattened to 2-d, contracts the rows of both
operands (XLA:CPU runs that one outside its fused dot kernels). These ops
keep every leading dim and give the program the products ``jax.grad`` of
``x @ w.T`` has:

* ``linear(x, w, b)``: ``x @ w.T (+ b)``, contracting ``x``'s last dim;
* ``linear_input_grad(g, w)``: ``g @ w``, the input's gradient;
* ``linear_weight_grad(g, x)``: ``g.T @ x`` summed over every leading dim,
  the weight's gradient.

Each op's gradient is written with the three (so second derivatives work),
as a ``torch.autograd.Function`` (:class:`LinearFn`, ...) that is also the
op's autograd kernel. The torch-level override
(``spmdtorch.tensor.dispatch._functions``) sends ``F.linear`` of xla tensors
to ``LinearFn.apply``: an autograd ``Function`` costs the host a few Python
frames per call fewer than ``torch.library.custom_op``'s generated one, and
a decoder step makes hundreds of these calls. On CPU tensors the ops are
torch's own products.

Example:
    >>> import torch
    >>> x, w = torch.randn(2, 3, 4, requires_grad=True), torch.randn(5, 4, requires_grad=True)
    >>> y = LinearFn.apply(x, w, None)
    >>> torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
    >>> y.sum().backward()
    >>> torch.testing.assert_close(w.grad, torch.ones(2, 3, 5).flatten(0, 1).T @ x.detach().flatten(0, 1))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jax import lax

from spmdtorch.ops import linalg
from spmdtorch.ops._util import Array
from spmdtorch.ops.registry import LOWERINGS, Lowering

__all__ = ["LinearFn", "LinearInputGradFn", "LinearWeightGradFn"]

_LIB = torch.library.Library("spmdtorch", "FRAGMENT")
_LIB.define("linear(Tensor x, Tensor w, Tensor? b=None) -> Tensor")
_LIB.define("linear_input_grad(Tensor g, Tensor w) -> Tensor")
_LIB.define("linear_weight_grad(Tensor g, Tensor x) -> Tensor")


def _lead(x: torch.Tensor) -> list[int]:
    """Every dim but the last."""
    return list(range(x.dim() - 1))


# The products on torch tensors (CPU, and meta for shapes): torch's own.
_LIB.impl("linear", lambda x, w, b=None: torch.nn.functional.linear(x, w, b), "CompositeExplicitAutograd")
_LIB.impl("linear_input_grad", lambda g, w: torch.matmul(g, w), "CompositeExplicitAutograd")
_LIB.impl(
    "linear_weight_grad", lambda g, x: torch.tensordot(g, x, dims=(_lead(g), _lead(x))), "CompositeExplicitAutograd"
)

_LINEAR = torch.ops.spmdtorch.linear.default
_INPUT_GRAD = torch.ops.spmdtorch.linear_input_grad.default
_WEIGHT_GRAD = torch.ops.spmdtorch.linear_weight_grad.default


def _forward(op: Callable[..., torch.Tensor]) -> staticmethod[..., torch.Tensor]:
    """A Function's ``forward``: save the two operands, run ``op`` below autograd.

    Below autograd: the op must not reach its autograd kernel (the Function
    itself) again.
    """

    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, *rest: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(a, b)
        with torch._C._AutoDispatchBelowAutograd():
            return op(a, b, *rest)

    return staticmethod(forward)


class LinearFn(torch.autograd.Function):
    """``F.linear(x, w, b)`` as ``spmdtorch::linear``; gradient: ``LinearInputGradFn``, ``LinearWeightGradFn``."""

    forward = _forward(_LINEAR)  # (x, w, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad
        grad_x = LinearInputGradFn.apply(grad, w) if need_x else None  # type: ignore[no-untyped-call]  # Function.apply: unannotated in torch
        grad_w = LinearWeightGradFn.apply(grad, x) if need_w else None  # type: ignore[no-untyped-call]  # Function.apply: unannotated in torch
        # A sum over no dims would sum them all: a 1-d output's gradient is the bias's.
        grad_b = (grad if grad.dim() == 1 else grad.sum(_lead(grad))) if need_b else None
        return grad_x, grad_w, grad_b


class LinearInputGradFn(torch.autograd.Function):
    """``g @ w`` as ``spmdtorch::linear_input_grad``."""

    forward = _forward(_INPUT_GRAD)  # (g, w)

    @staticmethod
    def backward(ctx: Any, up: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        # y = g @ w: dg = up @ w.T (a linear of up), dw = g.T @ up.
        g, w = ctx.saved_tensors
        need_g, need_w = ctx.needs_input_grad
        return (LinearFn.apply(up, w, None) if need_g else None), (LinearWeightGradFn.apply(g, up) if need_w else None)  # type: ignore[no-untyped-call]  # Function.apply: unannotated in torch


class LinearWeightGradFn(torch.autograd.Function):
    """``g.T @ x`` over every leading dim as ``spmdtorch::linear_weight_grad``."""

    forward = _forward(_WEIGHT_GRAD)  # (g, x)

    @staticmethod
    def backward(ctx: Any, up: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        # y = g.T @ x over leading dims: dg = x @ up.T (a linear of x), dx = g @ up.
        g, x = ctx.saved_tensors
        need_g, need_x = ctx.needs_input_grad
        return (LinearFn.apply(x, up, None) if need_g else None), (LinearInputGradFn.apply(g, up) if need_x else None)  # type: ignore[no-untyped-call]  # Function.apply: unannotated in torch


# Called as ops (torch.ops.spmdtorch.linear(...)), they differentiate the same way.
_LIB.impl("linear", lambda x, w, b=None: LinearFn.apply(x, w, b), "Autograd")  # type: ignore[no-untyped-call]  # Function.apply: unannotated in torch
_LIB.impl("linear_input_grad", LinearInputGradFn.apply, "Autograd")
_LIB.impl("linear_weight_grad", LinearWeightGradFn.apply, "Autograd")


def _contract(
    a: Array, b: Array, a_dims: Sequence[int], b_dims: Sequence[int], *, float32_result: bool = False
) -> Array:
    pet = linalg._result_type(a, b, float32_result)
    return lax.dot_general(
        a, b, ((a_dims, b_dims), ((), ())), precision=linalg.MATMUL_PRECISION, preferred_element_type=pet
    )


def _linear(x: Array, w: Array, b: Array | None = None) -> Array:
    # With a bias the product stays float32 until the addition and rounds
    # once, as torch's addmm (which linear of a 2-d or contiguous 3-d input is).
    y = _contract(x, w, (x.ndim - 1,), (1,), float32_result=b is not None)
    return y if b is None else (y + b.astype(y.dtype)).astype(x.dtype)


def _input_grad(g: Array, w: Array) -> Array:
    return _contract(g, w, (g.ndim - 1,), (0,))


def _weight_grad(g: Array, x: Array) -> Array:
    lead = tuple(range(g.ndim - 1))
    return _contract(g, x, lead, lead)


LOWERINGS[_LINEAR] = Lowering(_linear, lift_scalars=False)
LOWERINGS[_INPUT_GRAD] = Lowering(_input_grad, lift_scalars=False)
LOWERINGS[_WEIGHT_GRAD] = Lowering(_weight_grad, lift_scalars=False)
