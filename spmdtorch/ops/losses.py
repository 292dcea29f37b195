"""Loss functions and their backward ops.

``reduction`` is ATen's enum: 0 none, 1 mean, 2 sum. Backward ops that get
every forward argument are computed with ``jax.vjp`` of the forward lowering
(so forward and backward cannot drift apart); ``nll_loss_backward`` uses the
``total_weight`` it is given, as torch does.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch
from jax import lax

from spmdtorch.ops._util import Array, Number, Scalar, upcast
from spmdtorch.ops.registry import LOWERINGS, Lowering, register, register_meta, resolve_ops


def _reduce(loss: Array, reduction: int) -> Array:
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _vjp_backward(fwd: Callable[..., Array]) -> Callable[..., Array]:
    """Build ``bw(grad_output, self, target, *rest)`` from ``fwd(self, target, *rest)``."""

    def bw(grad_output: Array, self: Array, target: Array, *rest: object, **kw: object) -> Array:
        f = lambda x: fwd(x, upcast(target), *rest, **kw)
        # jax types a pullback's result Any.
        res: Array = jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]
        return res

    return bw


# ---------------------------------------------------------------------------
# NLL


def _nll_parts(
    self: Array, target: Array, weight: Array | None, ignore_index: int
) -> tuple[Array, Array, Array, Array | None]:
    """Per-element loss and weight, class dim moved out: (loss, w, t, unnamed).

    ``unnamed`` marks the counted elements whose floating-point target is no
    whole number (or not finite): such a target names no class, and their loss
    and gradient are NaN rather than a truncated index's (a float target
    holding class indices is accepted as PyTorch/XLA accepts it; see
    ``_float_target_meta``). None for an integer target.
    """
    x = upcast(self)
    if x.ndim == 1:  # (C,) with a 0-d target
        x, target = x[None], jnp.reshape(target, (1,))
    x = jnp.moveaxis(x, 1, -1)  # (N, d..., C)
    valid = target != ignore_index
    unnamed = None
    if jnp.issubdtype(target.dtype, jnp.floating):
        unnamed = valid & ~(jnp.isfinite(target) & (jnp.floor(target) == target))
    t = jnp.where(valid if unnamed is None else valid & ~unnamed, target, 0).astype(jnp.int32)
    picked = jnp.take_along_axis(x, t[..., None], axis=-1)[..., 0]
    if unnamed is not None:
        picked = jnp.where(unnamed, jnp.nan, picked)
    w = upcast(weight)[t] if weight is not None else jnp.ones(t.shape, jnp.float32)
    w = jnp.where(valid, w, 0.0)
    return -picked * w, w, t, unnamed


def _float_target_meta(op: Callable[..., object], target_pos: int) -> Callable[..., object]:
    """Shape rule of NLL op ``op`` (target at ``target_pos``) that also takes a float target.

    PyTorch/XLA builds the NLL one-hot by comparing the labels, in their own
    dtype, with the class numbers, so code written for it passes float class
    indices (``CrossEntropyLoss()(logits, torch.zeros(n))``). torch's meta
    kernel gathers with the target and refuses a float one; the outputs'
    shapes and dtypes do not depend on the target's dtype, so the kernel runs
    on an int64 stand-in. The lowerings read a float target as class indices.
    """

    def meta(*args: object, **kwargs: object) -> object:
        if "target" in kwargs:
            kwargs["target"] = _int_stand_in(kwargs["target"])
        elif len(args) > target_pos:
            args = (*args[:target_pos], _int_stand_in(args[target_pos]), *args[target_pos + 1 :])
        return op(*args, **kwargs)

    return meta


def _int_stand_in(target: object) -> object:
    if isinstance(target, torch.Tensor) and target.dtype.is_floating_point:
        return torch.empty(target.shape, dtype=torch.int64, device="meta")
    return target


def _nll_loss_forward(
    self: Array, target: Array, weight: Array | None, reduction: int, ignore_index: int
) -> tuple[Array, Array]:
    loss, w, _, _ = _nll_parts(self, target, weight, ignore_index)
    if reduction == 0:
        if self.ndim > 1:
            return loss, jnp.zeros((), jnp.float32)
        return loss[0], jnp.sum(w)  # the 1-d kernel reports the weight it used
    total = jnp.sum(w)
    s = jnp.sum(loss)
    return (s / total if reduction == 1 else s), total


def _nll_loss_backward(
    grad_output: Array,
    self: Array,
    target: Array,
    weight: Array | None,
    reduction: int,
    ignore_index: int,
    total_weight: Array,
) -> Array:
    _, w, t, unnamed = _nll_parts(self, target, weight, ignore_index)
    g = upcast(grad_output)
    if reduction == 0:
        g = jnp.reshape(g, w.shape)
    elif reduction == 1:
        g = g / upcast(total_weight)
    gw = -w * g  # (N, d...)
    if unnamed is not None:
        gw = jnp.where(unnamed, jnp.nan, gw)
    c = self.shape[1] if self.ndim > 1 else self.shape[0]
    grad = jax.nn.one_hot(t, c, dtype=jnp.float32) * gw[..., None]
    grad = jnp.moveaxis(grad, -1, 1)
    return grad if self.ndim > 1 else grad[0]


def _nll_loss(
    self: Array, target: Array, weight: Array | None = None, reduction: int = 1, ignore_index: int = -100
) -> Array:
    return _nll_loss_forward(self, target, weight, reduction, ignore_index)[0]


for _names, _fn, _target_pos in (
    (("nll_loss_forward.default", "nll_loss2d_forward.default"), _nll_loss_forward, 1),
    (("nll_loss_backward.default", "nll_loss2d_backward.default"), _nll_loss_backward, 2),
    (("nll_loss.default", "nll_loss_nd.default"), _nll_loss, 1),
):
    for _name in _names:
        for _op in resolve_ops(_name):
            register(_name, meta=_float_target_meta(_op, _target_pos))(_fn)


# ---------------------------------------------------------------------------
# Regression and binary losses


@register("mse_loss.default")
def _mse_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce(jnp.square(upcast(self) - upcast(target)), reduction)


register("mse_loss_backward.default")(_vjp_backward(_mse_loss))


@register("l1_loss.default")
def _l1_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce(jnp.abs(upcast(self) - upcast(target)), reduction)


@register("smooth_l1_loss.default")
def _smooth_l1_loss(self: Array, target: Array, reduction: int = 1, beta: Array | float = 1.0) -> Array:
    d = jnp.abs(upcast(self) - upcast(target))
    # beta == 0 is plain L1 in torch; the where keeps a traced beta valid.
    safe = jnp.where(beta == 0, 1.0, beta)
    loss = jnp.where(d < beta, 0.5 * d * d / safe, d - 0.5 * beta)
    return _reduce(loss, reduction)


register("smooth_l1_loss_backward.default")(_vjp_backward(_smooth_l1_loss))


@register("huber_loss.default")
def _huber_loss(self: Array, target: Array, reduction: int = 1, delta: Array | float = 1.0) -> Array:
    d = jnp.abs(upcast(self) - upcast(target))
    loss = jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce(loss, reduction)


register("huber_loss_backward.default")(_vjp_backward(_huber_loss))


@register("binary_cross_entropy.default")
def _bce(self: Array, target: Array, weight: Array | None = None, reduction: int = 1) -> Array:
    x, y = upcast(self), upcast(target)
    # torch clamps the logs at -100 so 0/1 probabilities stay finite.
    loss = -(y * jnp.maximum(jnp.log(x), -100.0) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * upcast(weight)
    return _reduce(loss, reduction)


@register("binary_cross_entropy_backward.default")
def _bce_backward(
    grad_output: Array, self: Array, target: Array, weight: Array | None = None, reduction: int = 1
) -> Array:
    x, y, g = upcast(self), upcast(target), upcast(grad_output)
    eps = 1e-12  # the clamp torch applies to the denominator
    grad = (x - y) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        grad = grad * upcast(weight)
    if reduction == 1:
        grad = grad / x.size
    return grad * g


@register("binary_cross_entropy_with_logits.default")
def _bce_logits(
    self: Array, target: Array, weight: Array | None = None, pos_weight: Array | None = None, reduction: int = 1
) -> Array:
    x, y = upcast(self), upcast(target)
    log_sig = jax.nn.log_sigmoid(x)
    log_one_minus = jax.nn.log_sigmoid(-x)
    if pos_weight is not None:
        loss = -(upcast(pos_weight) * y * log_sig + (1 - y) * log_one_minus)
    else:
        loss = -(y * log_sig + (1 - y) * log_one_minus)
    if weight is not None:
        loss = loss * upcast(weight)
    return _reduce(loss, reduction)


@register("soft_margin_loss.default")
def _soft_margin_loss(self: Array, target: Array, reduction: int = 1) -> Array:
    return _reduce(jnp.log1p(jnp.exp(-upcast(target) * upcast(self))), reduction)


register("soft_margin_loss_backward.default")(_vjp_backward(_soft_margin_loss))


@register("kl_div.default")
def _kl_div(self: Array, target: Array, reduction: int = 1, *, log_target: bool = False) -> Array:
    x, y = upcast(self), upcast(target)
    if log_target:
        loss = jnp.exp(y) * (y - x)
    else:
        loss = jax.scipy.special.xlogy(y, y) - y * x
    return _reduce(loss, reduction)


# ---------------------------------------------------------------------------
# Margin losses (the forwards run through torch's decompositions; these
# formulas exist for the backward ops, with the CPU kernels' strict ``z > 0``
# hinge so that a zero margin gets no gradient)


def _hinge(z: Array) -> Array:
    return jnp.where(z > 0, z, jnp.zeros((), z.dtype))


def _multi_margin_loss(
    self: Array, target: Array, p: Scalar, margin: Scalar, weight: Array | None = None, reduction: int = 1
) -> Array:
    x = upcast(self)
    one_d = x.ndim <= 1
    x = jnp.reshape(x, (1, -1)) if one_d else x
    t = jnp.reshape(target, (-1,)).astype(jnp.int32)
    c = x.shape[1]
    xt = jnp.take_along_axis(x, t[:, None], axis=1)
    z = _hinge(margin - xt + x)
    z = z if p == 1 else z * z
    if weight is not None:
        z = z * upcast(weight)[t][:, None]
    z = jnp.where(jnp.arange(c)[None, :] == t[:, None], 0.0, z)  # the target class adds nothing
    loss = jnp.sum(z, axis=1) / c
    if reduction == 0:
        return loss[0] if one_d else loss
    return _reduce(loss, reduction)


@register_meta("multi_margin_loss_backward.default")
@register_meta("multilabel_margin_loss_backward.default")
def _margin_loss_backward_meta(grad_output: torch.Tensor, self: torch.Tensor, *rest: object) -> torch.Tensor:
    return self.new_empty(self.shape)


@register("multi_margin_loss_backward.default", lift_scalars=False)
def _multi_margin_loss_backward(
    grad_output: Array,
    self: Array,
    target: Array,
    p: Number,
    margin: Number,
    weight: Array | None = None,
    reduction: int = 1,
) -> Array:
    """Gradient of ``multi_margin_loss`` (p is 1 or 2, as torch requires)."""
    if p not in (1, 2):
        raise ValueError(f"multi_margin_loss: only p == 1 and p == 2 are supported, got {p}")
    f = lambda x: _multi_margin_loss(x, target, p, margin, weight, reduction)
    # jax types a pullback's result Any.
    res: Array = jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]
    return res


def _multilabel_margin_loss(self: Array, target: Array, is_target: Array, reduction: int) -> Array:
    x = upcast(self)
    one_d = x.ndim <= 1
    x = jnp.reshape(x, (1, -1)) if one_d else x
    tgt = jnp.reshape(target, x.shape).astype(jnp.int32)
    isx = jnp.reshape(is_target, x.shape) != 0
    c = x.shape[1]
    # A sample's targets are its labels before the first -1.
    valid = jnp.cumprod((tgt >= 0).astype(jnp.int32), axis=1) > 0
    xt = jnp.take_along_axis(x, jnp.where(valid, tgt, 0), axis=1)  # (N, K)
    z = _hinge(1.0 - xt[:, :, None] + x[:, None, :])  # (N, K, C)
    z = jnp.where(valid[:, :, None] & ~isx[:, None, :], z, 0.0)
    loss = jnp.sum(z, axis=(1, 2)) / c
    if reduction == 0:
        return loss[0] if one_d else loss
    return _reduce(loss, reduction)


@register("multilabel_margin_loss_backward.default")
def _multilabel_margin_loss_backward(
    grad_output: Array, self: Array, target: Array, reduction: int, is_target: Array
) -> Array:
    """Gradient of ``multilabel_margin_loss`` given the forward's ``is_target``."""
    f = lambda x: _multilabel_margin_loss(x, target, is_target, reduction)
    # jax types a pullback's result Any.
    res: Array = jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]
    return res


