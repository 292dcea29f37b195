"""Random ops. Each lowering takes ``key=`` (a JAX PRNG key) from the engine.

Values follow torch's distributions, not its CPU generator's bit streams.
In-place-only ops (``uniform_``, ``normal_``, ``bernoulli_``...) return the
new value of ``self``. ``Scalar``/``float`` parameters may be traced.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax.typing import DTypeLike

from spmdtorch.ops._util import Array, Scalar, jdtype
from spmdtorch.ops.registry import register


def _float_dtype(dt: DTypeLike) -> np.dtype:
    """Draw in the tensor's float dtype (f32 for integer targets)."""
    dt = jnp.dtype(dt)
    return dt if jnp.issubdtype(dt, jnp.floating) else jnp.dtype(jnp.float32)


def _uniform(
    key: Array, shape: Sequence[int], dtype: DTypeLike, low: Array | float = 0.0, high: Array | float = 1.0
) -> Array:
    # Drawn in the target dtype, not drawn in float32 and rounded: rounding
    # maps the top of [0, 1) onto 1.0 in bfloat16/float16, and torch's range
    # excludes the upper bound.
    dt = _float_dtype(dtype)
    return jax.random.uniform(key, shape, dt, low, high).astype(dtype)


@register("uniform.default", "uniform_.default", random=True)
def _uniform_op(
    self: Array,
    from_: Array | float = 0.0,
    to: Array | float = 1.0,
    *,
    generator: torch.Generator | None = None,
    key: Array,
    **kw: Array | float,
) -> Array:
    if "from" in kw:  # the schema name is ``from`` (a Python keyword)
        from_ = kw.pop("from")
    return _uniform(key, self.shape, self.dtype, from_, to)


@register("normal_.default", "normal_functional.default", random=True)
def _normal_(
    self: Array,
    mean: Array | float = 0.0,
    std: Array | float = 1.0,
    *,
    generator: torch.Generator | None = None,
    key: Array,
) -> Array:
    z = jax.random.normal(key, self.shape, jnp.float32)
    return (mean + z * std).astype(self.dtype)


@register("normal.Tensor_float", random=True)
def _normal_tf(mean: Array, std: Array | float = 1.0, *, generator: torch.Generator | None = None, key: Array) -> Array:
    z = jax.random.normal(key, mean.shape, jnp.float32)
    return mean + z * std


@register("normal.float_Tensor", random=True)
def _normal_ft(mean: Array | float, std: Array, *, generator: torch.Generator | None = None, key: Array) -> Array:
    z = jax.random.normal(key, std.shape, jnp.float32)
    return mean + z * std


@register("normal.Tensor_Tensor", random=True)
def _normal_tt(mean: Array, std: Array, *, generator: torch.Generator | None = None, key: Array) -> Array:
    shape = jnp.broadcast_shapes(mean.shape, std.shape)
    return mean + jax.random.normal(key, shape, jnp.float32) * std


