"""View ops (read side) and their inverses (write side).

A view op's lowering computes the view's *value* from its base. Writing
through a view (``x[0].add_(1)``, ``y = x.t(); y.mul_(2)``) is replayed
functionally: the engine computes the new view value, then calls the view's
inverse ``fn(base, new_view_value, *view_args, **view_kwargs) -> new_base``,
where ``view_args`` are the view op's arguments after ``self``. Multi-output
views (``split``, ``unbind``) take ``out_index=`` to say which output was
written.

``as_strided`` receives the *contiguous storage base* from the engine and is
a flat gather; its inverse is ``as_strided_scatter``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from spmdtorch._dtypes import to_torch_dtype
from spmdtorch.ops._util import Array, Dims, Scalar, canon_dim, jdtype
from spmdtorch.ops.registry import register, resolve_ops

__all__ = ["VIEW_INVERSES", "register_inverse", "get_inverse"]

# fn(base, new_view_value, *view_args, **view_kwargs) -> new_base
ViewInverse = Callable[..., Array]
VIEW_INVERSES: dict[torch._ops.OpOverload, ViewInverse] = {}
_I = TypeVar("_I", bound=ViewInverse)


def register_inverse(*names: str) -> Callable[[_I], _I]:
    """Register ``fn(base, new_view, *args, **kwargs) -> new_base`` for views."""

    def deco(fn: _I) -> _I:
        for name in names:
            for op in resolve_ops(name):
                VIEW_INVERSES[op] = fn
        return fn

    return deco


def get_inverse(op: torch._ops.OpOverload) -> ViewInverse | None:
    """Return the inverse registered for view op ``op``, or None."""
    return VIEW_INVERSES.get(op)


# ---------------------------------------------------------------------------
# Helpers


def _slice_bounds(size: int, start: int | None, end: int | None, step: int) -> slice:
    """ATen slice semantics: None/huge/negative bounds clamp like Python's."""
    start = 0 if start is None else start
    end = size if end is None else end
    if start < 0:
        start += size
    if end < 0:
        end += size
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    return slice(start, end, step)


def _index_at(ndim: int, dim: int, idx: int | slice | Array) -> tuple[int | slice | Array, ...]:
    return (slice(None),) * dim + (idx,)


def _squeeze_dims(shape: Sequence[int], dim: Dims) -> tuple[int, ...]:
    if dim is None:
        return tuple(i for i, s in enumerate(shape) if s == 1)
    if isinstance(dim, int):
        dim = [dim]
    if len(shape) == 0:
        return ()
    return tuple(sorted({canon_dim(d, len(shape)) for d in dim if shape[canon_dim(d, len(shape))] == 1}))


