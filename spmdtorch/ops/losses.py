"""Loss functions and their backward ops.

``reduction`` is ATen's enum: 0 none, 1 mean, 2 sum. Backward ops that get
every forward argument are computed with ``jax.vjp`` of the forward lowering
(so forward and backward cannot drift apart); ``nll_loss_backward`` uses the
``total_weight`` it is given, as torch does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spmdtorch.ops._util import upcast
from spmdtorch.ops.registry import register


def _reduce(loss, reduction):
    if reduction == 1:
        return jnp.mean(loss)
    if reduction == 2:
        return jnp.sum(loss)
    return loss


def _vjp_backward(fwd):
    """Build ``bw(grad_output, self, target, *rest)`` from ``fwd(self, target, *rest)``."""

    def bw(grad_output, self, target, *rest, **kw):
        f = lambda x: fwd(x, upcast(target), *rest, **kw)  # noqa: E731
        return jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]

    return bw


# ---------------------------------------------------------------------------
# NLL


def _nll_parts(self, target, weight, ignore_index):
    """Per-element loss and weight, class dim moved out: (loss, w)."""
    x = upcast(self)
    if x.ndim == 1:  # (C,) with a 0-d target
        x, target = x[None], jnp.reshape(target, (1,))
    x = jnp.moveaxis(x, 1, -1)  # (N, d..., C)
    valid = target != ignore_index
    t = jnp.where(valid, target, 0).astype(jnp.int32)
    picked = jnp.take_along_axis(x, t[..., None], axis=-1)[..., 0]
    w = upcast(weight)[t] if weight is not None else jnp.ones(t.shape, jnp.float32)
    w = jnp.where(valid, w, 0.0)
    return -picked * w, w, t


@register("nll_loss_forward.default", "nll_loss2d_forward.default")
def _nll_loss_forward(self, target, weight, reduction, ignore_index):
    loss, w, _ = _nll_parts(self, target, weight, ignore_index)
    if reduction == 0:
        if self.ndim > 1:
            return loss, jnp.zeros((), jnp.float32)
        return loss[0], jnp.sum(w)  # the 1-d kernel reports the weight it used
    total = jnp.sum(w)
    s = jnp.sum(loss)
    return (s / total if reduction == 1 else s), total


@register("nll_loss_backward.default", "nll_loss2d_backward.default")
def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    _, w, t = _nll_parts(self, target, weight, ignore_index)
    g = upcast(grad_output)
    if reduction == 0:
        g = jnp.reshape(g, w.shape)
    elif reduction == 1:
        g = g / upcast(total_weight)
    gw = -w * g  # (N, d...)
    c = self.shape[1] if self.ndim > 1 else self.shape[0]
    grad = jax.nn.one_hot(t, c, dtype=jnp.float32) * gw[..., None]
    grad = jnp.moveaxis(grad, -1, 1)
    return grad if self.ndim > 1 else grad[0]


@register("nll_loss.default", "nll_loss_nd.default")
def _nll_loss(self, target, weight=None, reduction=1, ignore_index=-100):
    return _nll_loss_forward(self, target, weight, reduction, ignore_index)[0]


# ---------------------------------------------------------------------------
# Regression and binary losses


@register("mse_loss.default")
def _mse_loss(self, target, reduction=1):
    return _reduce(jnp.square(upcast(self) - upcast(target)), reduction)


register("mse_loss_backward.default")(_vjp_backward(_mse_loss))


@register("l1_loss.default")
def _l1_loss(self, target, reduction=1):
    return _reduce(jnp.abs(upcast(self) - upcast(target)), reduction)


@register("smooth_l1_loss.default")
def _smooth_l1_loss(self, target, reduction=1, beta=1.0):
    d = jnp.abs(upcast(self) - upcast(target))
    # beta == 0 is plain L1 in torch; the where keeps a traced beta valid.
    safe = jnp.where(beta == 0, 1.0, beta)
    loss = jnp.where(d < beta, 0.5 * d * d / safe, d - 0.5 * beta)
    return _reduce(loss, reduction)


register("smooth_l1_loss_backward.default")(_vjp_backward(_smooth_l1_loss))


@register("huber_loss.default")
def _huber_loss(self, target, reduction=1, delta=1.0):
    d = jnp.abs(upcast(self) - upcast(target))
    loss = jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta))
    return _reduce(loss, reduction)


register("huber_loss_backward.default")(_vjp_backward(_huber_loss))


@register("binary_cross_entropy.default")
def _bce(self, target, weight=None, reduction=1):
    x, y = upcast(self), upcast(target)
    # torch clamps the logs at -100 so 0/1 probabilities stay finite.
    loss = -(y * jnp.maximum(jnp.log(x), -100.0) + (1 - y) * jnp.maximum(jnp.log1p(-x), -100.0))
    if weight is not None:
        loss = loss * upcast(weight)
    return _reduce(loss, reduction)


@register("binary_cross_entropy_backward.default")
def _bce_backward(grad_output, self, target, weight=None, reduction=1):
    x, y, g = upcast(self), upcast(target), upcast(grad_output)
    eps = 1e-12  # the clamp torch applies to the denominator
    grad = (x - y) / jnp.maximum((1 - x) * x, eps)
    if weight is not None:
        grad = grad * upcast(weight)
    if reduction == 1:
        grad = grad / x.size
    return grad * g


@register("binary_cross_entropy_with_logits.default")
def _bce_logits(self, target, weight=None, pos_weight=None, reduction=1):
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
def _soft_margin_loss(self, target, reduction=1):
    return _reduce(jnp.log1p(jnp.exp(-upcast(target) * upcast(self))), reduction)


register("soft_margin_loss_backward.default")(_vjp_backward(_soft_margin_loss))


@register("kl_div.default")
def _kl_div(self, target, reduction=1, *, log_target=False):
    x, y = upcast(self), upcast(target)
    if log_target:
        loss = jnp.exp(y) * (y - x)
    else:
        loss = jax.scipy.special.xlogy(y, y) - y * x
    return _reduce(loss, reduction)
