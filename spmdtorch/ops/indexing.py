"""Indexing: index/index_put (advanced indexing), gather/scatter family,
index_select/index_add/index_copy/index_fill, masked_fill/masked_scatter,
nonzero, embedding and its backward.

Boolean index tensors and ``nonzero``/``masked_select`` have data-dependent
shapes: the engine materialises their inputs first, so these lowerings may
call ``jnp.nonzero`` on concrete arrays (they fail under ``jax.jit`` tracing,
which is the engine's cue to materialise).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import jax.numpy as jnp
from jax import lax

from spmdtorch.ops._util import Array, Scalar, canon_dim
from spmdtorch.ops.registry import register


def _expand_bool_indices(indices: Sequence[Array | None]) -> list[Array | None]:
    """Replace each k-d bool index by k integer index arrays (its nonzeros)."""
    out: list[Array | None] = []
    for idx in indices:
        if idx is not None and idx.dtype in (jnp.bool_, jnp.uint8):
            out.extend(jnp.nonzero(idx.astype(jnp.bool_)))
        else:
            out.append(idx)
    return out


def _index_tuple(indices: Sequence[Array | None]) -> tuple[Array | slice, ...]:
    """ATen ``Tensor?[]`` (None = whole dim) -> numpy-style index tuple.

    torch's advanced indexing rules (adjacent advanced indices stay in place,
    separated ones move to the front) are numpy's, so ``x[tuple]`` matches.
    """
    return tuple(slice(None) if i is None else i for i in _expand_bool_indices(indices))


@register("index.Tensor", "_unsafe_index.Tensor", "index.Tensor_hacked_twin", "_unsafe_index.Tensor_hacked_twin")
def _index(self: Array, indices: Sequence[Array | None]) -> Array:
    return self[_index_tuple(indices)]


@register("index_put.default", "_unsafe_index_put.default", "index_put.hacked_twin", "_unsafe_index_put.hacked_twin")
def _index_put(self: Array, indices: Sequence[Array | None], values: Array, accumulate: bool = False) -> Array:
    idx = _index_tuple(indices)
    values = jnp.asarray(values).astype(self.dtype)
    if accumulate:
        return self.at[idx].add(values)
    return self.at[idx].set(values)


@register("_index_put_impl.default")
def _index_put_impl(
    self: Array, indices: Sequence[Array | None], values: Array, accumulate: bool = False, unsafe: bool = False
) -> Array:
    return _index_put(self, indices, values, accumulate)


@register("index_select.default")
def _index_select(self: Array, dim: int, index: Array) -> Array:
    if self.ndim == 0:
        return jnp.reshape(self, ())
    return jnp.take(self, jnp.reshape(index, (-1,)), axis=canon_dim(dim, self.ndim))


def _full_index(index: Array, dim: int) -> tuple[Array, ...]:
    """Index tuple addressing ``out[i][j][k] -> self[i][index[i][j][k]][k]``."""
    nd = index.ndim
    return tuple(index if d == dim else lax.broadcasted_iota(jnp.int32, index.shape, d) for d in range(nd))


def _crop(x: Array, shape: Sequence[int]) -> Array:
    """torch's gather/scatter read only the leading ``index.shape`` block of
    the non-indexed dims of src/self."""
    if tuple(x.shape) == tuple(shape):
        return x
    return x[tuple(slice(0, s) for s in shape)]


def _norm_index(index: Array, size: int) -> Array:
    return jnp.where(index < 0, index + size, index)


@register("gather.default")
def _gather(self: Array, dim: int, index: Array, *, sparse_grad: bool = False) -> Array:
    if index.size == 0:  # torch accepts any rank for an empty index
        return jnp.zeros(index.shape, self.dtype)
    if self.ndim == 0 or index.ndim == 0:
        # A 0-d side: every valid index is 0, the result is self in index's shape.
        return jnp.broadcast_to(jnp.reshape(self, ()) if self.ndim == 0 else self[index], index.shape)
    d = canon_dim(dim, self.ndim)
    idx = _full_index(_norm_index(index, self.shape[d]), d)
    return self[idx]


def _scatter_apply(self: Array, dim: int, index: Array, src: Scalar, how: str) -> Array:
    if index.size == 0:
        # torch accepts an empty index of any rank (gather's backward scatters
        # through the same index) and leaves self untouched.
        return self
    if self.ndim == 0:
        self_ = jnp.reshape(self, (1,))
        out = _scatter_apply(
            self_, 0, jnp.reshape(index, (1,)), src if jnp.ndim(src) == 0 else jnp.reshape(src, (1,)), how
        )
        return jnp.reshape(out, ())
    d = canon_dim(dim, self.ndim)
    idx = _full_index(_norm_index(index, self.shape[d]), d)
    if jnp.ndim(src) == 0:
        vals = jnp.broadcast_to(jnp.asarray(src).astype(self.dtype), index.shape)
    else:
        vals = _crop(cast(Array, src), index.shape).astype(self.dtype)  # not 0-d: an array
    ref = self.at[idx]
    update: dict[str, Callable[..., Array]] = {
        "set": ref.set,
        "add": ref.add,
        "multiply": ref.multiply,
        "mul": ref.multiply,
        "max": ref.max,
        "min": ref.min,
        "amax": ref.max,
        "amin": ref.min,
    }
    return update[how](vals)


@register("scatter.src", "scatter.value")
def _scatter(self: Array, dim: int, index: Array, src: Scalar) -> Array:
    return _scatter_apply(self, dim, index, src, "set")


@register("scatter.reduce", "scatter.value_reduce")
def _scatter_reduce_legacy(self: Array, dim: int, index: Array, src: Scalar, *, reduce: str) -> Array:
    return _scatter_apply(self, dim, index, src, reduce)


@register("scatter_add.default")
def _scatter_add(self: Array, dim: int, index: Array, src: Array) -> Array:
    return _scatter_apply(self, dim, index, src, "add")


@register("scatter_reduce.two")
def _scatter_reduce(
    self: Array, dim: int, index: Array, src: Array, reduce: str, *, include_self: bool = True
) -> Array:
    if reduce == "mean":
        dt = self.dtype
        ones = jnp.ones(index.shape, jnp.float32)
        base = self.astype(jnp.float32)
        cnt0 = jnp.ones(self.shape, jnp.float32)
        if not include_self:
            hit = _scatter_apply(jnp.zeros(self.shape, jnp.bool_), dim, index, True, "set")
            base = jnp.where(hit, 0, base)
            cnt0 = jnp.where(hit, 0.0, cnt0)
        total = _scatter_apply(base, dim, index, _crop(src, index.shape).astype(jnp.float32), "add")
        cnt = _scatter_apply(cnt0, dim, index, ones, "add")
        out = total / jnp.maximum(cnt, 1)
        if jnp.issubdtype(dt, jnp.integer):
            out = jnp.floor(out)  # torch floor-divides integer means
        return out.astype(dt)
    how = {"sum": "add", "prod": "multiply", "amax": "max", "amin": "min"}[reduce]
    base = self
    if not include_self:
        # Positions receiving a scatter start from the reduction identity.
        hit = _scatter_apply(jnp.zeros(self.shape, jnp.bool_), dim, index, True, "set")
        ident: float
        if how == "add":
            ident = 0
        elif how == "multiply":
            ident = 1
        elif jnp.issubdtype(self.dtype, jnp.floating):
            ident = -jnp.inf if how == "max" else jnp.inf
        else:
            info = jnp.iinfo(self.dtype)
            ident = info.min if how == "max" else info.max
        base = jnp.where(hit, jnp.asarray(ident, self.dtype), self)
    return _scatter_apply(base, dim, index, src, how)


def _dim_index(ndim: int, dim: int, index: Array) -> tuple[slice | Array, ...]:
    return (slice(None),) * dim + (index,)


@register("index_add.default")
def _index_add(self: Array, dim: int, index: Array, source: Array, *, alpha: Scalar = 1) -> Array:
    if self.ndim == 0:
        return self + jnp.reshape(source, ()) * alpha
    d = canon_dim(dim, self.ndim)
    src = source if (isinstance(alpha, int) and alpha == 1) else source * alpha
    return self.at[_dim_index(self.ndim, d, jnp.reshape(index, (-1,)))].add(src.astype(self.dtype))


@register("index_copy.default")
def _index_copy(self: Array, dim: int, index: Array, source: Array) -> Array:
    if self.ndim == 0:
        return jnp.reshape(source, ()).astype(self.dtype)
    d = canon_dim(dim, self.ndim)
    return self.at[_dim_index(self.ndim, d, jnp.reshape(index, (-1,)))].set(source.astype(self.dtype))


@register("index_fill.int_Scalar", "index_fill.int_Tensor")
def _index_fill(self: Array, dim: int, index: Array, value: Scalar) -> Array:
    if self.ndim == 0:
        return jnp.full((), value, self.dtype)
    d = canon_dim(dim, self.ndim)
    v = jnp.asarray(value).astype(self.dtype)
    return self.at[_dim_index(self.ndim, d, jnp.reshape(index, (-1,)))].set(v)


@register("index_reduce.default")
def _index_reduce(
    self: Array, dim: int, index: Array, source: Array, reduce: str, *, include_self: bool = True
) -> Array:
    if self.ndim == 0:  # torch treats a 0-d self as 1-d of one element
        out = _index_reduce(
            self.reshape(1), 0, jnp.reshape(index, (-1,)), jnp.reshape(source, (-1,)), reduce, include_self=include_self
        )
        return out.reshape(())
    d = canon_dim(dim, self.ndim)
    # Express as scatter_reduce with index broadcast along the other dims.
    shape = [1] * self.ndim
    shape[d] = index.shape[0]
    full = jnp.broadcast_to(jnp.reshape(index, shape), source.shape)
    return _scatter_reduce(self, d, full, source, reduce, include_self=include_self)


@register("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(self: Array, mask: Array, value: Scalar) -> Array:
    return jnp.where(mask, jnp.asarray(value).astype(self.dtype), self)


@register("masked_scatter.default")
def _masked_scatter(self: Array, mask: Array, source: Array) -> Array:
    """Fill masked positions, in row-major order, from ``source``'s elements.

    Static shapes: the k-th True position takes ``source.flat[k]``; its index
    is the running count of Trues, so no data-dependent shape is needed.
    """
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    x = jnp.broadcast_to(self, shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    pos = jnp.cumsum(m.astype(jnp.int32)) - 1
    src = jnp.reshape(source, (-1,))
    vals = src[jnp.clip(pos, 0, max(src.shape[0] - 1, 0))] if src.shape[0] else jnp.zeros_like(pos, self.dtype)
    return jnp.where(m, vals.astype(self.dtype), x.reshape(-1)).reshape(shape)


@register("masked_scatter_backward.default")
def _masked_scatter_backward(grad_output: Array, mask: Array, sizes: Sequence[int]) -> Array:
    """Gradient of ``masked_scatter`` w.r.t. ``source``: the k-th masked element of
    ``grad_output`` (row-major) goes to ``source.flat[k]``; source elements that
    were not consumed get 0."""
    numel = 1
    for s in sizes:
        numel *= int(s)
    m = jnp.broadcast_to(mask, grad_output.shape).reshape(-1)
    pos = jnp.cumsum(m.astype(jnp.int32)) - 1
    # Unmasked positions (and any beyond source's size) target index numel: dropped.
    dest = jnp.where(m & (pos < numel), pos, numel)
    out = jnp.zeros((numel,), grad_output.dtype).at[dest].set(grad_output.reshape(-1), mode="drop")
    return out.reshape(tuple(sizes))


@register("masked_select.default")
def _masked_select(self: Array, mask: Array) -> Array:
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    return jnp.broadcast_to(self, shape)[jnp.broadcast_to(mask, shape)]


@register("nonzero.default")
def _nonzero(self: Array) -> Array:
    if self.ndim == 0:
        return jnp.zeros((1 if bool(self) else 0, 0), jnp.int32)
    return jnp.stack(jnp.nonzero(self), axis=1).astype(jnp.int32)


@register("nonzero_static.default")
def _nonzero_static(self: Array, *, size: int, fill_value: int = -1) -> Array:
    idx = jnp.nonzero(self.reshape(self.shape or (1,)), size=size, fill_value=fill_value)
    return jnp.stack(idx, axis=1).astype(jnp.int32)


@register("take.default")
def _take(self: Array, index: Array) -> Array:
    flat = self.reshape(-1)
    return flat[_norm_index(index, flat.shape[0])]


@register("put.default")
def _put(self: Array, index: Array, source: Array, accumulate: bool = False) -> Array:
    flat = self.reshape(-1)
    idx = _norm_index(index.reshape(-1), flat.shape[0])
    ref = flat.at[idx]
    src = source.reshape(-1).astype(self.dtype)
    return (ref.add(src) if accumulate else ref.set(src)).reshape(self.shape)


@register("embedding.default")
def _embedding(
    weight: Array, indices: Array, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
) -> Array:
    return jnp.take(weight, indices, axis=0)


@register("embedding_dense_backward.default")
def _embedding_dense_backward(
    grad_output: Array, indices: Array, num_weights: int, padding_idx: int, scale_grad_by_freq: bool
) -> Array:
    idx = jnp.reshape(indices, (-1,))
    g = jnp.reshape(grad_output, (idx.shape[0], -1)).astype(jnp.float32)
    if padding_idx is not None and padding_idx >= 0:
        g = jnp.where((idx == padding_idx)[:, None], 0.0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.float32).at[idx].add(1.0)
        g = g / counts[idx][:, None]
    out = jnp.zeros((num_weights, g.shape[1]), jnp.float32).at[idx].add(g)
    return out.reshape((num_weights,) + grad_output.shape[indices.ndim :]).astype(grad_output.dtype)


@register("_embedding_bag.default", "_embedding_bag_forward_only.default")
def _embedding_bag(
    weight: Array,
    indices: Array,
    offsets: Array,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: Array | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[Array, Array, Array, Array]:
    """Returns (output, offset2bag, bag_size, max_indices) like the CPU kernel.

    mode: 0 sum, 1 mean, 2 max. 2-d ``indices`` (fixed-size bags) are
    flattened with implicit offsets.
    """
    if indices.ndim == 2:
        b, l = indices.shape
        offsets = jnp.arange(b, dtype=jnp.int32) * l
        indices = indices.reshape(-1)
        include_last_offset = False
    n = indices.shape[0]
    nb = offsets.shape[0] - (1 if include_last_offset else 0)
    pos = jnp.arange(n, dtype=jnp.int32)
    # offset2bag[i] = number of offsets <= i, minus 1
    bag = jnp.sum(pos[:, None] >= offsets[None, :nb], axis=1).astype(jnp.int32) - 1
    valid = indices != padding_idx if padding_idx is not None and padding_idx >= 0 else jnp.ones((n,), bool)
    rows = jnp.take(weight, indices, axis=0).astype(jnp.float32)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights[:, None]
    cnt = jnp.zeros((nb,), jnp.int32).at[bag].add(valid.astype(jnp.int32))
    d = weight.shape[1]
    if mode == 2:
        neg = jnp.full((nb, d), -jnp.inf, jnp.float32)
        out = neg.at[bag].max(jnp.where(valid[:, None], rows, -jnp.inf))
        out = jnp.where(cnt[:, None] > 0, out, 0.0)
        # max_indices: the weight row that gave the max, per bag and column
        is_max = (rows == out[bag]) & valid[:, None]
        cand = jnp.where(is_max, indices[:, None], jnp.iinfo(jnp.int32).max)
        max_idx = jnp.full((nb, d), jnp.iinfo(jnp.int32).max, jnp.int32).at[bag].min(cand)
        max_idx = jnp.where(cnt[:, None] > 0, max_idx, -1)
    else:
        out = jnp.zeros((nb, d), jnp.float32).at[bag].add(jnp.where(valid[:, None], rows, 0.0))
        if mode == 1:
            out = out / jnp.maximum(cnt, 1)[:, None]
        max_idx = jnp.zeros((0,), jnp.int32)
    if cnt.shape[0] < offsets.shape[0]:
        # Off-CPU (meta) shape rule: bag_size has one entry per offset.
        cnt = jnp.pad(cnt, (0, offsets.shape[0] - cnt.shape[0]))
    return out.astype(weight.dtype), bag, cnt, max_idx


def _embedding_bag_dense_backward(
    grad: Array,
    indices: Array,
    offset2bag: Array,
    bag_size: Array,
    maximum_indices: Array,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    per_sample_weights: Array | None,
    padding_idx: int = -1,
) -> Array:
    """Weight gradient of ``embedding_bag`` (the CPU kernel's dense path).

    sum/mean: each sample's bag gradient, times its per-sample weight, over
    the bag size (mean) and the index frequency (``scale_grad_by_freq``), is
    added to its weight row; ``padding_idx`` samples add nothing. max: each
    bag's gradient goes to the row that attained the max, per column.
    """
    g = grad.astype(jnp.float32)
    d = g.shape[1]
    if mode == 2:
        nb = g.shape[0]
        mi = maximum_indices[:nb]
        # Empty bags (bag_size 0; their max index is -1 or 0) add nothing, as in
        # torch: route them to an out-of-range row that is dropped.
        nonempty = (bag_size[:nb] > 0)[:, None] & (mi >= 0)
        rows = jnp.where(nonempty, mi, num_weights)
        cols = lax.broadcasted_iota(jnp.int32, rows.shape, 1)
        out = jnp.zeros((num_weights, d), jnp.float32).at[rows, cols].add(g, mode="drop")
        return out.astype(grad.dtype)
    idx = jnp.reshape(indices, (-1,))
    rows = jnp.take(g, offset2bag, axis=0)
    scale = jnp.ones(idx.shape, jnp.float32)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), jnp.float32).at[idx].add(1.0)
        scale = scale / counts[idx]
    if mode == 1:
        bs = jnp.take(bag_size, offset2bag).astype(jnp.float32)
        scale = jnp.where(bs != 0, scale / jnp.where(bs != 0, bs, 1.0), scale)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.astype(jnp.float32)
    if padding_idx is not None and padding_idx >= 0:
        scale = jnp.where(idx == padding_idx, 0.0, scale)
    out = jnp.zeros((num_weights, d), jnp.float32).at[idx].add(rows * scale[:, None])
    return out.astype(grad.dtype)


register("_embedding_bag_dense_backward.default")(_embedding_bag_dense_backward)


@register("_embedding_bag_backward.default")
def _embedding_bag_backward(
    grad: Array,
    indices: Array,
    offsets: Array,
    offset2bag: Array,
    bag_size: Array,
    maximum_indices: Array,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: Array | None,
    padding_idx: int = -1,
) -> Array:
    """``_embedding_bag_backward``: the dense gradient (xla holds no sparse tensors;
    ``sparse=True`` gets the same values, densely)."""
    return _embedding_bag_dense_backward(
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@register("_embedding_bag_per_sample_weights_backward.default")
def _embedding_bag_per_sample_weights_backward(
    grad: Array, weight: Array, indices: Array, offsets: Array, offset2bag: Array, mode: int, padding_idx: int = -1
) -> Array:
    """Gradient of a sum-mode ``embedding_bag`` w.r.t. ``per_sample_weights``:
    each sample's weight row dotted with its bag's output gradient (0 for
    ``padding_idx`` samples), as torch's CPU kernel."""
    if mode != 0:
        raise NotImplementedError("embedding_bag: per_sample_weights is only supported for mode='sum'")
    idx = jnp.reshape(indices, (-1,))
    rows = jnp.take(weight, idx, axis=0).astype(jnp.float32)
    g = jnp.take(grad.astype(jnp.float32), offset2bag, axis=0)
    out = jnp.sum(rows * g, axis=1)
    if padding_idx is not None and padding_idx >= 0:
        out = jnp.where(idx == padding_idx, 0.0, out)
    return out.astype(grad.dtype)


@register("embedding_renorm.default")
def _embedding_renorm(self: Array, indices: Array, max_norm: Array | float, norm_type: Array | float) -> Array:
    """``embedding(max_norm=)``: rows that ``indices`` uses are scaled to norm ``max_norm``."""
    idx = jnp.reshape(indices, (-1,)).astype(jnp.int32)
    rows = jnp.take(self, idx, axis=0).astype(jnp.float32)
    norm = jnp.sum(jnp.abs(rows) ** norm_type, axis=1) ** (1.0 / norm_type)
    # torch's kernel: scale = max_norm / (norm + 1e-7) where norm > max_norm
    scale = jnp.where(norm > max_norm, max_norm / (norm + 1e-7), 1.0)
    return self.at[idx].set((rows * scale[:, None]).astype(self.dtype))
