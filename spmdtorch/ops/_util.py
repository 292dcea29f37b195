"""Small helpers shared by the lowering modules.

Nothing here is registered; these are the conventions every lowering needs:
dim canonicalisation (negative dims, ``dim=None``/``[]`` meaning "all dims",
0-d tensors), upcasting low-precision floats for accurate math, and dtype
queries on JAX arrays that may be tracers or Python scalars.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias, TypeVar, overload

import jax
import jax.numpy as jnp
import numpy as np
import torch

from spmdtorch._dtypes import to_jax_dtype

__all__ = [
    "canon_dim",
    "canon_dims",
    "reduce_dims",
    "is_float",
    "is_int",
    "upcast",
    "jdtype",
    "acc_dtype",
    "restore_keepdim",
    "Array",
    "Number",
    "Scalar",
    "Dims",
]

# The argument types of the lowerings (registry's calling convention): a tensor
# argument arrives as a JAX array (a tracer under jit), a ``Scalar`` one as a
# Python number or, where the engine lifted it (Lowering.lift_scalars), a 0-d array.
Array: TypeAlias = jax.Array
Number: TypeAlias = bool | int | float
Scalar: TypeAlias = Number | jax.Array
_D = TypeVar("_D")
# ATen's ``int[1]? dim``: one dim, several, or None (every dim).
Dims: TypeAlias = int | Sequence[int] | None

_LOW_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def canon_dim(dim: int, ndim: int) -> int:
    """Map a possibly negative ``dim`` into ``[0, ndim)``.

    A 0-d tensor accepts dims 0 and -1 (torch treats it as 1-d for dim
    checks); they map to 0, and callers handle ``ndim == 0`` themselves.
    """
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dim {dim} out of range for a {ndim}-d tensor")
    return dim % n


def canon_dims(dims: Sequence[int], ndim: int) -> tuple[int, ...]:
    """Canonicalise a list of dims (duplicates removed, order kept)."""
    out: list[int] = []
    for d in dims:
        c = canon_dim(d, ndim)
        if c not in out:
            out.append(c)
    return tuple(out)


def reduce_dims(dim: Dims, ndim: int) -> tuple[int, ...]:
    """The axes a reduction runs over.

    ``None`` and ``[]`` both mean every dim (ATen's ``int[1]? dim`` convention);
    a 0-d tensor reduces over nothing.
    """
    if ndim == 0:
        return ()
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(ndim))
    return canon_dims(dim, ndim)


# jax's scalar types (jnp.bool_, jnp.int32...) are typed Any, so np.dtype of them
# would be too: the annotations give these constants their type.
_BOOL: np.dtype = jnp.dtype(jnp.bool_)
_INT32: np.dtype = jnp.dtype(jnp.int32)
_UINT32: np.dtype = jnp.dtype(jnp.uint32)
_FLOAT32: np.dtype = jnp.dtype(jnp.float32)
_COMPLEX64: np.dtype = jnp.dtype(jnp.complex64)


def _dtype_of(x: Scalar | complex | np.ndarray) -> np.dtype:
    dt: np.dtype | None = getattr(x, "dtype", None)  # arrays, tracers and NumPy scalars
    if dt is not None:
        return np.dtype(dt)
    if isinstance(x, bool):
        return _BOOL
    if isinstance(x, int):
        return _INT32
    if isinstance(x, complex):
        return _COMPLEX64
    return _FLOAT32


def is_float(x: Scalar | complex | np.ndarray) -> bool:
    """True for floating (or complex) arrays and Python floats."""
    return jnp.issubdtype(_dtype_of(x), jnp.inexact)


def is_int(x: Scalar | complex | np.ndarray) -> bool:
    """True for integer and bool arrays / Python ints."""
    dt = _dtype_of(x)
    return jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_


@overload
def upcast(x: Array) -> Array: ...
@overload
def upcast(x: Scalar) -> Scalar: ...
def upcast(x: Scalar) -> Scalar:
    """Return ``x`` in float32 if it is bf16/f16 (torch computes those in f32).

    Integer and bool inputs become float32 too, which is what torch's
    "int -> default float" promotion of transcendental ops gives.
    """
    dt = _dtype_of(x)
    if dt in _LOW_FLOATS or not jnp.issubdtype(dt, jnp.inexact):
        return jnp.asarray(x, jnp.float32)
    return x


def acc_dtype(x: Scalar, dtype: torch.dtype | None = None) -> np.dtype:
    """Accumulation dtype of a sum-like reduction.

    ``dtype`` (a torch dtype or None) wins. Integer and bool inputs sum in the
    int64 storage type (int32), low-precision floats accumulate in float32.
    """
    if dtype is not None:
        jd = to_jax_dtype(dtype)
        if jd in _LOW_FLOATS:
            return _FLOAT32
        return jd
    dt = _dtype_of(x)
    if dt == jnp.bool_ or jnp.issubdtype(dt, jnp.integer):
        if dt in (_UINT32,):
            return dt
        return _INT32
    if dt in _LOW_FLOATS:
        return _FLOAT32
    return dt


@overload
def jdtype(dtype: torch.dtype) -> np.dtype: ...
@overload
def jdtype(dtype: torch.dtype | None) -> np.dtype | None: ...
@overload
def jdtype(dtype: torch.dtype | None, default: _D) -> np.dtype | _D: ...
def jdtype(dtype: torch.dtype | None, default: object = None) -> object:
    """Torch dtype (or None) -> JAX storage dtype, ``default`` if None."""
    if dtype is None:
        return default
    return to_jax_dtype(dtype)


def restore_keepdim(x: Array, axes: Sequence[int]) -> Array:
    """Re-insert size-1 dims at ``axes`` (sorted) after a reduction."""
    for a in sorted(axes):
        x = jnp.expand_dims(x, a)
    return x


def static_shape_numel(shape: Sequence[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
