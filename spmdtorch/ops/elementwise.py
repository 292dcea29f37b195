"""Elementwise unary and binary math, comparisons, logical and bitwise ops.

Low-precision floats (bf16/f16) are computed in float32 (as torch's CPU and
CUDA kernels do) and the engine rounds the result to the output dtype torch's
meta kernel reports, so lowerings here care about precision and integer
semantics, not about reproducing type promotion exactly.

``Scalar`` arguments may be Python numbers or 0-d JAX arrays (lifted by the
engine), so nothing here branches on a scalar's value in Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import cast, overload

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from spmdtorch.ops._util import Array, Number, Scalar, is_float, is_int, upcast
from spmdtorch.ops.registry import register


def _unary_float(*names: str, fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """Register a float-valued unary op computed in >= float32."""

    def lower(self: Array) -> Array:
        return fn(upcast(self))

    register(*names)(lower)
    return lower


# Transcendental / float-valued unary ops: integer inputs give float outputs
# in torch, and upcast() also maps ints to float32.
for _name, _fn in {
    "exp": jnp.exp,
    "exp2": jnp.exp2,
    "expm1": jnp.expm1,
    "log": jnp.log,
    "log2": jnp.log2,
    "log10": jnp.log10,
    "log1p": jnp.log1p,
    "sqrt": jnp.sqrt,
    "rsqrt": lax.rsqrt,
    "sin": jnp.sin,
    "cos": jnp.cos,
    "tan": jnp.tan,
    "asin": jnp.arcsin,
    "acos": jnp.arccos,
    "atan": jnp.arctan,
    "sinh": jnp.sinh,
    "cosh": jnp.cosh,
    "tanh": jnp.tanh,
    "asinh": jnp.arcsinh,
    "acosh": jnp.arccosh,
    "atanh": jnp.arctanh,
    "sigmoid": jax.nn.sigmoid,
    "erf": jax.scipy.special.erf,
    "erfc": jax.scipy.special.erfc,
    "erfinv": jax.scipy.special.erfinv,
    "lgamma": jax.scipy.special.gammaln,
    "digamma": jax.scipy.special.digamma,
    "i0": jax.scipy.special.i0,
    "special_i0e": jax.scipy.special.i0e,
    "special_i1": jax.scipy.special.i1,
    "special_i1e": jax.scipy.special.i1e,
    "special_ndtri": jax.scipy.special.ndtri,
    "special_erfcx": jax.scipy.special.erfcx,
    "sinc": jnp.sinc,
    "deg2rad": jnp.deg2rad,
    "rad2deg": jnp.rad2deg,
}.items():
    _unary_float(f"{_name}.default", fn=_fn)


@register("reciprocal.default")
def _reciprocal(self: Array) -> Array:
    return 1.0 / upcast(self)


@register("abs.default")
def _abs(self: Array) -> Array:
    if self.dtype == jnp.bool_:
        return self
    return jnp.abs(self)


@register("neg.default")
def _neg(self: Array) -> Array:
    return jnp.negative(self)


@register("sign.default", "sgn.default")
def _sign(self: Array) -> Array:
    if self.dtype == jnp.bool_:
        return self
    return jnp.sign(self)


@register("signbit.default")
def _signbit(self: Array) -> Array:
    return jnp.signbit(self)


def _int_passthrough(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    # floor/ceil/trunc/round are the identity on integers (and jnp.floor would
    # turn them into floats).
    def lower(self: Array) -> Array:
        if is_int(self):
            return self
        return fn(self)

    return lower


register("floor.default")(_int_passthrough(jnp.floor))
register("ceil.default")(_int_passthrough(jnp.ceil))
register("trunc.default", "fix.default")(_int_passthrough(jnp.trunc))
register("round.default")(_int_passthrough(jnp.round))  # half to even, as torch


@register("round.decimals")
def _round_decimals(self: Array, *, decimals: int = 0) -> Array:
    if is_int(self):
        return self
    # torch scales by 10**decimals, rounds half-to-even, and scales back.
    x = upcast(self)
    scale = 10.0**decimals
    if decimals >= 0:
        return jnp.round(x * scale) / scale
    return jnp.round(x / (10.0**-decimals)) * (10.0**-decimals)


@register("frac.default")
def _frac(self: Array) -> Array:
    return self - jnp.trunc(self)


@register("isnan.default")
def _isnan(self: Array) -> Array:
    if is_int(self):
        return jnp.zeros(jnp.shape(self), jnp.bool_)
    return jnp.isnan(self)


@register("isinf.default")
def _isinf(self: Array) -> Array:
    if is_int(self):
        return jnp.zeros(jnp.shape(self), jnp.bool_)
    return jnp.isinf(self)


@register("isfinite.default")
def _isfinite(self: Array) -> Array:
    if is_int(self):
        return jnp.ones(jnp.shape(self), jnp.bool_)
    return jnp.isfinite(self)


@register("isposinf.default")
def _isposinf(self: Array) -> Array:
    return jnp.isposinf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@register("isneginf.default")
def _isneginf(self: Array) -> Array:
    return jnp.isneginf(self) if is_float(self) else jnp.zeros(self.shape, jnp.bool_)


@register("nan_to_num.default")
def _nan_to_num(
    self: Array,
    nan: Array | float | None = None,
    posinf: Array | float | None = None,
    neginf: Array | float | None = None,
) -> Array:
    if is_int(self):
        return self
    return jnp.nan_to_num(self, nan=0.0 if nan is None else nan, posinf=posinf, neginf=neginf)


@register("logit.default")
def _logit(self: Array, eps: Array | float | None = None) -> Array:
    x = upcast(self)
    if eps is not None:
        x = jnp.clip(x, eps, 1.0 - eps)
    return jnp.log(x / (1.0 - x))


# ---------------------------------------------------------------------------
# Binary arithmetic


@overload
def _alpha_mul(other: Array, alpha: Scalar) -> Array: ...
@overload
def _alpha_mul(other: Scalar, alpha: Scalar) -> Scalar: ...
def _alpha_mul(other: Scalar, alpha: Scalar) -> Scalar:
    # alpha is 1 most of the time; skipping the multiply keeps integer math
    # exact and the graph small. A lifted (array) alpha always multiplies.
    if isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha == 1:
        return other
    return other * alpha


@overload
def _bin_operands(self: Array, other: Array) -> tuple[Array, Array]: ...
@overload
def _bin_operands(self: Array, other: Scalar) -> tuple[Array, Scalar]: ...
@overload
def _bin_operands(self: Scalar, other: Scalar) -> tuple[Scalar, Scalar]: ...
def _bin_operands(self: Scalar, other: Scalar) -> tuple[Scalar, Scalar]:
    """Upcast bf16/f16 operands so the op runs in float32, like torch."""
    if (is_float(self) or is_float(other)) and not (jnp.iscomplexobj(self) or jnp.iscomplexobj(other)):
        return _f32_if_low(self), _f32_if_low(other)
    return self, other


@overload
def _f32_if_low(x: Array) -> Array: ...
@overload
def _f32_if_low(x: Scalar) -> Scalar: ...
def _f32_if_low(x: Scalar) -> Scalar:
    if hasattr(x, "dtype") and jnp.dtype(x.dtype) in (jnp.bfloat16, jnp.float16):
        return cast(Array, x).astype(jnp.float32)  # numbers have no dtype
    return x


@register("add.Tensor", "add.Scalar")
def _add(self: Array, other: Scalar, alpha: Scalar = 1) -> Array:
    if hasattr(self, "dtype") and self.dtype == jnp.bool_ and getattr(other, "dtype", None) == jnp.bool_:
        return jnp.logical_or(self, other)  # bool + bool is "or" in torch
    a, b = _bin_operands(self, other)
    return a + _alpha_mul(b, alpha)


@register("sub.Tensor", "sub.Scalar")
def _sub(self: Array, other: Scalar, alpha: Scalar = 1) -> Array:
    a, b = _bin_operands(self, other)
    return a - _alpha_mul(b, alpha)


@register("rsub.Tensor", "rsub.Scalar")
def _rsub(self: Array, other: Scalar, alpha: Scalar = 1) -> Array:
    a, b = _bin_operands(self, other)
    return b - _alpha_mul(a, alpha)


@register("mul.Tensor", "mul.Scalar")
def _mul(self: Array, other: Scalar) -> Array:
    if getattr(self, "dtype", None) == jnp.bool_ and getattr(other, "dtype", None) == jnp.bool_:
        return jnp.logical_and(self, other)
    a, b = _bin_operands(self, other)
    return a * b


def _true_div(a: Scalar, b: Scalar) -> Array:
    a, b = _bin_operands(a, b)
    if is_int(a) and is_int(b):
        a = jnp.asarray(a, jnp.float32)
        b = jnp.asarray(b, jnp.float32)
    return jnp.true_divide(a, b)


def _floor_div(a: Scalar, b: Scalar) -> Array:
    if is_int(a) and is_int(b):
        return jnp.floor_divide(a, b)
    a, b = _bin_operands(a, b)
    return jnp.floor_divide(a, b)


def _trunc_div(a: Scalar, b: Scalar) -> Array:
    if is_int(a) and is_int(b):
        a, b = jnp.asarray(a), jnp.asarray(b)
        dt = jnp.result_type(a, b)
        # lax.div truncates toward zero on integers (C semantics).
        return lax.div(a.astype(dt), b.astype(dt))
    return jnp.trunc(_true_div(a, b))


@register("div.Tensor", "div.Scalar")
def _div(self: Array, other: Scalar) -> Array:
    return _true_div(self, other)


@register("div.Tensor_mode", "div.Scalar_mode")
def _div_mode(self: Array, other: Scalar, *, rounding_mode: str | None = None) -> Array:
    if rounding_mode is None:
        return _true_div(self, other)
    if rounding_mode == "floor":
        return _floor_div(self, other)
    if rounding_mode == "trunc":
        return _trunc_div(self, other)
    raise ValueError(f"div: unknown rounding_mode {rounding_mode!r}")


@register("floor_divide.default", "floor_divide.Scalar")
def _floor_divide(self: Array, other: Scalar) -> Array:
    return _floor_div(self, other)


@register("true_divide.Tensor", "true_divide.Scalar")
def _true_divide(self: Array, other: Scalar) -> Array:
    return _true_div(self, other)


@register("remainder.Tensor", "remainder.Scalar", "remainder.Scalar_Tensor")
def _remainder(self: Scalar, other: Scalar) -> Array:
    # Python sign rule (result has the divisor's sign), same as jnp.remainder.
    a, b = _bin_operands(self, other)
    return jnp.remainder(a, b)


@register("fmod.Tensor", "fmod.Scalar")
def _fmod(self: Array, other: Scalar) -> Array:
    # C sign rule (result has the dividend's sign).
    a, b = _bin_operands(self, other)
    return jnp.fmod(a, b)


# Exponents torch's pow kernel computes without a general pow (ATen's
# PowKernel.cpp and pow_out): they reach the lowering as Python numbers, so the
# program computes them the way eager does instead of XLA's pow(x, y). (-0.5 is
# torch's 1/sqrt, which XLA rewrites to its own rsqrt, 1 ulp off: it stays a pow.)
_POW_SPECIAL_EXPONENTS = (0, 1, 2, 3, 0.5, -1, -2)


def _pow_special(x: Array, e: int | float) -> Array:
    """``x ** e`` for a floating ``x`` and an exponent of _POW_SPECIAL_EXPONENTS, as torch computes it."""
    if e == 0:
        return jnp.ones_like(x)
    if e == 1:
        return x
    if e == 2:
        return x * x
    if e == 3:
        return x * x * x
    if e == 0.5:
        return jnp.sqrt(x)
    if e == -1:
        return 1 / x
    return 1 / (x * x)  # -2


@register("pow.Tensor_Scalar", static_scalars=_POW_SPECIAL_EXPONENTS)
def _pow_tensor_scalar(self: Array, exponent: Scalar) -> Array:
    if type(exponent) in (int, float) and exponent in _POW_SPECIAL_EXPONENTS and not is_int(self):
        if exponent == 0.5 and self.dtype == jnp.float16:
            # torch's half kernel has no sqrt shortcut: std::pow (pow(-inf, .5) = inf, not nan).
            return jnp.power(_f32_if_low(self), exponent)
        return _pow_special(_f32_if_low(self), cast(float, exponent))  # a Python number (tested above)
    return _pow(self, exponent)


@register("pow.Tensor_Tensor", "pow.Scalar")
def _pow(self: Scalar, exponent: Scalar) -> Array:
    # A Python int exponent keeps jnp's exact integer_pow path (x**2 as x*x).
    if isinstance(exponent, int) and not isinstance(exponent, bool):
        if is_int(self):
            return jnp.power(self, exponent)
        return jnp.power(_f32_if_low(self), exponent)
    a, b = _bin_operands(self, exponent)
    return jnp.power(a, b)


@register("float_power.Tensor_Tensor", "float_power.Tensor_Scalar", "float_power.Scalar")
def _float_power(self: Scalar, exponent: Scalar) -> Array:
    return jnp.power(upcast(self), upcast(exponent))


@register("atan2.default")
def _atan2(self: Array, other: Array) -> Array:
    return jnp.arctan2(upcast(self), upcast(other))


@register("hypot.default")
def _hypot(self: Array, other: Array) -> Array:
    return jnp.hypot(upcast(self), upcast(other))


@register("copysign.Tensor", "copysign.Scalar")
def _copysign(self: Array, other: Scalar) -> Array:
    return jnp.copysign(upcast(self), upcast(other))


@register("nextafter.default")
def _nextafter(self: Array, other: Array) -> Array:
    return jnp.nextafter(self, other)


@register("xlogy.Tensor", "xlogy.Scalar_Self", "xlogy.Scalar_Other")
def _xlogy(self: Scalar, other: Scalar) -> Array:
    return jax.scipy.special.xlogy(upcast(self), upcast(other))


@register("special_xlog1py.default")
def _xlog1py(self: Array, other: Array) -> Array:
    return jax.scipy.special.xlog1py(upcast(self), upcast(other))


@register("logaddexp.default")
def _logaddexp(self: Array, other: Array) -> Array:
    return jnp.logaddexp(upcast(self), upcast(other))


@register("logaddexp2.default")
def _logaddexp2(self: Array, other: Array) -> Array:
    return jnp.logaddexp2(upcast(self), upcast(other))


@register("maximum.default")
def _maximum(self: Array, other: Array) -> Array:
    return jnp.maximum(self, other)  # propagates NaN, as torch


@register("minimum.default")
def _minimum(self: Array, other: Array) -> Array:
    return jnp.minimum(self, other)


@register("fmax.default")
def _fmax(self: Array, other: Array) -> Array:
    return jnp.fmax(self, other)  # ignores NaN


@register("fmin.default")
def _fmin(self: Array, other: Array) -> Array:
    return jnp.fmin(self, other)


@register("clamp.default", "clamp.Tensor")
def _clamp(self: Array, min: Scalar | None = None, max: Scalar | None = None) -> Array:
    x = self
    if min is not None:
        x = jnp.maximum(x, min)
    if max is not None:
        # applied last, so min > max gives max everywhere, as torch does
        x = jnp.minimum(x, max)
    return x


@register("clamp_min.default", "clamp_min.Tensor")
def _clamp_min(self: Array, min: Scalar) -> Array:
    return jnp.maximum(self, min)


@register("clamp_max.default", "clamp_max.Tensor")
def _clamp_max(self: Array, max: Scalar) -> Array:
    return jnp.minimum(self, max)


def _lerp_branch(self: torch.Tensor, end: torch.Tensor, weight: torch.Tensor | Number) -> bool | None:
    """``|weight| < 0.5`` for a Python-number weight (as the float32 the program computes with), else None."""
    if type(weight) is float or type(weight) is int:
        return bool(abs(np.float32(weight)) < 0.5)
    return None


@register("lerp.Scalar", "lerp.Tensor", branch=_lerp_branch)
def _lerp(self: Array, end: Array, weight: Scalar, branch: bool | None = None) -> Array:
    a, b = _bin_operands(self, end)
    w = _f32_if_low(weight)
    # torch switches formula at |w| < 0.5 for accuracy at both ends:
    #   a + w * (b - a)   or   b - (b - a) * (1 - w).
    diff = b - a
    if branch is not None:
        # A Python-number weight (AdamW's 1 - beta1, an EMA's 1 - decay):
        # the host picked the formula; the weight stays a runtime input.
        return a + w * diff if branch else b - diff * (1 - w)
    # The second formula is b + (w - 1) * (b - a) bit for bit (negation is
    # exact), so both are base + c * (b - a) and only (base, c) depend on the
    # branch: with a 0-d tensor weight the choice of c is scalar work instead
    # of computing both formulas for every element.
    lo = jnp.abs(w) < 0.5
    if jnp.ndim(w) == 0 and jnp.shape(a) == jnp.shape(b) and jnp.result_type(a) == jnp.result_type(b):
        # lax.select takes a scalar predicate as it is: jnp.where would
        # broadcast it to a and b's shape and trace a nested jit per shape (one
        # per parameter in an optimizer step; a call op each in the program).
        return lax.select(lo, a, b) + lax.select(lo, w, w - 1) * diff
    return jnp.where(lo, a, b) + jnp.where(lo, w, w - 1) * diff


@register("addcmul.default")
def _addcmul(self: Array, tensor1: Array, tensor2: Array, *, value: Scalar = 1) -> Array:
    a, t1 = _bin_operands(self, tensor1)
    _, t2 = _bin_operands(self, tensor2)
    return a + value * t1 * t2


@register("addcdiv.default")
def _addcdiv(self: Array, tensor1: Array, tensor2: Array, *, value: Scalar = 1) -> Array:
    a, t1 = _bin_operands(self, tensor1)
    _, t2 = _bin_operands(self, tensor2)
    return a + value * (t1 / t2)


# ---------------------------------------------------------------------------
# Comparisons, logical and bitwise ops


for _name, _cmp_fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
}.items():

    def _cmp(self: Array, other: Scalar, _fn: Callable[[Scalar, Scalar], Array] = _cmp_fn) -> Array:
        return _fn(self, other)

    register(f"{_name}.Tensor", f"{_name}.Scalar")(_cmp)


@register("logical_not.default")
def _logical_not(self: Array) -> Array:
    return jnp.logical_not(self)


@register("logical_and.default")
def _logical_and(self: Array, other: Array) -> Array:
    return jnp.logical_and(self, other)


@register("logical_or.default")
def _logical_or(self: Array, other: Array) -> Array:
    return jnp.logical_or(self, other)


@register("logical_xor.default")
def _logical_xor(self: Array, other: Array) -> Array:
    return jnp.logical_xor(self, other)


@register("bitwise_not.default")
def _bitwise_not(self: Array) -> Array:
    if self.dtype == jnp.bool_:
        return jnp.logical_not(self)
    return jnp.bitwise_not(self)


for _name, _bit_fn in {
    "bitwise_and": jnp.bitwise_and,
    "bitwise_or": jnp.bitwise_or,
    "bitwise_xor": jnp.bitwise_xor,
}.items():

    def _bitwise(self: Scalar, other: Scalar, _fn: Callable[[Scalar, Scalar], Array] = _bit_fn) -> Array:
        return _fn(self, other)

    register(f"{_name}.Tensor", f"{_name}.Scalar", f"{_name}.Scalar_Tensor")(_bitwise)


@register(
    "bitwise_left_shift.Tensor",
    "bitwise_left_shift.Tensor_Scalar",
    "bitwise_left_shift.Scalar_Tensor",
    "__lshift__.Tensor",
    "__lshift__.Scalar",
)
def _lshift(self: Scalar, other: Scalar) -> Array:
    return jnp.left_shift(self, other)


@register(
    "bitwise_right_shift.Tensor",
    "bitwise_right_shift.Tensor_Scalar",
    "bitwise_right_shift.Scalar_Tensor",
    "__rshift__.Tensor",
    "__rshift__.Scalar",
)
def _rshift(self: Scalar, other: Scalar) -> Array:
    # Arithmetic shift for signed types, as torch.
    return jnp.right_shift(self, other)


@register("where.self", "where.ScalarSelf", "where.ScalarOther", "where.Scalar")
def _where(condition: Array, self: Scalar, other: Scalar) -> Array:
    return jnp.where(condition, self, other)


@register("gcd.default")
def _gcd(self: Array, other: Array) -> Array:
    return jnp.gcd(self, other)


@register("lcm.default")
def _lcm(self: Array, other: Array) -> Array:
    return jnp.lcm(self, other)


@register("heaviside.default")
def _heaviside(self: Array, values: Array) -> Array:
    return jnp.where(self == 0, values, (self > 0).astype(jnp.result_type(self, values)))


@register("real.default")
def _real(self: Array) -> Array:
    return jnp.real(self)


@register("imag.default")
def _imag(self: Array) -> Array:
    return jnp.imag(self)


@register("conj_physical.default", "_conj_physical.default")
def _conj(self: Array) -> Array:
    if jnp.iscomplexobj(self):
        return jnp.conj(self)
    return self


# XlaTensors never carry torch's conj/neg bits (the views compute their
# values, spmdtorch/ops/views.py), so resolving them is a copy.
@register("resolve_conj.default", "resolve_neg.default")
def _resolve(self: Array) -> Array:
    return self


@register("angle.default")
def _angle(self: Array) -> Array:
    if jnp.iscomplexobj(self):
        return jnp.angle(self)
    x = upcast(self)
    return jnp.where(x < 0, jnp.pi, 0.0).astype(x.dtype) + jnp.where(jnp.isnan(x), x, 0)


@register("polar.default")
def _polar(abs: Array, angle: Array) -> Array:
    return lax.complex(abs * jnp.cos(angle), abs * jnp.sin(angle))


@register("complex.default")
def _complex(real: Array, imag: Array) -> Array:
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


def _trigamma(x: Array) -> Array:
    """torch's trigamma: reflection below 0.5, six recurrence steps, asymptotic series."""
    neg = x < 0.5
    sin_pi_x = jnp.sin(jnp.pi * x)
    result = jnp.where(neg, -(jnp.pi * jnp.pi) / (sin_pi_x * sin_pi_x), 0.0)
    x = jnp.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(neg, -result, result)


