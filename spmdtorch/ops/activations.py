"""Activation functions and their backward ops.

All math runs in float32 for bf16/f16 inputs; backward formulas follow the
ATen derivative definitions (``derivatives.yaml``) with the same arguments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from spmdtorch.ops._util import Array, Scalar, canon_dim, upcast
from spmdtorch.ops.registry import register


@register("relu.default")
def _relu(self: Array) -> Array:
    return jnp.maximum(self, jnp.zeros((), self.dtype))


@register("threshold.default")
def _threshold(self: Array, threshold: Scalar, value: Scalar) -> Array:
    return jnp.where(self <= threshold, value, self)


@register("threshold_backward.default")
def _threshold_backward(grad_output: Array, self: Array, threshold: Scalar) -> Array:
    return jnp.where(self <= threshold, jnp.zeros((), grad_output.dtype), grad_output)


def _gelu(x: Array, approximate: str) -> Array:
    return jax.nn.gelu(upcast(x), approximate=(approximate == "tanh"))


@register("gelu.default")
def _gelu_fwd(self: Array, *, approximate: str = "none") -> Array:
    return _gelu(self, approximate)


@register("gelu_backward.default")
def _gelu_backward(grad_output: Array, self: Array, *, approximate: str = "none") -> Array:
    x = upcast(self)
    # jax types a pullback's result Any.
    res: Array = jax.vjp(lambda t: _gelu(t, approximate), x)[1](upcast(grad_output))[0]
    return res


@register("silu.default")
def _silu(self: Array) -> Array:
    return jax.nn.silu(upcast(self))


@register("silu_backward.default")
def _silu_backward(grad_output: Array, self: Array) -> Array:
    x = upcast(self)
    s = jax.nn.sigmoid(x)
    return upcast(grad_output) * s * (1 + x * (1 - s))


@register("sigmoid_backward.default")
def _sigmoid_backward(grad_output: Array, output: Array) -> Array:
    y = upcast(output)
    return upcast(grad_output) * y * (1 - y)


@register("tanh_backward.default")
def _tanh_backward(grad_output: Array, output: Array) -> Array:
    y = upcast(output)
    return upcast(grad_output) * (1 - y * y)


@register("leaky_relu.default")
def _leaky_relu(self: Array, negative_slope: Scalar = 0.01) -> Array:
    return jnp.where(self > 0, self, self * negative_slope)


@register("leaky_relu_backward.default")
def _leaky_relu_backward(grad_output: Array, self: Array, negative_slope: Scalar, self_is_result: bool) -> Array:
    return jnp.where(self > 0, grad_output, grad_output * negative_slope)


@register("elu.default")
def _elu(self: Array, alpha: Scalar = 1, scale: Scalar = 1, input_scale: Scalar = 1) -> Array:
    x = upcast(self)
    return jnp.where(x > 0, x * scale, jnp.expm1(x * input_scale) * alpha * scale)


@register("elu_backward.default")
def _elu_backward(
    grad_output: Array, alpha: Scalar, scale: Scalar, input_scale: Scalar, is_result: bool, self_or_result: Array
) -> Array:
    g, y = upcast(grad_output), upcast(self_or_result)
    if is_result:
        neg = g * input_scale * (y + alpha * scale)
    else:
        neg = g * input_scale * alpha * scale * jnp.exp(y * input_scale)
    return jnp.where(y > 0, g * scale, neg)


@register("hardtanh.default")
def _hardtanh(self: Array, min_val: Scalar = -1, max_val: Scalar = 1) -> Array:
    return jnp.minimum(jnp.maximum(self, min_val), max_val)


@register("hardtanh_backward.default")
def _hardtanh_backward(grad_output: Array, self: Array, min_val: Scalar, max_val: Scalar) -> Array:
    inside = (self > min_val) & (self < max_val)
    return jnp.where(inside, grad_output, jnp.zeros((), grad_output.dtype))


@register("softplus.default")
def _softplus(self: Array, beta: Scalar = 1, threshold: Scalar = 20) -> Array:
    x = upcast(self)
    bx = x * beta
    return jnp.where(bx > threshold, x, jnp.log1p(jnp.exp(jnp.minimum(bx, threshold))) / beta)


@register("softplus_backward.default")
def _softplus_backward(grad_output: Array, self: Array, beta: Scalar, threshold: Scalar) -> Array:
    x = upcast(self)
    bx = x * beta
    return jnp.where(bx > threshold, upcast(grad_output), upcast(grad_output) * jax.nn.sigmoid(bx))


@register("hardsigmoid.default")
def _hardsigmoid(self: Array) -> Array:
    return jnp.clip(upcast(self) / 6 + 0.5, 0, 1)


@register("hardsigmoid_backward.default")
def _hardsigmoid_backward(grad_output: Array, self: Array) -> Array:
    inside = (self > -3) & (self < 3)
    return jnp.where(inside, upcast(grad_output) / 6, 0.0)


@register("hardswish.default")
def _hardswish(self: Array) -> Array:
    x = upcast(self)
    return x * jnp.clip(x + 3, 0, 6) / 6


@register("hardswish_backward.default")
def _hardswish_backward(grad_output: Array, self: Array) -> Array:
    x, g = upcast(self), upcast(grad_output)
    return jnp.where(x < -3, 0.0, jnp.where(x <= 3, g * (x / 3 + 0.5), g))


@register("mish.default")
def _mish(self: Array) -> Array:
    x = upcast(self)
    return x * jnp.tanh(jax.nn.softplus(x))


@register("mish_backward.default")
def _mish_backward(grad_output: Array, self: Array) -> Array:
    x = upcast(self)
    # jax types a pullback's result Any.
    res: Array = jax.vjp(_mish, x)[1](upcast(grad_output))[0]
    return res


@register("log_sigmoid_forward.default")
def _log_sigmoid_forward(self: Array) -> tuple[Array, Array]:
    x = upcast(self)
    # The buffer is an implementation detail of the CPU kernel; zeros of the
    # input's shape keep the meta shape.
    return jax.nn.log_sigmoid(x), jnp.zeros_like(x)


@register("log_sigmoid_backward.default")
def _log_sigmoid_backward(grad_output: Array, self: Array, buffer: Array) -> Array:
    x = upcast(self)
    return upcast(grad_output) * jax.nn.sigmoid(-x)


@register("_prelu_kernel.default")
def _prelu(self: Array, weight: Array) -> Array:
    return jnp.where(self > 0, self, self * weight)


@register("_prelu_kernel_backward.default")
def _prelu_backward(grad_output: Array, self: Array, weight: Array) -> tuple[Array, Array]:
    gi = jnp.where(self > 0, grad_output, grad_output * weight)
    gw = jnp.where(self > 0, jnp.zeros((), grad_output.dtype), grad_output * self)
    return gi, gw


@register("glu.default")
def _glu(self: Array, dim: int = -1) -> Array:
    a, b = jnp.split(upcast(self), 2, axis=canon_dim(dim, self.ndim))
    return a * jax.nn.sigmoid(b)


@register("glu_backward.default")
def _glu_backward(grad_output: Array, self: Array, dim: int) -> Array:
    # jax types a pullback's result Any.
    res: Array = jax.vjp(lambda x: _glu(x, dim), upcast(self))[1](upcast(grad_output))[0]
    return res


@register("hardshrink.default")
def _hardshrink(self: Array, lambd: Scalar = 0.5) -> Array:
    return jnp.where(jnp.abs(self) > lambd, self, jnp.zeros((), self.dtype))


@register("softshrink.default")
def _softshrink(self: Array, lambd: Scalar = 0.5) -> Array:
    return jnp.where(self > lambd, self - lambd, jnp.where(self < -lambd, self + lambd, 0))


@register("hardshrink_backward.default", "softshrink_backward.default")
def _shrink_backward(grad_out: Array, self: Array, lambd: Scalar) -> Array:
    """Both shrinks pass the gradient outside ``[-lambd, lambd]`` (ends included in the dead zone, as torch)."""
    dead = (self >= -lambd) & (self <= lambd)
    return jnp.where(dead, jnp.zeros((), grad_out.dtype), grad_out)


@register("celu.default")
def _celu(self: Array, alpha: Scalar = 1.0) -> Array:
    x = upcast(self)
    return jnp.where(x > 0, x, alpha * jnp.expm1(x / alpha))


@register("selu.default")
def _selu(self: Array) -> Array:
    return jax.nn.selu(upcast(self))


@register("relu6.default")
def _relu6(self: Array) -> Array:
    return jnp.clip(self, 0, 6)


@register("_softmax.default")
def _softmax(self: Array, dim: int, half_to_float: bool = False) -> Array:
    x = upcast(self)
    if x.ndim == 0:
        return jnp.ones_like(x)
    return jax.nn.softmax(x, axis=canon_dim(dim, x.ndim))


@register("_safe_softmax.default")
def _safe_softmax(self: Array, dim: int, dtype: torch.dtype | None = None) -> Array:
    """Softmax whose fully-masked (all -inf) rows give 0 instead of NaN."""
    x = upcast(self)
    if x.ndim == 0:
        return jnp.ones_like(x)
    d = canon_dim(dim, x.ndim)
    out = jax.nn.softmax(x, axis=d)
    all_masked = jnp.all(x == -jnp.inf, axis=d, keepdims=True)
    return jnp.where(all_masked, 0.0, out)


@register("_log_softmax.default")
def _log_softmax(self: Array, dim: int, half_to_float: bool = False) -> Array:
    x = upcast(self)
    if x.ndim == 0:
        return jnp.zeros_like(x)
    return jax.nn.log_softmax(x, axis=canon_dim(dim, x.ndim))


@register("_softmax_backward_data.default")
def _softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    g, y = upcast(grad_output), upcast(output)
    if y.ndim == 0:
        return jnp.zeros_like(y)
    d = canon_dim(dim, y.ndim)
    return y * (g - jnp.sum(g * y, axis=d, keepdims=True))


@register("_log_softmax_backward_data.default")
def _log_softmax_backward_data(grad_output: Array, output: Array, dim: int, input_dtype: torch.dtype) -> Array:
    g, y = upcast(grad_output), upcast(output)
    if y.ndim == 0:
        return jnp.zeros_like(y)
    d = canon_dim(dim, y.ndim)
    return g - jnp.exp(y) * jnp.sum(g, axis=d, keepdims=True)
