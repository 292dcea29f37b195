"""Tensor factories and copies: full/zeros/ones/empty, *_like, new_*, arange,
linspace, eye, scalar_tensor, _to_copy, clone, copy, fill, zero.

``empty`` tensors are zero-filled (XLA has no uninitialised buffers, and
deterministic zeros beat garbage). Layout/device/pin_memory/memory_format
arguments are accepted and ignored: the engine owns placement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import numpy.typing as npt
import torch
from jax.typing import DTypeLike

from spmdtorch.ops._util import Array, Number, Scalar, jdtype
from spmdtorch.ops.registry import register

# jax types its scalar types Any: the annotations give them a type.
_BOOL: DTypeLike = jnp.bool_
_INT32: DTypeLike = jnp.int32
_COMPLEX64: DTypeLike = jnp.complex64
_FLOAT32: DTypeLike = jnp.float32


def _scalar_dtype(value: Scalar | complex) -> DTypeLike:
    """torch's dtype for a bare Python scalar (bool, int64, default float)."""
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, int):
        return _INT32
    if isinstance(value, complex):
        return _COMPLEX64
    if isinstance(value, float):
        return _FLOAT32
    dtype: DTypeLike = getattr(value, "dtype", _FLOAT32)
    return dtype


@register("full.default", "full.names")
def _full(
    size: Sequence[int],
    fill_value: Scalar,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    names: Sequence[str] | None = None,
) -> Array:
    dt = jdtype(dtype, _scalar_dtype(fill_value))
    return jnp.full(tuple(size), fill_value, dtype=dt)


@register("zeros.default", "zeros.names", "_efficientzerotensor.default")
def _zeros(
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    names: Sequence[str] | None = None,
) -> Array:
    return jnp.zeros(tuple(size), jdtype(dtype, jnp.float32))


@register("ones.default", "ones.names")
def _ones(
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    names: Sequence[str] | None = None,
) -> Array:
    return jnp.ones(tuple(size), jdtype(dtype, jnp.float32))


@register("empty.memory_format", "empty_permuted.default")
def _empty(
    size: Sequence[int],
    *args: Sequence[int],
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
) -> Array:
    return jnp.zeros(tuple(size), jdtype(dtype, jnp.float32))