def _hurwitz_zeta_int(s: int, q: Array) -> Array:
    """zeta(s, q) for an integer s >= 2 and any q (torch's Cephes zeta also sums
    the terms (q + k)^-s for negative q): shift q up to >= 1 term by term."""
    m = jnp.maximum(jnp.ceil(1 - q), 0).astype(jnp.int32)
    mmax = jnp.max(m) if m.size else jnp.int32(0)

    def body(c: tuple[Array, Array]) -> tuple[Array, Array]:
        k, acc = c
        return k + 1, acc + jnp.where(k < m, (q + k) ** (-s), 0.0)

    _, head = lax.while_loop(lambda c: c[0] < mmax, body, (jnp.int32(0), jnp.zeros_like(q)))
    tail = jax.scipy.special.zeta(jnp.asarray(s, q.dtype), q + m)
    pole = (q <= 0) & (q == jnp.floor(q))
    return jnp.where(pole, jnp.inf, head + tail)


@register("polygamma.default")
def _polygamma(n: int, self: Array) -> Array:
    x = upcast(self)
    if n == 0:
        return jax.scipy.special.digamma(x)
    if n == 1:
        return _trigamma(x)
    # torch: (-1)^(n+1) n! zeta(n + 1, x)
    sign = 1.0 if n % 2 else -1.0
    return sign * math.exp(math.lgamma(n + 1.0)) * _hurwitz_zeta_int(n + 1, x)


