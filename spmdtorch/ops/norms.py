"""Normalisation layers: layer norm, RMS norm, weight norm, group norm, batch
norm, and their backward ops.

Statistics are computed in float32. Backward ops receive the saved
mean/rstd (not ``eps``), so they use the closed-form gradient
``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` over the normalised
axes rather than differentiating the forward.

Batch norm in training mode updates ``running_mean``/``running_var`` in
place in eager torch. ``_native_batch_norm_legit_functional`` returns the new
running stats as extra outputs; for the mutating overloads
(``native_batch_norm``, ``_native_batch_norm_legit``) the lowering returns only
the three declared outputs, and ``BATCH_NORM_RUNNING_STATS`` maps each of them
to ``fn(*args, **kwargs) -> (new_running_mean, new_running_var)`` so the
engine can write the mutated arguments (args 3 and 4) back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast, overload

import jax.numpy as jnp
import torch
from jax import lax

from spmdtorch.ops._util import Array, upcast
from spmdtorch.ops.registry import register, resolve_ops

__all__ = ["BATCH_NORM_RUNNING_STATS"]


def _norm_input_grad(g: Array, xhat: Array, rstd: Array, axes: tuple[int, ...]) -> Array:
    """Gradient of ``xhat = (x - mean(x)) * rstd`` w.r.t. ``x``, given dL/dxhat."""
    mg = jnp.mean(g, axis=axes, keepdims=True)
    mgx = jnp.mean(g * xhat, axis=axes, keepdims=True)
    return rstd * (g - mg - xhat * mgx)


def _masked(mask: Sequence[bool], *vals: Array) -> tuple[Array | None, ...]:
    return tuple(v if m else None for m, v in zip(mask, vals))


# ---------------------------------------------------------------------------
# Layer norm / RMS norm


@register("native_layer_norm.default")
def _native_layer_norm(
    input: Array,
    normalized_shape: Sequence[int],
    weight: Array | None = None,
    bias: Array | None = None,
    eps: Array | float = 1e-5,
) -> tuple[Array, Array, Array]:
    x = upcast(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = (x - mean) * rstd
    if weight is not None:
        out = out * upcast(weight)
    if bias is not None:
        out = out + upcast(bias)
    return out, mean, rstd


@register("native_layer_norm_backward.default")
def _native_layer_norm_backward(
    grad_out: Array,
    input: Array,
    normalized_shape: Sequence[int],
    mean: Array,
    rstd: Array,
    weight: Array | None,
    bias: Array | None,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array | None, Array | None]:
    x, dy = upcast(input), upcast(grad_out)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    batch_axes = tuple(range(x.ndim - k))
    mean, rstd = (
        upcast(mean).reshape(x.shape[: x.ndim - k] + (1,) * k),
        upcast(rstd).reshape(x.shape[: x.ndim - k] + (1,) * k),
    )
    xhat = (x - mean) * rstd
    g = dy * upcast(weight) if weight is not None else dy
    dx = _norm_input_grad(g, xhat, rstd, axes) if output_mask[0] else None
    dw = jnp.sum(dy * xhat, axis=batch_axes) if (output_mask[1] and weight is not None) else None
    db = jnp.sum(dy, axis=batch_axes) if (output_mask[2] and bias is not None) else None
    return dx, dw, db


@register("_fused_rms_norm.default")
def _fused_rms_norm(
    input: Array, normalized_shape: Sequence[int], weight: Array | None = None, eps: Array | float | None = None
) -> tuple[Array, Array]:
    x = upcast(input)
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    if eps is None:
        eps = float(jnp.finfo(input.dtype).eps)
    rstd = lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)
    out = x * rstd
    if weight is not None:
        out = out * upcast(weight)
    return out, rstd


@register("_fused_rms_norm_backward.default")
def _fused_rms_norm_backward(
    grad_out: Array,
    input: Array,
    normalized_shape: Sequence[int],
    rstd: Array,
    weight: Array | None,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array | None]:
    x, dy = upcast(input), upcast(grad_out)
    k = len(normalized_shape)
    axes = tuple(range(x.ndim - k, x.ndim))
    rstd = upcast(rstd).reshape(x.shape[: x.ndim - k] + (1,) * k)
    xhat = x * rstd
    g = dy * upcast(weight) if weight is not None else dy
    dx = rstd * (g - xhat * jnp.mean(g * xhat, axis=axes, keepdims=True))
    dw = jnp.sum(dy * xhat, axis=tuple(range(x.ndim - k))) if weight is not None else None
    return (dx if output_mask[0] else None), (dw if output_mask[1] else None)


# ---------------------------------------------------------------------------
# Weight norm (``w = g * v / ||v||``, the norm over every dim but ``dim``)
#
# The forward ``_weight_norm_interface`` runs torch's decomposition; the
# backward has none. ``saved_norms`` has ``g``'s shape (ones on the reduced dims).


@register("_weight_norm_interface_backward.default")
def _weight_norm_interface_backward(
    grad_w: Array, saved_v: Array, saved_g: Array, saved_norms: Array, dim: int
) -> tuple[Array, Array]:
    dy, v = upcast(grad_w), upcast(saved_v)
    d = dim % v.ndim
    keep = (1,) * d + (v.shape[d],) + (1,) * (v.ndim - d - 1)
    g, norms = upcast(saved_g).reshape(keep), upcast(saved_norms).reshape(keep)
    axes = tuple(i for i in range(v.ndim) if i != d)
    dot = jnp.sum(dy * v, axis=axes, keepdims=True)  # <dL/dw, v> per slice of ``dim``
    grad_v = (g / norms) * (dy - v * (dot / jnp.square(norms)))
    grad_g = (dot / norms).reshape(saved_g.shape)
    return grad_v, grad_g


# ---------------------------------------------------------------------------
# Group norm


@register("native_group_norm.default")
def _native_group_norm(
    input: Array, weight: Array | None, bias: Array | None, N: int, C: int, HxW: int, group: int, eps: Array | float
) -> tuple[Array, Array, Array]:
    # Explicit sizes (not -1): an empty batch (N == 0) has no size to infer.
    x = upcast(input).reshape(N, group, (C // group) * HxW)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((x - mean) * rstd).reshape(N, C, HxW)
    if weight is not None:
        out = out * upcast(weight)[None, :, None]
    if bias is not None:
        out = out + upcast(bias)[None, :, None]
    return out.reshape(input.shape), mean[..., 0], rstd[..., 0]


@register("native_group_norm_backward.default")
def _native_group_norm_backward(
    grad_out: Array,
    input: Array,
    mean: Array,
    rstd: Array,
    weight: Array | None,
    N: int,
    C: int,
    HxW: int,
    group: int,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array | None, Array | None]:
    x = upcast(input).reshape(N, C, HxW)
    dy = upcast(grad_out).reshape(N, C, HxW)
    m = upcast(mean).reshape(N, group, 1, 1)
    r = upcast(rstd).reshape(N, group, 1, 1)
    xg = x.reshape(N, group, C // group, HxW)
    xhat = (xg - m) * r  # (N, G, C/G, HxW)
    g = dy * upcast(weight)[None, :, None] if weight is not None else dy
    dx = None
    if output_mask[0]:
        dx = _norm_input_grad(g.reshape(xhat.shape), xhat, r, (2, 3)).reshape(input.shape)
    xhat_c = xhat.reshape(N, C, HxW)
    dw = jnp.sum(dy * xhat_c, axis=(0, 2)) if output_mask[1] else None
    db = jnp.sum(dy, axis=(0, 2)) if output_mask[2] else None
    return dx, dw, db


# ---------------------------------------------------------------------------
# Batch norm


def _bn_shape(x: Array) -> tuple[int, ...]:
    return (1, x.shape[1]) + (1,) * (x.ndim - 2)


def _bn_axes(x: Array) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


# With running statistics given, the new ones are arrays too.
@overload
def _batch_norm(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array,
    running_var: Array,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array, Array]: ...
@overload
def _batch_norm(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array | None, Array | None]: ...
def _batch_norm(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array | None, Array | None]:
    """Returns (out, save_mean, save_invstd, new_running_mean, new_running_var)."""
    x = upcast(input)
    axes = _bn_axes(x)
    shp = _bn_shape(x)
    if training:
        mean = jnp.mean(x, axis=axes)
        var = jnp.mean(jnp.square(x - mean.reshape(shp)), axis=axes)
        n = x.size // x.shape[1]
        new_rm = new_rv = None
        if running_mean is not None:
            new_rm = (1 - momentum) * upcast(running_mean) + momentum * mean
        if running_var is not None:
            unbiased = var * (n / max(n - 1, 1))
            new_rv = (1 - momentum) * upcast(running_var) + momentum * unbiased
    else:  # evaluation: torch passes the running statistics (the casts state that)
        mean, var = upcast(cast(Array, running_mean)), upcast(cast(Array, running_var))
        new_rm, new_rv = running_mean, running_var
    invstd = lax.rsqrt(var + eps)
    out = (x - mean.reshape(shp)) * invstd.reshape(shp)
    if weight is not None:
        out = out * upcast(weight).reshape(shp)
    if bias is not None:
        out = out + upcast(bias).reshape(shp)
    return out, mean, invstd, new_rm, new_rv


@register("native_batch_norm.default", "_native_batch_norm_legit.default")
def _native_batch_norm(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array]:
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[:3]


@register("_native_batch_norm_legit.no_stats")
def _native_batch_norm_no_stats(
    input: Array, weight: Array | None, bias: Array | None, training: bool, momentum: Array | float, eps: Array | float
) -> tuple[Array, Array, Array]:
    return _batch_norm(input, weight, bias, None, None, True, momentum, eps)[:3]


@register("_native_batch_norm_legit_no_training.default")
def _native_batch_norm_no_training(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array,
    running_var: Array,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array]:
    return _batch_norm(input, weight, bias, running_mean, running_var, False, momentum, eps)[:3]


@register("_native_batch_norm_legit_functional.default")
def _native_batch_norm_functional(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array,
    running_var: Array,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array, Array]:
    out, mean, invstd, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, rm, rv


def _running_stats(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    training: bool,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array | None, ...]:
    return _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[3:]


BATCH_NORM_RUNNING_STATS: dict[torch._ops.OpOverload, Callable[..., tuple[Array | None, ...]]] = {
    op: _running_stats
    for name in ("native_batch_norm.default", "_native_batch_norm_legit.default")
    for op in resolve_ops(name)
}


@register("native_batch_norm_backward.default")
def _native_batch_norm_backward(
    grad_out: Array,
    input: Array,
    weight: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    save_mean: Array | None,
    save_invstd: Array | None,
    train: bool,
    eps: Array | float,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array | None, Array | None]:
    x, dy = upcast(input), upcast(grad_out)
    axes, shp = _bn_axes(x), _bn_shape(x)
    # The schema makes all four statistics optional; torch passes the saved ones
    # when train is set and the running ones otherwise (the casts state that).
    if train:
        mean, invstd = upcast(cast(Array, save_mean)), upcast(cast(Array, save_invstd))
    else:
        mean, invstd = upcast(cast(Array, running_mean)), lax.rsqrt(upcast(cast(Array, running_var)) + eps)
    mean, invstd = mean.reshape(shp), invstd.reshape(shp)
    xhat = (x - mean) * invstd
    w = upcast(weight).reshape(shp) if weight is not None else 1.0
    dx = None
    if output_mask[0]:
        g = dy * w
        dx = _norm_input_grad(g, xhat, invstd, axes) if train else g * invstd
    dw = jnp.sum(dy * xhat, axis=axes) if output_mask[1] else None
    db = jnp.sum(dy, axis=axes) if output_mask[2] else None
    return dx, dw, db


@register("batch_norm_backward.default")
def _batch_norm_backward(
    grad_out: Array,
    input: Array,
    weight: Array,
    running_mean: Array | None,
    running_var: Array | None,
    save_mean: Array | None,
    save_var: Array | None,
    update: bool,
    eps: Array | float,
    output_mask: Sequence[bool],
    reserve: Array,
) -> tuple[Array | None, Array | None, Array | None]:
    # ``save_var`` holds the saved inverse std (the name is historical).
    return _native_batch_norm_backward(
        grad_out, input, weight, running_mean, running_var, save_mean, save_var, update, eps, output_mask
    )


@register("_batch_norm_with_update.default")
def _batch_norm_with_update(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array,
    running_var: Array,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array]:
    out, mean, invstd, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)  # reserve: unused off cuDNN


@register("_batch_norm_with_update_functional.default")
def _batch_norm_with_update_functional(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array,
    running_var: Array,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array, Array, Array]:
    out, mean, invstd, rm, rv = _batch_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8), rm, rv


@register("_batch_norm_no_update.default")
def _batch_norm_no_update(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array, Array, Array, Array]:
    training = running_mean is None or running_var is None
    out, mean, invstd, _, _ = _batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)
    return out, mean, invstd, jnp.zeros((0,), jnp.uint8)


def _running_stats_update(
    input: Array,
    weight: Array | None,
    bias: Array | None,
    running_mean: Array | None,
    running_var: Array | None,
    momentum: Array | float,
    eps: Array | float,
) -> tuple[Array | None, ...]:
    return _batch_norm(input, weight, bias, running_mean, running_var, True, momentum, eps)[3:]


BATCH_NORM_RUNNING_STATS.update(dict.fromkeys(resolve_ops("_batch_norm_with_update.default"), _running_stats_update))
