"""Reductions, scans, sorting and selection.

``dim=None`` and ``dim=[]`` both reduce every dim (ATen's ``int[1]? dim``);
0-d tensors reduce over nothing. Sums of bf16/f16 accumulate in float32 and
integer/bool sums in the int64 storage type, as torch does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import cast

import jax
import jax.numpy as jnp
import torch
from jax import lax

from spmdtorch.ops._util import Array, Dims, Number, Scalar, acc_dtype, canon_dim, is_int, jdtype, reduce_dims, upcast
from spmdtorch.ops.registry import register


@register("sum.dim_IntList", "sum.default")
def _sum(
    self: Array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> Array:
    axes = reduce_dims(dim, self.ndim)
    return jnp.sum(self, axis=axes, keepdims=keepdim, dtype=acc_dtype(self, dtype))


@register("nansum.default")
def _nansum(
    self: Array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> Array:
    axes = reduce_dims(dim, self.ndim)
    return jnp.nansum(self, axis=axes, keepdims=keepdim, dtype=acc_dtype(self, dtype))


@register("mean.dim", "mean.default")
def _mean(
    self: Array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> Array:
    axes = reduce_dims(dim, self.ndim)
    x = self if dtype is None else self.astype(jdtype(dtype))
    return jnp.mean(upcast(x), axis=axes, keepdims=keepdim)


@register("nanmean.default")
def _nanmean(
    self: Array, dim: Sequence[int] | None = None, keepdim: bool = False, *, dtype: torch.dtype | None = None
) -> Array:
    axes = reduce_dims(dim, self.ndim)
    return jnp.nanmean(upcast(self), axis=axes, keepdims=keepdim)


@register("prod.default")
def _prod(self: Array, *, dtype: torch.dtype | None = None) -> Array:
    return jnp.prod(self, dtype=acc_dtype(self, dtype))


@register("prod.dim_int")
def _prod_dim(self: Array, dim: int, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Array:
    axes = reduce_dims([dim], self.ndim)
    return jnp.prod(self, axis=axes, keepdims=keepdim, dtype=acc_dtype(self, dtype))


@register("amax.default")
def _amax(self: Array, dim: Sequence[int] = (), keepdim: bool = False) -> Array:
    return jnp.max(self, axis=reduce_dims(dim, self.ndim), keepdims=keepdim)


@register("amin.default")
def _amin(self: Array, dim: Sequence[int] = (), keepdim: bool = False) -> Array:
    return jnp.min(self, axis=reduce_dims(dim, self.ndim), keepdims=keepdim)


@register("max.default")
def _max_all(self: Array) -> Array:
    return jnp.max(self)


@register("min.default")
def _min_all(self: Array) -> Array:
    return jnp.min(self)


@register("max.other", "max.binary")
def _max_other(self: Array, other: Array) -> Array:
    return jnp.maximum(self, other)


@register("min.other", "min.binary")
def _min_other(self: Array, other: Array) -> Array:
    return jnp.minimum(self, other)


def _arg_reduce(fn: Callable[..., Array], self: Array, dim: int | None, keepdim: bool) -> Array:
    if self.ndim == 0:
        return jnp.zeros((), jnp.int32)
    if dim is None:
        out = fn(self.reshape(-1), axis=0)
        if keepdim:
            out = out.reshape((1,) * self.ndim)
        return out.astype(jnp.int32)
    return fn(self, axis=canon_dim(dim, self.ndim), keepdims=keepdim).astype(jnp.int32)


@register("argmax.default")
def _argmax(self: Array, dim: int | None = None, keepdim: bool = False) -> Array:
    return _arg_reduce(jnp.argmax, self, dim, keepdim)


@register("argmin.default")
def _argmin(self: Array, dim: int | None = None, keepdim: bool = False) -> Array:
    return _arg_reduce(jnp.argmin, self, dim, keepdim)


@register("max.dim")
def _max_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    return jnp.max(self, axis=d, keepdims=keepdim), _argmax(self, d, keepdim)


@register("min.dim")
def _min_dim(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    return jnp.min(self, axis=d, keepdims=keepdim), _argmin(self, d, keepdim)


@register("aminmax.default")
def _aminmax(self: Array, *, dim: int | None = None, keepdim: bool = False) -> tuple[Array, Array]:
    axes = reduce_dims(None if dim is None else [dim], self.ndim)
    return jnp.min(self, axis=axes, keepdims=keepdim), jnp.max(self, axis=axes, keepdims=keepdim)


def _bool_reduce(fn: Callable[..., Array], self: Array, dim: Dims, keepdim: bool) -> Array:
    if isinstance(dim, (list, tuple)) and len(dim) == 0:
        return self != 0  # any.dims/all.dims with dim=[] reduce nothing (unlike sum)
    axes = reduce_dims(dim, self.ndim)
    return fn(self.astype(jnp.bool_) if self.dtype != jnp.bool_ else self, axis=axes, keepdims=keepdim)


@register("any.default", "any.dim", "any.dims")
def _any(self: Array, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Array:
    return _bool_reduce(jnp.any, self, dim, keepdim)


@register("all.default", "all.dim", "all.dims")
def _all(self: Array, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Array:
    return _bool_reduce(jnp.all, self, dim, keepdim)


def _var(self: Array, dim: Dims, correction: Scalar | None, keepdim: bool) -> tuple[Array, Array]:
    """Variance with torch's ``max(0, N - correction)`` divisor."""
    x = upcast(self)
    axes = reduce_dims(dim, x.ndim)
    n = 1
    for a in axes:
        n *= x.shape[a]
    mean = jnp.mean(x, axis=axes, keepdims=True)
    sq = jnp.sum(jnp.square(jnp.abs(x - mean)), axis=axes, keepdims=keepdim)
    corr = 1 if correction is None else correction
    return sq / jnp.maximum(n - corr, 0), jnp.mean(x, axis=axes, keepdims=keepdim)