def _split_sizes_of(size: int, split_size: int) -> list[int]:
    if split_size == 0:
        return [size]  # only valid (torch) for size == 0: one empty chunk
    n = max(1, -(-size // split_size))
    return [min(split_size, size - i * split_size) for i in range(n)]


def _expand_shape(shape: Sequence[int], size: Sequence[int]) -> tuple[int, ...]:
    lead = len(size) - len(shape)
    out: list[int] = []
    for i, s in enumerate(size):
        if i < lead:
            out.append(s)
        else:
            out.append(shape[i - lead] if s == -1 else s)
    return tuple(out)


def _strided_indices(size: Sequence[int], stride: Sequence[int], offset: int | None) -> np.ndarray:
    idx = np.full(tuple(size), offset or 0, dtype=np.int64)
    for d, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * st).reshape(shape)
    return idx.astype(np.int32)


# ---------------------------------------------------------------------------
# Read side


@register("view.default", "_unsafe_view.default", "view_copy.default", "reshape.default", "_reshape_copy.default")
def _view(self: Array, size: Sequence[int]) -> Array:
    return jnp.reshape(self, tuple(size))


@register("_reshape_alias.default", "_reshape_alias_copy.default")
def _reshape_alias(self: Array, size: Sequence[int], stride: Sequence[int]) -> Array:
    return jnp.reshape(self, tuple(size))


@register("view.dtype", "view_copy.dtype")
def _view_dtype(self: Array, dtype: torch.dtype) -> Array:
    """Bitcast; a width change scales the last dim, as torch's ``view(dtype)``."""
    new = jdtype(dtype)
    if self.dtype == jnp.bool_ or new == jnp.bool_:
        # bool is one byte in torch; bitcast through uint8.
        src = self.astype(jnp.uint8) if self.dtype == jnp.bool_ else self
        out = _view_dtype_raw(src, jnp.dtype(jnp.uint8) if new == jnp.bool_ else new)
        return out != 0 if new == jnp.bool_ else out
    return _view_dtype_raw(self, new)


def _view_dtype_raw(self: Array, new: np.dtype) -> Array:
    old_bits = jnp.dtype(self.dtype).itemsize
    new_bits = jnp.dtype(new).itemsize
    if old_bits == new_bits:
        return lax.bitcast_convert_type(self, new)
    if old_bits > new_bits:
        out = lax.bitcast_convert_type(self, new)  # (..., n, ratio)
        return out.reshape(self.shape[:-1] + (self.shape[-1] * (old_bits // new_bits),))
    ratio = new_bits // old_bits
    x = self.reshape(self.shape[:-1] + (self.shape[-1] // ratio, ratio))
    return lax.bitcast_convert_type(x, new)


@register("permute.default", "permute_copy.default")
def _permute(self: Array, dims: Sequence[int]) -> Array:
    return jnp.transpose(self, [canon_dim(d, self.ndim) for d in dims] if self.ndim else ())


@register("transpose.int", "transpose_copy.int")
def _transpose(self: Array, dim0: int, dim1: int) -> Array:
    if self.ndim < 2:
        return self
    return jnp.swapaxes(self, canon_dim(dim0, self.ndim), canon_dim(dim1, self.ndim))


@register("t.default", "t_copy.default", "numpy_T.default")
def _t(self: Array) -> Array:
    return self.T if self.ndim == 2 else self


@register("mT.default", "adjoint.default")
def _mT(self: Array) -> Array:
    return jnp.swapaxes(self, -1, -2)


@register("select.int", "select_copy.int")
def _select(self: Array, dim: int, index: int) -> Array:
    d = canon_dim(dim, self.ndim)
    return self[_index_at(self.ndim, d, index)]


@register("slice.Tensor", "slice_copy.Tensor")
def _slice(self: Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Array:
    d = canon_dim(dim, self.ndim)
    return self[_index_at(self.ndim, d, _slice_bounds(self.shape[d], start, end, step))]


@register("narrow.default", "narrow_copy.default")
def _narrow(self: Array, dim: int, start: int, length: int) -> Array:
    d = canon_dim(dim, self.ndim)
    if start < 0:
        start += self.shape[d]
    return lax.slice_in_dim(self, start, start + length, axis=d)


@register(
    "squeeze.default", "squeeze.dim", "squeeze.dims", "squeeze_copy.default", "squeeze_copy.dim", "squeeze_copy.dims"
)
def _squeeze(self: Array, dim: int | Sequence[int] | None = None) -> Array:
    return jnp.squeeze(self, _squeeze_dims(self.shape, dim))


@register("unsqueeze.default", "unsqueeze_copy.default")
def _unsqueeze(self: Array, dim: int) -> Array:
    return jnp.expand_dims(self, canon_dim(dim, self.ndim + 1))


@register("expand.default", "expand_copy.default")
def _expand(self: Array, size: Sequence[int], *, implicit: bool = False) -> Array:
    return jnp.broadcast_to(self, _expand_shape(self.shape, size))


@register(
    "alias.default",
    "alias_copy.default",
    "detach.default",
    "detach_copy.default",
    "lift_fresh.default",
    "lift_fresh_copy.default",
    "lift.default",
    "view_as.default",
)
def _alias(self: Array, *args: object) -> Array:
    return self


# torch's conj/neg views set a bit that readers resolve; an XlaTensor carries
# no such bit, so the view's value is the conjugated/negated data itself.
@register("_conj.default")
def _conj_view(self: Array) -> Array:
    return jnp.conj(self) if jnp.iscomplexobj(self) else self


@register("_neg_view.default")
def _neg_view(self: Array) -> Array:
    return -self


@register("diagonal.default", "diagonal_copy.default")
def _diagonal(self: Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Array:
    # jnp.diagonal is typed Any.
    res: Array = jnp.diagonal(self, offset, canon_dim(dim1, self.ndim), canon_dim(dim2, self.ndim))
    return res


@register("unfold.default", "unfold_copy.default")
def _unfold(self: Array, dimension: int, size: int, step: int) -> Array:
    if self.ndim == 0:
        return jnp.reshape(self, (1,))
    d = canon_dim(dimension, self.ndim)
    n = (self.shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :]).astype(np.int32)
    out = jnp.take(self, idx, axis=d)  # (..., n, size, ...)
    return jnp.moveaxis(out, d + 1, -1)


@register("split.Tensor", "split_copy.Tensor", "unsafe_split.Tensor")
def _split(self: Array, split_size: int, dim: int = 0) -> list[Array]:
    d = canon_dim(dim, self.ndim)
    return _split_with_sizes(self, _split_sizes_of(self.shape[d], split_size), d)


@register("split_with_sizes.default", "split_with_sizes_copy.default", "unsafe_split_with_sizes.default")
def _split_with_sizes(self: Array, split_sizes: Sequence[int], dim: int = 0) -> list[Array]:
    d = canon_dim(dim, self.ndim)
    out, start = [], 0
    for s in split_sizes:
        out.append(lax.slice_in_dim(self, start, start + s, axis=d))
        start += s
    return out


@register("unbind.int", "unbind_copy.int")
def _unbind(self: Array, dim: int = 0) -> list[Array]:
    d = canon_dim(dim, self.ndim)
    return [lax.index_in_dim(self, i, d, keepdims=False) for i in range(self.shape[d])]


@register("as_strided.default", "as_strided_copy.default")
def _as_strided(self: Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Array:
    flat = jnp.reshape(self, (-1,))
    idx = _strided_indices(size, stride, storage_offset)
    return flat[idx]


@register("as_strided_scatter.default")
def _as_strided_scatter(
    self: Array, src: Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> Array:
    flat = jnp.reshape(self, (-1,))
    idx = _strided_indices(size, stride, storage_offset)
    return flat.at[idx.reshape(-1)].set(jnp.reshape(src, (-1,)).astype(self.dtype)).reshape(self.shape)


@register("view_as_real.default", "view_as_real_copy.default")
def _view_as_real(self: Array) -> Array:
    return jnp.stack([jnp.real(self), jnp.imag(self)], axis=-1)


@register("view_as_complex.default", "view_as_complex_copy.default")
def _view_as_complex(self: Array) -> Array:
    return lax.complex(self[..., 0], self[..., 1])


# Scatter ops: the functional form of writing through a view.


@register("select_scatter.default")
def _select_scatter(self: Array, src: Array, dim: int, index: int) -> Array:
    return _inv_select(self, src, dim, index)


@register("slice_scatter.default")
def _slice_scatter(
    self: Array, src: Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> Array:
    return _inv_slice(self, src, dim, start, end, step)


@register("diagonal_scatter.default")
def _diagonal_scatter(self: Array, src: Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Array:
    return _inv_diagonal(self, src, offset, dim1, dim2)


# ---------------------------------------------------------------------------
# Write side


def _cast(v: Array | Scalar, base: Array) -> Array:
    return jnp.asarray(v).astype(base.dtype)


@register_inverse(
    "view.default",
    "_unsafe_view.default",
    "_reshape_alias.default",
    "squeeze.default",
    "squeeze.dim",
    "squeeze.dims",
    "unsqueeze.default",
    "view_copy.default",
    "reshape.default",
)
def _inv_reshape(base: Array, v: Array, *args: object, **kwargs: object) -> Array:
    return jnp.reshape(_cast(v, base), base.shape)


@register_inverse("alias.default", "detach.default", "lift_fresh.default", "view_as.default")
def _inv_alias(base: Array, v: Array, *args: object, **kwargs: object) -> Array:
    return jnp.broadcast_to(_cast(v, base), base.shape)


@register_inverse("_conj.default")
def _inv_conj(base: Array, v: Array, *args: object, **kwargs: object) -> Array:
    v = _cast(v, base)
    return jnp.broadcast_to(jnp.conj(v) if jnp.iscomplexobj(v) else v, base.shape)


@register_inverse("_neg_view.default")
def _inv_neg_view(base: Array, v: Array, *args: object, **kwargs: object) -> Array:
    return jnp.broadcast_to(-_cast(v, base), base.shape)


@register_inverse("permute.default")
def _inv_permute(base: Array, v: Array, dims: Sequence[int]) -> Array:
    if base.ndim == 0:
        return _cast(v, base)
    perm = [canon_dim(d, base.ndim) for d in dims]
    inverse = sorted(range(len(perm)), key=perm.__getitem__)  # argsort of a permutation
    return jnp.transpose(_cast(v, base), inverse)


@register_inverse("transpose.int")
def _inv_transpose(base: Array, v: Array, dim0: int, dim1: int) -> Array:
    return _transpose(_cast(v, base), dim0, dim1)


@register_inverse("t.default")
def _inv_t(base: Array, v: Array) -> Array:
    return _t(_cast(v, base))


@register_inverse("mT.default")
def _inv_mT(base: Array, v: Array) -> Array:
    return jnp.swapaxes(_cast(v, base), -1, -2)


@register_inverse("select.int")
def _inv_select(base: Array, v: Array, dim: int, index: int) -> Array:
    # A dynamic_update_slice, not a scatter: ``select_backward`` and every
    # ``x[:, i] = ...`` come here, and XLA compiles chains of scatters (one per
    # step of an unrolled recurrence, as in Mamba's reference scan) superlinearly.
    d = canon_dim(dim, base.ndim)
    size = base.shape[d]
    index = index + size if isinstance(index, int) and index < 0 else index
    if not isinstance(index, int):  # a lifted (traced) index
        index = jnp.where(index < 0, index + size, index)
    part = jnp.broadcast_to(_cast(v, base), base.shape[:d] + base.shape[d + 1 :])
    starts = [0] * base.ndim
    starts[d] = index
    return lax.dynamic_update_slice(base, jnp.expand_dims(part, d), starts)


@register_inverse("slice.Tensor")
def _inv_slice(
    base: Array, v: Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1
) -> Array:
    d = canon_dim(dim, base.ndim)
    sl = _slice_bounds(base.shape[d], start, end, step)
    if step != 1:
        return base.at[_index_at(base.ndim, d, sl)].set(_cast(v, base))
    # Contiguous: a dynamic_update_slice (see ``_inv_select``).
    shape = base.shape[:d] + (sl.stop - sl.start,) + base.shape[d + 1 :]
    if shape[d] == 0:
        return base
    starts = [0] * base.ndim
    starts[d] = sl.start
    return lax.dynamic_update_slice(base, jnp.broadcast_to(_cast(v, base), shape), starts)


@register_inverse("narrow.default")
def _inv_narrow(base: Array, v: Array, dim: int, start: int, length: int) -> Array:
    d = canon_dim(dim, base.ndim)
    if start < 0:
        start += base.shape[d]
    return base.at[_index_at(base.ndim, d, slice(start, start + length))].set(_cast(v, base))


@register_inverse("diagonal.default")
def _inv_diagonal(base: Array, v: Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Array:
    d1, d2 = canon_dim(dim1, base.ndim), canon_dim(dim2, base.ndim)
    moved = jnp.moveaxis(base, (d1, d2), (-2, -1))
    n = v.shape[-1]
    rows = np.arange(n) + max(-offset, 0)
    cols = np.arange(n) + max(offset, 0)
    moved = moved.at[..., rows, cols].set(_cast(v, base))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@register_inverse("expand.default")
def _inv_expand(base: Array, v: Array, size: Sequence[int], *, implicit: bool = False) -> Array:
    # Eager torch forbids in-place writes to a tensor whose elements alias
    # (a real expansion); only "expands" that add size-1 leading dims or keep
    # every size can be written through.
    shape = _expand_shape(base.shape, size)
    lead = len(shape) - base.ndim
    real = any(shape[i] != 1 for i in range(lead)) or any(shape[lead + i] != base.shape[i] for i in range(base.ndim))
    if real:
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor "
            "refers to a single memory location (write through an expanded view)"
        )
    return jnp.reshape(_cast(v, base), base.shape)


@register_inverse("split.Tensor", "unsafe_split.Tensor")
def _inv_split(base: Array, v: Array, split_size: int, dim: int = 0, *, out_index: int) -> Array:
    d = canon_dim(dim, base.ndim)
    return _inv_split_with_sizes(base, v, _split_sizes_of(base.shape[d], split_size), d, out_index=out_index)


@register_inverse("split_with_sizes.default", "unsafe_split_with_sizes.default")
def _inv_split_with_sizes(base: Array, v: Array, split_sizes: Sequence[int], dim: int = 0, *, out_index: int) -> Array:
    d = canon_dim(dim, base.ndim)
    start = int(sum(split_sizes[:out_index]))
    sl = slice(start, start + split_sizes[out_index])
    return base.at[_index_at(base.ndim, d, sl)].set(_cast(v, base))


@register_inverse("unbind.int")
def _inv_unbind(base: Array, v: Array, dim: int = 0, *, out_index: int) -> Array:
    return _inv_select(base, v, dim, out_index)


@register_inverse("as_strided.default")
def _inv_as_strided(
    base: Array, v: Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None
) -> Array:
    return _as_strided_scatter(base, v, size, stride, storage_offset)


@register_inverse("view.dtype")
def _inv_view_dtype(base: Array, v: Array, dtype: torch.dtype) -> Array:
    return _view_dtype(v, to_torch_dtype(base.dtype)).reshape(base.shape)


@register_inverse("unfold.default")
def _inv_unfold(base: Array, v: Array, dimension: int, size: int, step: int) -> Array:
    # Only well-defined when windows do not overlap (step >= size); with
    # overlap eager torch refuses the write, like a real expand.
    if step < size:
        raise RuntimeError("unsupported operation: write through overlapping unfold windows")
    if base.ndim == 0:
        return jnp.reshape(_cast(v, base), ())
    d = canon_dim(dimension, base.ndim)
    n = (base.shape[d] - size) // step + 1
    idx = (np.arange(n)[:, None] * step + np.arange(size)[None, :]).astype(np.int32)
    vv = jnp.moveaxis(_cast(v, base), -1, d + 1)  # (..., n, size, ...)
    moved = jnp.moveaxis(base, d, 0)
    vv = jnp.moveaxis(jnp.moveaxis(vv, d, 0), d + 1, 1)
    moved = moved.at[idx].set(vv)
    return jnp.moveaxis(moved, 0, d)


@register_inverse("view_as_real.default")
def _inv_view_as_real(base: Array, v: Array) -> Array:
    return lax.complex(v[..., 0], v[..., 1]).astype(base.dtype)


@register_inverse("view_as_complex.default")
def _inv_view_as_complex(base: Array, v: Array) -> Array:
    return _view_as_real(v).astype(base.dtype)