# ---------------------------------------------------------------------------
# linear_cross_entropy's chunked custom ops (torch_nn namespace, torch >= 2.12).
# torch chunks the batch to bound the memory of the (N, C) logits; XLA
# schedules the whole product itself, so one linear + cross entropy is lowered,
# and the gradients the scalar op returns (torch precomputes them in its
# forward) are its jax.vjp.


def _lce_terms(
    input: Array,
    linear_weight: Array,
    target: Array,
    linear_bias: Array | None,
    weight: Array | None,
    ignore_index: int,
) -> tuple[Array, Array]:
    """Per-sample weighted negative log-likelihood and per-sample weights."""
    logits = jnp.matmul(upcast(input), upcast(linear_weight).T, precision=lax.Precision.HIGHEST)
    if linear_bias is not None:
        logits = logits + upcast(linear_bias)
    logp = jax.nn.log_softmax(logits, axis=-1)
    valid = target != ignore_index
    t = jnp.where(valid, target, 0).astype(jnp.int32)
    picked = jnp.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    w = upcast(weight)[t] if weight is not None else jnp.ones(t.shape, jnp.float32)
    w = jnp.where(valid, w, 0.0)
    return -picked * w, w


def _lce_chunked(
    input: Array,
    linear_weight: Array,
    target: Array,
    linear_bias: Array | None,
    weight: Array | None,
    reduction: str,
    ignore_index: int,
    label_smoothing: float,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype,
    allow_retain_graph: bool,
    compute_input_grad: bool,
    compute_linear_weight_grad: bool,
    compute_linear_bias_grad: bool,
) -> tuple[Array, Array, Array, Array]:
    """``(loss, grad_input, grad_linear_weight, grad_linear_bias)``; a gradient that is not
    requested is an empty ``(0, 0)`` / ``(0,)`` array, as torch's op returns."""
    if label_smoothing != 0:
        raise NotImplementedError("linear_cross_entropy chunked op: label_smoothing must be 0 (torch's too)")
    if reduction not in ("mean", "sum"):
        raise NotImplementedError(f"linear_cross_entropy chunked op: unsupported reduction {reduction!r}")

    def loss_fn(x: Array, lw: Array, lb: Array | None) -> Array:
        nll, w = _lce_terms(x, lw, target, lb, weight, ignore_index)
        s = jnp.sum(nll)
        return s / jnp.sum(w) if reduction == "mean" else s

    has_bias = linear_bias is not None
    args = (upcast(input), upcast(linear_weight), upcast(linear_bias) if linear_bias is not None else None)
    loss, vjp = jax.vjp(loss_fn, *args)
    gi, gw, gb = vjp(jnp.ones((), loss.dtype))
    dt = input.dtype
    gi = gi.astype(dt) if compute_input_grad else jnp.zeros((0, 0), dt)
    gw = gw.astype(dt) if compute_linear_weight_grad else jnp.zeros((0, 0), dt)
    gb = (
        gb.astype(dt)
        if compute_linear_bias_grad and has_bias
        else jnp.zeros(linear_weight.shape[:-1] if compute_linear_bias_grad else (0,), dt)
    )
    return loss.astype(dt), gi, gw, gb