@register("var.correction")
def _var_correction(
    self: Array, dim: Sequence[int] | None = None, *, correction: Scalar | None = None, keepdim: bool = False
) -> Array:
    return _var(self, dim, correction, keepdim)[0]


@register("var.dim", "var.default")
def _var_dim(
    self: Array, dim: bool | Sequence[int] | None = None, unbiased: bool = True, keepdim: bool = False
) -> Array:
    if isinstance(dim, bool):  # var.default(self, bool unbiased)
        unbiased = dim
        dim = None
    return _var(self, dim, 1 if unbiased else 0, keepdim)[0]


@register("std.correction")
def _std_correction(
    self: Array, dim: Sequence[int] | None = None, *, correction: Scalar | None = None, keepdim: bool = False
) -> Array:
    return jnp.sqrt(_var(self, dim, correction, keepdim)[0])


@register("std.dim", "std.default")
def _std_dim(
    self: Array, dim: bool | Sequence[int] | None = None, unbiased: bool = True, keepdim: bool = False
) -> Array:
    if isinstance(dim, bool):
        unbiased = dim
        dim = None
    return jnp.sqrt(_var(self, dim, 1 if unbiased else 0, keepdim)[0])


@register("var_mean.correction")
def _var_mean(
    self: Array, dim: Sequence[int] | None = None, *, correction: Scalar | None = None, keepdim: bool = False
) -> tuple[Array, Array]:
    return _var(self, dim, correction, keepdim)


@register("std_mean.correction")
def _std_mean(
    self: Array, dim: Sequence[int] | None = None, *, correction: Scalar | None = None, keepdim: bool = False
) -> tuple[Array, Array]:
    v, m = _var(self, dim, correction, keepdim)
    return jnp.sqrt(v), m


@register("logsumexp.default")
def _logsumexp(self: Array, dim: Sequence[int] = (), keepdim: bool = False) -> Array:
    x = upcast(self)
    if x.ndim == 0:
        return x
    return jax.nn.logsumexp(x, axis=reduce_dims(dim, x.ndim), keepdims=keepdim)