@register("special_zeta.default", "special_zeta.self_scalar", "special_zeta.other_scalar")
def _zeta(self: Scalar, other: Scalar) -> Array:
    return jax.scipy.special.zeta(upcast(self), upcast(other))


@register("frexp.Tensor")
def _frexp(self: Array) -> tuple[Array, Array]:
    # Exact in float32 for bf16/f16 inputs; the engine rounds the mantissa back.
    mantissa, exponent = jnp.frexp(upcast(self))
    return mantissa, exponent.astype(jnp.int32)


@register("searchsorted.Tensor", "searchsorted.Scalar")
def _searchsorted(
    sorted_sequence: Array,
    self: Scalar,
    *,
    out_int32: bool = False,
    right: bool = False,
    side: str | None = None,
    sorter: Array | None = None,
) -> Array:
    side = side or ("right" if right else "left")
    seq = sorted_sequence
    if sorter is not None:
        seq = jnp.take_along_axis(seq, sorter.astype(jnp.int32), axis=-1)
    values = jnp.asarray(self)
    if seq.size == 0 or values.size == 0:
        shape = values.shape if seq.ndim <= 1 else seq.shape[:-1] + values.shape[-1:]
        return jnp.zeros(shape, jnp.int32)
    if seq.ndim <= 1:
        return jnp.searchsorted(seq, values, side=side).astype(jnp.int32)
    # One search per leading index: sorted_sequence[..., :] against self[..., :].
    batch = seq.shape[:-1]
    flat_seq = seq.reshape((-1, seq.shape[-1]))
    flat_val = jnp.broadcast_to(values, batch + values.shape[-1:]).reshape((flat_seq.shape[0], -1))
    out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(flat_seq, flat_val)
    return out.reshape(batch + values.shape[-1:]).astype(jnp.int32)