def _lce_chunked_no_reduction(
    input: Array,
    linear_weight: Array,
    target: Array,
    linear_bias: Array | None,
    weight: Array | None,
    ignore_index: int,
    batch_chunk_size: int,
    acc_policy: str,
    acc_dtype: torch.dtype,
) -> Array:
    nll, _ = _lce_terms(input, linear_weight, target, linear_bias, weight, ignore_index)
    return nll.astype(input.dtype)


def _register_custom_op(namespace: str, name: str, fn: Callable[..., object]) -> None:
    """Register ``fn`` for a non-aten custom op (``torch.ops.<namespace>.<name>.default``) if it exists."""
    packet = getattr(getattr(torch.ops, namespace), name, None) if hasattr(torch.ops, namespace) else None
    op = getattr(packet, "default", None) if packet is not None else None
    if op is not None:
        LOWERINGS[op] = Lowering(fn, lift_scalars=False)


try:  # defines torch.ops.torch_nn.* (absent before torch 2.12)
    import torch.nn.modules.linear_cross_entropy
except ImportError:
    pass
_register_custom_op("torch_nn", "_linear_cross_entropy_batch_chunked", _lce_chunked)
_register_custom_op("torch_nn", "_linear_cross_entropy_batch_chunked_no_reduction", _lce_chunked_no_reduction)