# ``p``/``ord`` pick the formula (0 counts non-zeros, inf is a max), so they
# stay Python numbers (not lifted to runtime inputs).
@register("norm.ScalarOpt_dim", "norm.Scalar", "norm.ScalarOpt_dim_dtype", "norm.ScalarOpt_dtype", lift_scalars=False)
def _norm(
    self: Array,
    p: Number | None = 2,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Array:
    if not isinstance(dim, (list, tuple, int, type(None))):  # norm.ScalarOpt_dtype: dtype positional
        dim, dtype = None, dim
    return _vector_norm(self, 2 if p is None else p, dim, keepdim, dtype=dtype)


@register("linalg_vector_norm.default", lift_scalars=False)
def _vector_norm(
    self: Array,
    ord: Number = 2,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Array:
    x = upcast(self if dtype is None else self.astype(jdtype(dtype)))
    axes = reduce_dims(dim, x.ndim)
    a = jnp.abs(x)
    if isinstance(ord, (int, float)):
        if ord == float("inf"):
            return jnp.max(a, axis=axes, keepdims=keepdim)
        if ord == float("-inf"):
            return jnp.min(a, axis=axes, keepdims=keepdim)
        if ord == 0:
            return jnp.sum((a != 0).astype(a.dtype), axis=axes, keepdims=keepdim)
        if ord == 1:
            return jnp.sum(a, axis=axes, keepdims=keepdim)
        if ord == 2:
            return jnp.sqrt(jnp.sum(a * a, axis=axes, keepdims=keepdim))
    return jnp.sum(a**ord, axis=axes, keepdims=keepdim) ** (1.0 / ord)


# ---------------------------------------------------------------------------
# Scans


def _scan_input(self: Array, dtype: torch.dtype | None) -> Array:
    if dtype is not None:
        return self.astype(jdtype(dtype))
    if is_int(self):
        return self.astype(jnp.int32)  # integer scans give int64 in torch
    return upcast(self)


@register("cumsum.default")
def _cumsum(self: Array, dim: int, *, dtype: torch.dtype | None = None) -> Array:
    x = _scan_input(self, dtype)
    if x.ndim == 0:
        return x
    return jnp.cumsum(x, axis=canon_dim(dim, x.ndim))


@register("cumprod.default")
def _cumprod(self: Array, dim: int, *, dtype: torch.dtype | None = None) -> Array:
    x = _scan_input(self, dtype)
    if x.ndim == 0:
        return x
    return jnp.cumprod(x, axis=canon_dim(dim, x.ndim))


@register("logcumsumexp.default")
def _logcumsumexp(self: Array, dim: int) -> Array:
    """``log(cumsum(exp(x)))`` as a scan of (running max m, sum s of exp(x - m)).

    torch's CPU kernel accumulates in float64 and rounds each output once;
    a float32 chain of ``logaddexp`` rounds at every step, which at |x| ~ 1e4
    (one float32 ulp ~ 1e-3) drifts visibly, and the backward (which subtracts
    such results from the input) amplifies it. Here the output is
    ``m + log(s)`` with ``s`` in ``[1, n]`` known to a few ulps: one rounding
    at the magnitude of ``m``, as torch's.
    """
    x = upcast(self)
    if x.ndim == 0:
        return x
    d = canon_dim(dim, x.ndim)

    def combine(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array]:
        ma, sa = a
        mb, sb = b
        m = jnp.maximum(ma, mb)
        # Equal maxima (also both -inf / +inf) scale by exp(0): no inf - inf.
        ea = jnp.exp(jnp.where(ma == m, 0.0, ma - m))
        eb = jnp.exp(jnp.where(mb == m, 0.0, mb - m))
        return m, sa * ea + sb * eb

    m, s = lax.associative_scan(combine, (x, jnp.ones_like(x)), axis=d)
    # lax.associative_scan is typed Any.
    res: Array = m + jnp.log(s)
    return res


def _cum_extreme(self: Array, dim: int, better: Callable[[Array, Array], Array]) -> tuple[Array, Array]:
    """cummax/cummin: (values, indices), the index of the last extreme seen.

    torch reports the *last* index among equal extremes (and NaN wins).
    """
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    idx = lax.broadcasted_iota(jnp.int32, self.shape, d)

    def combine(a: tuple[Array, Array], b: tuple[Array, Array]) -> tuple[Array, Array]:
        va, ia = a
        vb, ib = b
        take_b = better(vb, va) | (vb == va)
        if not is_int(self):
            take_b = take_b | jnp.isnan(vb)
            take_b = take_b & ~(jnp.isnan(va) & ~jnp.isnan(vb))
        return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

    # lax.associative_scan is typed Any.
    res: tuple[Array, Array] = lax.associative_scan(combine, (self, idx), axis=d)
    return res


@register("cummax.default")
def _cummax(self: Array, dim: int) -> tuple[Array, Array]:
    return _cum_extreme(self, dim, jnp.greater)


@register("cummin.default")
def _cummin(self: Array, dim: int) -> tuple[Array, Array]:
    return _cum_extreme(self, dim, jnp.less)


# ---------------------------------------------------------------------------
# Sorting and selection


def _sort(self: Array, dim: int, descending: bool, stable: bool = True) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    if self.dtype == jnp.bool_:
        x = self.astype(jnp.int8)
    else:
        x = self
    idx = jnp.argsort(x, axis=d, stable=True, descending=descending).astype(jnp.int32)
    return jnp.take_along_axis(self, idx, axis=d), idx


@register("sort.default")
def _sort_default(self: Array, dim: int = -1, descending: bool = False) -> tuple[Array, Array]:
    return _sort(self, dim, descending)


@register("sort.stable")
def _sort_stable(
    self: Array, *, stable: bool | None = None, dim: int = -1, descending: bool = False
) -> tuple[Array, Array]:
    return _sort(self, dim, descending)


@register("argsort.default", "argsort.stable")
def _argsort(self: Array, dim: int = -1, descending: bool = False, *, stable: bool = False) -> Array:
    if isinstance(dim, bool):  # argsort.stable(self, *, stable, dim, descending) passed positionally
        dim = -1
    return _sort(self, dim, descending)[1]


@register("topk.default")
def _topk(self: Array, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    x = jnp.moveaxis(self, d, -1)
    if largest and x.dtype != jnp.bool_:
        vals, idx = lax.top_k(x, k)
    else:
        v, i = _sort(x, -1, largest)
        vals, idx = v[..., :k], i[..., :k]
    return jnp.moveaxis(vals, -1, d), jnp.moveaxis(idx.astype(jnp.int32), -1, d)


@register("kthvalue.default")
def _kthvalue(self: Array, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    v, i = _sort(self, d, False)
    v = lax.index_in_dim(v, k - 1, d, keepdims=keepdim)
    i = lax.index_in_dim(i, k - 1, d, keepdims=keepdim)
    return v, i


def _median_dim(self: Array, dim: int, keepdim: bool, ignore_nan: bool) -> tuple[Array, Array]:
    """Lower median (torch never averages the two middle values)."""
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    n = self.shape[d]
    v, i = _sort(self, d, False)
    if ignore_nan and not is_int(self):
        cnt = jnp.sum(~jnp.isnan(self), axis=d, keepdims=True)
        pos = jnp.maximum((cnt - 1) // 2, 0).astype(jnp.int32)
    else:
        # NaN sorts last; a slice with any NaN has median NaN (index of a NaN).
        pos = jnp.full([1 if a == d else s for a, s in enumerate(self.shape)], (n - 1) // 2, jnp.int32)
        if not is_int(self):
            has_nan = jnp.any(jnp.isnan(self), axis=d, keepdims=True)
            first_nan = jnp.sum(~jnp.isnan(self), axis=d, keepdims=True).astype(jnp.int32)
            pos = jnp.where(has_nan, first_nan, pos)
    vv = jnp.take_along_axis(v, pos, axis=d)
    ii = jnp.take_along_axis(i, pos, axis=d)
    if not keepdim:
        vv, ii = jnp.squeeze(vv, d), jnp.squeeze(ii, d)
    return vv, ii


@register("median.default")
def _median(self: Array) -> Array:
    return _median_dim(self.reshape(-1), 0, False, False)[0]


@register("median.dim")
def _median_d(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _median_dim(self, dim, keepdim, False)


@register("nanmedian.default")
def _nanmedian(self: Array) -> Array:
    return _median_dim(self.reshape(-1), 0, False, True)[0]


@register("nanmedian.dim")
def _nanmedian_d(self: Array, dim: int, keepdim: bool = False) -> tuple[Array, Array]:
    return _median_dim(self, dim, keepdim, True)


@register("mode.default")
def _mode(self: Array, dim: int = -1, keepdim: bool = False) -> tuple[Array, Array]:
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int32)
    d = canon_dim(dim, self.ndim)
    x = jnp.moveaxis(self, d, -1)
    eq = x[..., :, None] == x[..., None, :]
    counts = jnp.sum(eq, axis=-1)
    # Most frequent; ties -> smallest value; index: last occurrence (torch CPU).
    best = jnp.max(counts, axis=-1, keepdims=True)
    cand = jnp.where(counts == best, x, jnp.max(x, axis=-1, keepdims=True))
    val = jnp.min(cand, axis=-1, keepdims=True)
    n = x.shape[-1]
    pos = jnp.arange(n, dtype=jnp.int32)
    idx = jnp.max(jnp.where(x == val, pos, -1), axis=-1, keepdims=True)
    val, idx = jnp.moveaxis(val, -1, d), jnp.moveaxis(idx, -1, d)
    if not keepdim:
        val, idx = jnp.squeeze(val, d), jnp.squeeze(idx, d)
    return val, idx


@register("count_nonzero.default", "count_nonzero.dim_IntList")
def _count_nonzero(self: Array, dim: int | Sequence[int] | None = None) -> Array:
    return jnp.sum(self != 0, axis=reduce_dims(dim, self.ndim), dtype=jnp.int32)


@register("segment_reduce.default", lift_scalars=False)
def _segment_reduce(
    data: Array,
    reduce: str,
    *,
    lengths: Array | None = None,
    indices: Array | None = None,
    offsets: Array | None = None,
    axis: int = 0,
    unsafe: bool = False,
    initial: Number | None = None,
) -> Array:
    """Reduce consecutive runs of ``data`` along ``axis`` (1-d ``lengths`` or ``offsets``).

    Empty segments give ``initial`` or the reduction's identity (mean: nan);
    ``initial`` also takes part in non-empty reductions, as in torch.
    """
    bounds = lengths if lengths is not None else offsets
    if bounds is None:
        raise NotImplementedError("segment_reduce needs lengths or offsets (indices is unsupported in torch too)")
    if bounds.ndim > 1:  # batched: one 1-d problem per leading index (lengths/offsets share data's leading dims)
        a = canon_dim(axis, data.ndim)
        one = functools.partial(_segment_reduce, reduce=reduce, axis=a - 1, unsafe=unsafe, initial=initial)
        if lengths is not None:
            return jax.vmap(lambda d, b: one(d, lengths=b))(data, lengths)
        return jax.vmap(lambda d, b: one(d, offsets=b))(data, offsets)
    a = canon_dim(axis, data.ndim)
    nseg, seg = _segment_ids(data.shape[a], lengths, offsets)  # nseg past the end: dropped
    x = jnp.moveaxis(upcast(data), a, 0)
    count = jax.ops.segment_sum(jnp.ones_like(seg), seg, num_segments=nseg)
    count = count.reshape((nseg,) + (1,) * (x.ndim - 1))
    ops = {
        "sum": jax.ops.segment_sum,
        "mean": jax.ops.segment_sum,
        "max": jax.ops.segment_max,
        "min": jax.ops.segment_min,
        "prod": jax.ops.segment_prod,
    }
    out = ops[reduce](x, seg, num_segments=nseg)
    identity: Scalar = {"sum": 0.0, "mean": jnp.nan, "max": -jnp.inf, "min": jnp.inf, "prod": 1.0}[reduce]
    if initial is not None:
        combine = {"sum": jnp.add, "mean": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply}
        out = combine[reduce](out, initial)
        identity = initial
    if reduce == "mean":
        out = out / jnp.where(count > 0, count, 1)  # torch: (sum + initial) / count
    out = jnp.where(count > 0, out, identity)
    return jnp.moveaxis(out, 0, a)


def _segment_ids(n: int, lengths: Array | None, offsets: Array | None) -> tuple[int, Array]:
    """``(number of segments, segment id of each of the n positions)``; past the last segment: the count."""
    if offsets is None:  # then torch's schema check made the caller pass lengths
        offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(cast(Array, lengths).astype(jnp.int32))])
    offsets = offsets.astype(jnp.int32)
    pos = jnp.arange(n, dtype=jnp.int32)
    return offsets.shape[0] - 1, jnp.sum(pos[:, None] >= offsets[None, 1:], axis=1).astype(jnp.int32)


@register("_segment_reduce_backward.default", lift_scalars=False)
def _segment_reduce_backward(
    grad: Array,
    output: Array,
    data: Array,
    reduce: str,
    *,
    lengths: Array | None = None,
    offsets: Array | None = None,
    axis: int = 0,
    initial: Number | None = None,
) -> Array:
    """Gradient of ``segment_reduce`` w.r.t. ``data``, with the CPU kernel's conventions.

    max/min route the gradient to every element equal to the result (or NaN);
    with several such elements the CPU kernel divides only the *positive*
    gradients among them, which is reproduced. prod divides ``grad * output``
    by the element, except at zeros/NaNs where the product of the others is
    taken explicitly. Elements past the last segment get 0.
    """
    bounds = lengths if lengths is not None else offsets
    if bounds is None:
        raise NotImplementedError("_segment_reduce_backward needs lengths or offsets")
    if bounds.ndim > 1:  # batched, as the forward
        a = canon_dim(axis, data.ndim)
        one = functools.partial(_segment_reduce_backward, reduce=reduce, axis=a - 1, initial=initial)
        if lengths is not None:
            return jax.vmap(lambda g, o, d, b: one(g, o, d, lengths=b))(grad, output, data, lengths)
        return jax.vmap(lambda g, o, d, b: one(g, o, d, offsets=b))(grad, output, data, offsets)
    a = canon_dim(axis, data.ndim)
    nseg, seg = _segment_ids(data.shape[a], lengths, offsets)
    x = jnp.moveaxis(upcast(data), a, 0)
    g = jnp.moveaxis(upcast(grad), a, 0)
    y = jnp.moveaxis(upcast(output), a, 0)
    n = x.shape[0]
    if nseg == 0 or n == 0:
        return jnp.zeros(data.shape, x.dtype)
    inside = (seg < nseg).reshape((n,) + (1,) * (x.ndim - 1))
    segc = jnp.minimum(seg, nseg - 1)
    gs, ys = g[segc], y[segc]  # each element's segment gradient / result
    zero = jnp.zeros((), x.dtype)

    def seg_sum(v: Array) -> Array:
        return jax.ops.segment_sum(v, seg, num_segments=nseg)[segc]

    if reduce == "sum":
        out = gs
    elif reduce == "mean":
        count = seg_sum(jnp.ones((n,), x.dtype)).reshape((n,) + (1,) * (x.ndim - 1))
        out = gs / jnp.maximum(count, 1)
    elif reduce in ("max", "min"):
        hit = jnp.isnan(x) | (x == ys)
        out = jnp.where(hit, gs, zero)
        counter = seg_sum(hit.astype(jnp.int32))
        out = jnp.where((counter >= 2) & (out > 0), out / jnp.maximum(counter, 1).astype(x.dtype), out)
    elif reduce == "prod":
        special = jnp.isnan(x) | (x == 0)
        n_nan = seg_sum(jnp.isnan(x).astype(jnp.int32)) - jnp.isnan(x)
        n_zero = seg_sum((x == 0).astype(jnp.int32)) - (x == 0)
        regular = jax.ops.segment_prod(jnp.where(special, 1.0, x), seg, num_segments=nseg)[segc]
        if initial is not None:
            regular = regular * initial
        excl = jnp.where(n_nan > 0, jnp.nan, jnp.where(n_zero > 0, zero, regular))
        out = jnp.where(special, gs * excl, gs * ys / jnp.where(special, 1.0, x))
    else:
        raise NotImplementedError(f"_segment_reduce_backward: unknown reduction {reduce!r}")
    out = jnp.where(inside, out, zero)
    return jnp.moveaxis(out, 0, a)