@register("empty_strided.default")
def _empty_strided(
    size: Sequence[int],
    stride: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.zeros(tuple(size), jdtype(dtype, jnp.float32))


@register("new_empty.default", "new_zeros.default")
def _new_zeros(
    self: Array,
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.zeros(tuple(size), jdtype(dtype, self.dtype))


@register("new_empty_strided.default")
def _new_empty_strided(
    self: Array,
    size: Sequence[int],
    stride: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.zeros(tuple(size), jdtype(dtype, self.dtype))


@register("new_ones.default")
def _new_ones(
    self: Array,
    size: Sequence[int],
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.ones(tuple(size), jdtype(dtype, self.dtype))


@register("new_full.default")
def _new_full(
    self: Array,
    size: Sequence[int],
    fill_value: Scalar,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.full(tuple(size), fill_value, jdtype(dtype, self.dtype))


@register("full_like.default")
def _full_like(
    self: Array,
    fill_value: Scalar,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
) -> Array:
    return jnp.full(self.shape, fill_value, jdtype(dtype, self.dtype))


@register("zeros_like.default", "empty_like.default")
def _zeros_like(
    self: Array,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
) -> Array:
    return jnp.zeros(self.shape, jdtype(dtype, self.dtype))


@register("ones_like.default")
def _ones_like(
    self: Array,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    memory_format: torch.memory_format | None = None,
) -> Array:
    return jnp.ones(self.shape, jdtype(dtype, self.dtype))


@register("scalar_tensor.default")
def _scalar_tensor(
    s: Scalar,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return jnp.asarray(s, jdtype(dtype, jnp.float32))


def _arange_values(start: Number, end: Number, step: Number, dtype: torch.dtype | None) -> Array:
    """Compute arange on the host in float64/int64, as torch does.

    The length is ``ceil((end - start) / step)`` in double precision and the
    values are ``start + i * step``; both are static (lift_scalars=False).
    """
    if dtype is None:
        is_int = all(isinstance(v, int) for v in (start, end, step))
        dt = jnp.int32 if is_int else jnp.float32
    else:
        dt = jdtype(dtype)
    n = max(0, math.ceil((float(end) - float(start)) / float(step)))
    vals: npt.NDArray[Any]
    if isinstance(start, int) and isinstance(step, int):
        vals = start + np.arange(n, dtype=np.int64) * step
    else:
        vals = float(start) + np.arange(n, dtype=np.float64) * float(step)
    if jnp.issubdtype(dt, jnp.integer) and vals.dtype.kind == "f":
        vals = np.trunc(vals)
    return jnp.asarray(vals.astype(np.dtype(dt) if dt != jnp.bfloat16 else np.float32), dt)


@register("arange.default", lift_scalars=False)
def _arange(
    end: Number,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return _arange_values(0, end, 1, dtype)


@register("arange.start", lift_scalars=False)
def _arange_start(
    start: Number,
    end: Number,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return _arange_values(start, end, 1, dtype)


@register("arange.start_step", lift_scalars=False)
def _arange_start_step(
    start: Number,
    end: Number,
    step: Number = 1,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    return _arange_values(start, end, step, dtype)


@register("linspace.default")
def _linspace(
    start: Scalar,
    end: Scalar,
    steps: int,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    dt = jdtype(dtype, jnp.float32)
    if steps == 1:
        return jnp.full((1,), start, dt)
    # torch fills the first half from start and the second half from end,
    # which keeps both endpoints exact.
    i = jnp.arange(steps, dtype=jnp.float32)
    step = (jnp.asarray(end, jnp.float32) - jnp.asarray(start, jnp.float32)) / (steps - 1)
    half = steps // 2
    vals = jnp.where(i < half, start + step * i, end - step * (steps - 1 - i))
    if jnp.issubdtype(dt, jnp.integer):
        vals = jnp.trunc(vals)
    return vals.astype(dt)


@register("logspace.default")
def _logspace(
    start: Scalar,
    end: Scalar,
    steps: int,
    base: Array | float = 10.0,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    dt = jdtype(dtype, jnp.float32)
    return jnp.power(base, _linspace(start, end, steps)).astype(dt)


@register("eye.default", "eye.m")
def _eye(
    n: int,
    m: int | None = None,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    if not isinstance(m, (int, type(None))):
        m = None
    return jnp.eye(n, n if m is None else m, dtype=jdtype(dtype, jnp.float32))


@register("tril_indices.default")
def _tril_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    r, c = np.tril_indices(row, offset, col)
    return jnp.asarray(np.stack([r, c]), jdtype(dtype, jnp.int32))


@register("triu_indices.default")
def _triu_indices(
    row: int,
    col: int,
    offset: int = 0,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
) -> Array:
    r, c = np.triu_indices(row, offset, col)
    return jnp.asarray(np.stack([r, c]), jdtype(dtype, jnp.int32))


# ---------------------------------------------------------------------------
# Copies


@register("_to_copy.default")
def _to_copy(
    self: Array,
    *,
    dtype: torch.dtype | None = None,
    layout: torch.layout | None = None,
    device: torch.device | None = None,
    pin_memory: bool | None = None,
    non_blocking: bool = False,
    memory_format: torch.memory_format | None = None,
) -> Array:
    if dtype is None:
        return self  # device moves are the engine's business
    return _convert(self, jdtype(dtype))


def _convert(x: Array, dt: DTypeLike) -> Array:
    """astype with torch's float->int rule (truncate toward zero)."""
    dt = jnp.dtype(dt)
    if jnp.issubdtype(x.dtype, jnp.floating) and (jnp.issubdtype(dt, jnp.integer)):
        # XLA float->int conversion truncates; torch does too. NaN/overflow
        # are undefined behaviour in both.
        return x.astype(dt)
    if jnp.iscomplexobj(x) and not jnp.issubdtype(dt, jnp.complexfloating):
        x = jnp.real(x)
    return x.astype(dt)


@register("clone.default", "contiguous.default", "_copy_from_and_resize.default")
def _clone(self: Array, *, memory_format: torch.memory_format | None = None) -> Array:
    # JAX arrays are immutable; "copying" is the identity on values.
    return self


@register("copy.default", "copy_.default")
def _copy(self: Array, src: Array, non_blocking: bool = False) -> Array:
    return jnp.broadcast_to(_convert(jnp.asarray(src), self.dtype), self.shape)


@register("_copy_from.default")
def _copy_from(self: Array, dst: Array, non_blocking: bool = False) -> Array:
    return jnp.broadcast_to(_convert(self, dst.dtype), dst.shape)


@register("fill.Scalar", "fill.Tensor", "fill_.Scalar", "fill_.Tensor")
def _fill(self: Array, value: Scalar) -> Array:
    return jnp.full(self.shape, value, self.dtype)


@register("zero.default", "zero_.default")
def _zero(self: Array) -> Array:
    return jnp.zeros(self.shape, self.dtype)


@register("_local_scalar_dense.default")
def _local_scalar_dense(self: Array) -> Scalar:
    # The engine turns the 0-d result into a Python number after execution.
    return self


@register("resize_.default", "resize.default")
def _resize(self: Array, size: Sequence[int], *, memory_format: torch.memory_format | None = None) -> Array:
    """Functional resize: keep the first ``numel`` elements, zero-fill growth."""
    n = int(np.prod(size)) if len(size) else 1
    flat = self.reshape(-1)
    if n <= flat.shape[0]:
        return flat[:n].reshape(tuple(size))
    return jnp.concatenate([flat, jnp.zeros((n - flat.shape[0],), self.dtype)]).reshape(tuple(size))
