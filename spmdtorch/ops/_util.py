"""Small helpers shared by the lowering modules.

Nothing here is registered; these are the conventions every lowering needs:
dim canonicalisation (negative dims, ``dim=None``/``[]`` meaning "all dims",
0-d tensors), upcasting low-precision floats for accurate math, and dtype
queries on JAX arrays that may be tracers or Python scalars.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

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
]

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


def canon_dims(dims, ndim: int) -> tuple[int, ...]:
    """Canonicalise a list of dims (duplicates removed, order kept)."""
    out = []
    for d in dims:
        c = canon_dim(d, ndim)
        if c not in out:
            out.append(c)
    return tuple(out)


def reduce_dims(dim, ndim: int) -> tuple[int, ...]:
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


def _dtype_of(x):
    if hasattr(x, "dtype"):
        return jnp.dtype(x.dtype)
    if isinstance(x, bool):
        return jnp.dtype(jnp.bool_)
    if isinstance(x, int):
        return jnp.dtype(jnp.int32)
    if isinstance(x, complex):
        return jnp.dtype(jnp.complex64)
    return jnp.dtype(jnp.float32)


def is_float(x) -> bool:
    """True for floating (or complex) arrays and Python floats."""
    return jnp.issubdtype(_dtype_of(x), jnp.inexact)


def is_int(x) -> bool:
    """True for integer and bool arrays / Python ints."""
    dt = _dtype_of(x)
    return jnp.issubdtype(dt, jnp.integer) or dt == jnp.bool_


def upcast(x):
    """Return ``x`` in float32 if it is bf16/f16 (torch computes those in f32).

    Integer and bool inputs become float32 too, which is what torch's
    "int -> default float" promotion of transcendental ops gives.
    """
    dt = _dtype_of(x)
    if dt in _LOW_FLOATS or not jnp.issubdtype(dt, jnp.inexact):
        return jnp.asarray(x, jnp.float32)
    return x


def acc_dtype(x, dtype=None):
    """Accumulation dtype of a sum-like reduction.

    ``dtype`` (a torch dtype or None) wins. Integer and bool inputs sum in the
    int64 storage type (int32), low-precision floats accumulate in float32.
    """
    if dtype is not None:
        jd = to_jax_dtype(dtype)
        if jd in _LOW_FLOATS:
            return jnp.dtype(jnp.float32)
        return jd
    dt = _dtype_of(x)
    if dt == jnp.bool_ or jnp.issubdtype(dt, jnp.integer):
        if dt in (jnp.dtype(jnp.uint32),):
            return dt
        return jnp.dtype(jnp.int32)
    if dt in _LOW_FLOATS:
        return jnp.dtype(jnp.float32)
    return dt


def jdtype(dtype, default=None):
    """Torch dtype (or None) -> JAX storage dtype, ``default`` if None."""
    if dtype is None:
        return default
    return to_jax_dtype(dtype)


def restore_keepdim(x, axes: Sequence[int]):
    """Re-insert size-1 dims at ``axes`` (sorted) after a reduction."""
    for a in sorted(axes):
        x = jnp.expand_dims(x, a)
    return x


def static_shape_numel(shape) -> int:
    return int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