@register("normal.float_float", random=True)
def _normal_ff(
    mean: Array | float,
    std: Array | float,
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    z = jax.random.normal(key, tuple(size), jnp.float32)
    return (mean + z * std).astype(jdtype(dtype, jnp.float32))


@register("rand.default", "rand.generator", "rand.names", "rand.generator_with_names", random=True)
def _rand(
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    names: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    return _uniform(key, tuple(size), jdtype(dtype, jnp.float32))


@register("randn.default", "randn.generator", "randn.names", "randn.generator_with_names", random=True)
def _randn(
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    names: Sequence[str] | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    dt = jdtype(dtype, jnp.float32)
    return jax.random.normal(key, tuple(size), jnp.float32).astype(dt)


@register("rand_like.default", random=True)
def _rand_like(
    self: Array,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
    key: Array,
) -> Array:
    return _uniform(key, self.shape, jdtype(dtype, self.dtype))


@register("randn_like.default", random=True)
def _randn_like(
    self: Array,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
    key: Array,
) -> Array:
    dt = jdtype(dtype, self.dtype)
    return jax.random.normal(key, self.shape, jnp.float32).astype(dt)


def _randint(key: Array, low: int | Array, high: int | Array, shape: Sequence[int], dt: DTypeLike) -> Array:
    dt = jnp.dtype(dt)
    if jnp.issubdtype(dt, jnp.integer):
        return jax.random.randint(key, shape, low, high, dt)
    v = jax.random.randint(key, shape, low, high, jnp.int32)
    return v.astype(dt)


@register("randint.default", "randint.generator", random=True, lift_scalars=False)
def _randint_high(
    high: int,
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    return _randint(key, 0, high, tuple(size), jdtype(dtype, jnp.int32))


@register("randint.low", "randint.low_generator", random=True, lift_scalars=False)
def _randint_low(
    low: int,
    high: int,
    size: Sequence[int],
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    return _randint(key, low, high, tuple(size), jdtype(dtype, jnp.int32))


@register("randint_like.default", random=True, lift_scalars=False)
def _randint_like(
    self: Array,
    high: int,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
    key: Array,
) -> Array:
    return _randint(key, 0, high, self.shape, jdtype(dtype, self.dtype))


@register("randint_like.low_dtype", random=True, lift_scalars=False)
def _randint_like_low(
    self: Array,
    low: int,
    high: int,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
    key: Array,
) -> Array:
    return _randint(key, low, high, self.shape, jdtype(dtype, self.dtype))


@register("random_.default", random=True)
def _random_(self: Array, *, generator: torch.Generator | None = None, key: Array) -> Array:
    # torch draws from [0, 2**mantissa] for floats and the dtype's range for
    # ints; the int32 storage range is the usable one here.
    dt = jnp.dtype(self.dtype)
    if dt == jnp.bool_:
        return jax.random.bernoulli(key, 0.5, self.shape)
    if jnp.issubdtype(dt, jnp.floating):
        hi = 2 ** (jnp.finfo(dt).nmant + 1)
        return jax.random.randint(key, self.shape, 0, min(hi, 2**31 - 1), jnp.int32).astype(dt)
    top = int(jnp.iinfo(dt).max)  # inclusive, as in torch
    if top < 2**31 - 1:
        return jax.random.randint(key, self.shape, 0, top + 1, jnp.int32).astype(dt)
    # [0, 2**31 - 1]: the top bit of uniform uint32 words cleared (int64
    # tensors are stored as int32, see spmdtorch._dtypes).
    return (jax.random.bits(key, self.shape, jnp.uint32) >> 1).astype(dt)


@register("random_.from", random=True, lift_scalars=False)
def _random_from(
    self: Array, from_: int, to: int | None = None, *, generator: torch.Generator | None = None, key: Array, **kw: int
) -> Array:
    hi = to if to is not None else 2**31 - 1
    return _randint(key, from_, hi, self.shape, self.dtype)


@register("random_.to", random=True, lift_scalars=False)
def _random_to(self: Array, to: int, *, generator: torch.Generator | None = None, key: Array) -> Array:
    return _randint(key, 0, to, self.shape, self.dtype)


@register("bernoulli.default", random=True)
def _bernoulli(self: Array, *, generator: torch.Generator | None = None, key: Array) -> Array:
    return jax.random.bernoulli(key, self.astype(jnp.float32)).astype(self.dtype)


@register("bernoulli.p", "bernoulli_.float", random=True)
def _bernoulli_p(self: Array, p: Array | float = 0.5, *, generator: torch.Generator | None = None, key: Array) -> Array:
    return jax.random.bernoulli(key, p, self.shape).astype(self.dtype)


@register("bernoulli_.Tensor", random=True)
def _bernoulli_t(self: Array, p: Array, *, generator: torch.Generator | None = None, key: Array) -> Array:
    probs = jnp.broadcast_to(p.astype(jnp.float32), self.shape)
    return jax.random.bernoulli(key, probs).astype(self.dtype)


@register("exponential_.default", "exponential.default", random=True)
def _exponential(
    self: Array, lambd: Array | float = 1.0, *, generator: torch.Generator | None = None, key: Array
) -> Array:
    return (jax.random.exponential(key, self.shape, jnp.float32) / lambd).astype(self.dtype)


@register("geometric_.default", "geometric.default", random=True)
def _geometric(self: Array, p: Array | float, *, generator: torch.Generator | None = None, key: Array) -> Array:
    u = jax.random.uniform(key, self.shape, jnp.float32, minval=jnp.finfo(jnp.float32).tiny)
    return jnp.ceil(jnp.log(u) / jnp.log1p(-p)).astype(self.dtype)


@register("log_normal_.default", "log_normal.default", random=True)
def _log_normal(
    self: Array,
    mean: Array | float = 1.0,
    std: Array | float = 2.0,
    *,
    generator: torch.Generator | None = None,
    key: Array,
) -> Array:
    return jnp.exp(mean + std * jax.random.normal(key, self.shape, jnp.float32)).astype(self.dtype)


@register("cauchy_.default", "cauchy.default", random=True)
def _cauchy(
    self: Array,
    median: Array | float = 0.0,
    sigma: Array | float = 1.0,
    *,
    generator: torch.Generator | None = None,
    key: Array,
) -> Array:
    return (median + sigma * jax.random.cauchy(key, self.shape, jnp.float32)).astype(self.dtype)


@register("randperm.default", "randperm.generator", random=True)
def _randperm(
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    key: Array,
) -> Array:
    return jax.random.permutation(key, n).astype(jdtype(dtype, jnp.int32))


@register("multinomial.default", random=True)
def _multinomial(
    self: Array, num_samples: int, replacement: bool = False, *, generator: torch.Generator | None = None, key: Array
) -> Array:
    logits = jnp.log(self.astype(jnp.float32))
    if replacement:
        shape = self.shape[:-1] + (num_samples,)
        s = jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
        return s.astype(jnp.int32)
    # Without replacement: Gumbel top-k (exactly sequential sampling w/o replacement).
    g = jax.random.gumbel(key, logits.shape, jnp.float32)
    return jax.lax.top_k(logits + g, num_samples)[1].astype(jnp.int32)


@register("native_dropout.default", random=True)
def _native_dropout(input: Array, p: Array | float, train: bool | None, *, key: Array) -> tuple[Array, Array]:
    if train is not None and not train:
        return input, jnp.ones(input.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1.0 - p, input.shape)
    # p == 1 drops everything (torch uses scale 0 there, not inf).
    scale = jnp.where(p < 1, 1.0 / jnp.maximum(1.0 - p, 1e-30), 0.0)
    out = jnp.where(keep, input.astype(jnp.float32) * scale, 0.0)
    return out.astype(input.dtype) if jnp.issubdtype(input.dtype, jnp.floating) else out, keep


@register("native_dropout_backward.default")
def _native_dropout_backward(grad_output: Array, mask: Array, scale: Array | float) -> Array:
    g = grad_output.astype(jnp.float32) if grad_output.dtype != jnp.float32 else grad_output
    return g * mask.astype(g.dtype) * scale


@register("rrelu_with_noise.default", random=True)
def _rrelu_with_noise(
    self: Array,
    noise: Array,
    lower: Scalar = 0.125,
    upper: Scalar = 1.0 / 3.0,
    training: bool = False,
    generator: torch.Generator | None = None,
    *,
    key: Array,
) -> Array:
    if not training:
        neg = (lower + upper) / 2
        return jnp.where(self >= 0, self, self * neg)
    a = jax.random.uniform(key, self.shape, jnp.float32, lower, upper)
    return jnp.where(self >= 0, self, self * a)
