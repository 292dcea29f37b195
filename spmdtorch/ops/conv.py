"""Convolution, pooling, upsampling and adaptive pooling (N-d, NC* layout).

Backward ops whose arguments fully determine the forward are ``jax.vjp`` of
the forward lowering; ``max_pool*_with_indices_backward`` scatters into the
saved indices, which is exact (and matches torch's tie-breaking).
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from spmdtorch.ops import linalg
from spmdtorch.ops._util import Array, is_float, upcast
from spmdtorch.ops.registry import register, register_meta


def _tuple(v: int | Sequence[int], n: int) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    if len(v) == 1:
        return v * n
    return v


# ---------------------------------------------------------------------------
# Convolution


def _conv(
    input: Array,
    weight: Array,
    bias: Array | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> Array:
    nsp = weight.ndim - 2
    unbatched = input.ndim == nsp + 1
    x = input[None] if unbatched else input
    stride, padding, dilation = _tuple(stride, nsp), _tuple(padding, nsp), _tuple(dilation, nsp)
    output_padding = _tuple(output_padding, nsp) if output_padding else (0,) * nsp
    pet = jnp.float32 if is_float(x) else None
    if not transposed:
        out = lax.conv_general_dilated(
            x,
            weight,
            window_strides=stride,
            padding=[(p, p) for p in padding],
            rhs_dilation=dilation,
            feature_group_count=groups,
            dimension_numbers=_dn(nsp),
            precision=linalg.MATMUL_PRECISION,
            preferred_element_type=pet,
        )
    else:
        # Transposed conv = conv of the stride-dilated input with the flipped
        # kernel, in/out channels swapped per group.
        cin, cout_g = weight.shape[0], weight.shape[1]
        k = weight.shape[2:]
        w = weight.reshape((groups, cin // groups, cout_g) + k)
        w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + nsp)))
        pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, d, p, op in zip(k, dilation, padding, output_padding)]
        out = lax.conv_general_dilated(
            x,
            w,
            window_strides=(1,) * nsp,
            padding=pads,
            lhs_dilation=stride,
            rhs_dilation=dilation,
            feature_group_count=groups,
            dimension_numbers=_dn(nsp),
            precision=linalg.MATMUL_PRECISION,
            preferred_element_type=pet,
        )
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * nsp)
    return out[0] if unbatched else out


def _dn(nsp: int) -> tuple[str, str, str]:
    if not 1 <= nsp <= 3:
        raise NotImplementedError(f"convolution over {nsp} spatial dims: the lowering handles 1 to 3, as torch does")
    sp = "DHW"[-nsp:]
    return ("NC" + sp, "OI" + sp, "NC" + sp)


@register("convolution.default", "_convolution.default", "_convolution.deprecated")
def _convolution(
    input: Array,
    weight: Array,
    bias: Array | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    *unused: bool,
) -> Array:
    # ``_convolution`` adds benchmark/deterministic/cudnn/tf32 flags: ignored.
    return _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


@register("convolution_backward.default")
def _convolution_backward(
    grad_output: Array,
    input: Array,
    weight: Array,
    bias_sizes: Sequence[int] | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array | None, Array | None]:
    f = lambda x, w: _conv(
        x,
        w,
        None,
        stride,
        padding,
        dilation,
        transposed,
        output_padding,
        groups,
    )
    pet = jnp.float32 if is_float(input) else input.dtype
    _, vjp = jax.vjp(f, input.astype(pet), weight.astype(pet))
    gx, gw = vjp(grad_output.astype(pet))
    nsp = weight.ndim - 2
    gb = None
    if output_mask[2]:
        g = grad_output if grad_output.ndim == nsp + 2 else grad_output[None]
        gb = jnp.sum(upcast(g), axis=(0,) + tuple(range(2, g.ndim)))
    return (gx if output_mask[0] else None), (gw if output_mask[1] else None), gb


# ---------------------------------------------------------------------------
# Pooling helpers


def _pool_out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    eff = d * (k - 1) + 1
    num = n + 2 * p - eff
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1  # the last window must start inside the input or left pad
    return max(out, 0)


def _pool_geometry(
    x: Array,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    dilation: int | Sequence[int],
    ceil_mode: bool,
    nsp: int,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    k = _tuple(kernel_size, nsp)
    s = _tuple(stride, nsp) if stride else k
    p = _tuple(padding, nsp)
    d = _tuple(dilation, nsp)
    sp = x.shape[-nsp:]
    out = tuple(_pool_out_size(n, kk, ss, pp, dd, ceil_mode) for n, kk, ss, pp, dd in zip(sp, k, s, p, d))
    # Right padding so that every window of the output fits.
    hi = tuple(max(0, (o - 1) * ss + dd * (kk - 1) + 1 - n - pp) for o, ss, dd, kk, n, pp in zip(out, s, d, k, sp, p))
    return k, s, p, d, out, hi


def _windows(
    xp: Array, k: Sequence[int], s: Sequence[int], d: Sequence[int], out: Sequence[int], nsp: int
) -> tuple[Array, list[tuple[int, ...]]]:
    """Stack of strided slices, one per kernel offset: shape (K, ..., *out)."""
    lead = xp.ndim - nsp
    slices = []
    for offs in np.ndindex(*k):
        start = (0,) * lead + tuple(o * dd for o, dd in zip(offs, d))
        limit = tuple(xp.shape[:lead]) + tuple(o * dd + (n - 1) * ss + 1 for o, dd, n, ss in zip(offs, d, out, s))
        slices.append(lax.slice(xp, start, limit, (1,) * lead + tuple(s)))
    return jnp.stack(slices), list(np.ndindex(*k))


def _max_pool_with_indices(
    self: Array,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    dilation: int | Sequence[int],
    ceil_mode: bool,
    nsp: int,
) -> tuple[Array, Array]:
    k, s, p, d, out, hi = _pool_geometry(self, kernel_size, stride, padding, dilation, ceil_mode, nsp)
    lead = self.ndim - nsp
    if jnp.issubdtype(self.dtype, jnp.floating):
        lowest = -jnp.inf
    else:
        lowest = jnp.iinfo(self.dtype).min
    cfg = [(0, 0, 0)] * lead + [(pp, h, 0) for pp, h in zip(p, hi)]
    xp = lax.pad(self, jnp.asarray(lowest, self.dtype), cfg)
    win, offsets = _windows(xp, k, s, d, out, nsp)
    # Flat input index of each window element (row-major over the spatial dims).
    sp = self.shape[-nsp:]
    rows = []
    for offs in offsets:
        coords = [np.arange(o) * ss - pp + off * dd for o, ss, pp, off, dd in zip(out, s, p, offs, d)]
        grid = np.meshgrid(*coords, indexing="ij")
        rows.append(np.ravel_multi_index(grid, sp, mode="clip"))
    flat = jnp.asarray(np.stack(rows).astype(np.int32))  # (K, *out)
    # NaN counts as the maximum, as in torch's kernel.
    key = jnp.where(jnp.isnan(win), jnp.inf, win) if is_float(win) else win
    arg = jnp.argmax(key, axis=0)
    vals = jnp.take_along_axis(win, arg[None], axis=0)[0]
    idx = jnp.take_along_axis(
        jnp.broadcast_to(flat.reshape((flat.shape[0],) + (1,) * lead + tuple(out)), win.shape), arg[None], axis=0
    )[0]
    return vals, idx


def _max_pool_backward(grad_output: Array, self: Array, indices: Array, nsp: int) -> Array:
    lead = self.shape[:-nsp]
    n_sp = int(np.prod(self.shape[-nsp:]))
    g = upcast(grad_output).reshape(lead + (-1,))
    idx = indices.reshape(lead + (-1,))
    out = jnp.zeros(lead + (n_sp,), g.dtype)
    if len(lead) == 0:
        out = out.at[idx].add(g)
    else:
        batch = tuple(lax.broadcasted_iota(jnp.int32, idx.shape, i) for i in range(len(lead)))
        out = out.at[batch + (idx,)].add(g)
    return out.reshape(self.shape)


for _n in (1, 2, 3):

    def _mp(
        self: Array,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: int | Sequence[int] = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
        _n: int = _n,
    ) -> tuple[Array, Array]:
        return _max_pool_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode, _n)

    def _mpb(
        grad_output: Array,
        self: Array,
        kernel_size: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        ceil_mode: bool,
        indices: Array,
        _n: int = _n,
    ) -> Array:
        return _max_pool_backward(grad_output, self, indices, _n)

    register(f"max_pool{_n}d_with_indices.default")(_mp)
    register(f"max_pool{_n}d_with_indices_backward.default")(_mpb)


@register("max_pool2d.default", "max_pool1d.default", "max_pool3d.default")
def _max_pool(
    self: Array,
    kernel_size: Sequence[int],
    stride: Sequence[int] = (),
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> Array:
    nsp = len(_tuple(kernel_size, 1)) if not isinstance(kernel_size, int) else 1
    return _max_pool_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode, nsp)[0]


def _avg_pool(
    self: Array,
    kernel_size: int | Sequence[int],
    stride: int | Sequence[int],
    padding: int | Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
    nsp: int,
) -> Array:
    k, s, p, d, out, hi = _pool_geometry(self, kernel_size, stride, padding, 1, ceil_mode, nsp)
    lead = self.ndim - nsp
    x = upcast(self)
    cfg = [(0, 0, 0)] * lead + [(pp, h, 0) for pp, h in zip(p, hi)]
    xp = lax.pad(x, jnp.zeros((), x.dtype), cfg)
    win_dims = (1,) * lead + k
    win_strides = (1,) * lead + s
    # lax.reduce_window is typed Any.
    total: Array = lax.reduce_window(xp, 0.0, lax.add, win_dims, win_strides, "VALID")
    if divisor_override:
        return total / divisor_override
    # Divisor: window elements inside the (zero-)padded region if
    # count_include_pad, else inside the input; the extra ceil-mode right
    # padding never counts.
    sp = self.shape[-nsp:]
    masks = []
    for n, pp, h in zip(sp, p, hi):
        m = np.zeros(pp + n + h, np.float32)
        if count_include_pad:
            m[: min(n + 2 * pp, len(m))] = 1
        else:
            m[pp : pp + n] = 1
        masks.append(m)
    mask = masks[0]
    for m in masks[1:]:
        mask = np.multiply.outer(mask, m)
    cnt: Array = lax.reduce_window(jnp.asarray(mask), 0.0, lax.add, k, s, "VALID")
    return total / cnt


for _n in (1, 2, 3):

    def _ap(
        self: Array,
        kernel_size: Sequence[int],
        stride: Sequence[int] = (),
        padding: int | Sequence[int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
        _n: int = _n,
    ) -> Array:
        return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, _n)

    def _apb(
        grad_output: Array,
        self: Array,
        kernel_size: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        ceil_mode: bool,
        count_include_pad: bool,
        divisor_override: int | None = None,
        _n: int = _n,
    ) -> Array:
        f = lambda x: _avg_pool(
            x,
            kernel_size,
            stride,
            padding,
            ceil_mode,
            count_include_pad,
            divisor_override,
            _n,
        )
        # jax types a pullback's result Any.
        res: Array = jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]
        return res

    register(f"avg_pool{_n}d.default")(_ap)
    register(f"avg_pool{_n}d_backward.default")(_apb)


# ---------------------------------------------------------------------------
# Adaptive pooling


def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) averaging matrix with torch's window bounds
    ``[floor(i*n/o), ceil((i+1)*n/o))``."""
    m = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
        a = (i * n_in) // n_out
        b = -(-((i + 1) * n_in) // n_out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _adaptive_avg(self: Array, output_size: int | Sequence[int], nsp: int) -> Array:
    x = upcast(self)
    out_sz = _tuple(output_size, nsp)
    for i, o in enumerate(out_sz):
        ax = x.ndim - nsp + i
        m = jnp.asarray(_adaptive_matrix(x.shape[ax], o))
        x = jnp.moveaxis(jnp.tensordot(x, m, axes=([ax], [1]), precision=lax.Precision.HIGHEST), -1, ax)
    return x


for _n in (1, 2, 3):

    def _aap(self: Array, output_size: Sequence[int], _n: int = _n) -> Array:
        return _adaptive_avg(self, output_size, _n)

    def _aapb(grad_output: Array, self: Array, _n: int = _n) -> Array:
        out_size = grad_output.shape[-_n:]
        f = lambda x: _adaptive_avg(x, out_size, _n)
        # jax types a pullback's result Any.
        res: Array = jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]
        return res

    register(f"_adaptive_avg_pool{_n}d.default", f"adaptive_avg_pool{_n}d.default")(_aap)
    register(f"_adaptive_avg_pool{_n}d_backward.default")(_aapb)


def _adaptive_max(self: Array, output_size: int | Sequence[int], nsp: int) -> tuple[Array, Array]:
    """Adaptive max pool: (values, flat spatial indices), via per-window masks."""
    out_sz = _tuple(output_size, nsp)
    sp = self.shape[-nsp:]
    lead = self.shape[:-nsp]
    x = self.reshape(lead + (-1,))
    lowest = -jnp.inf if is_float(self) else jnp.iinfo(self.dtype).min
    # (n_out_total, n_in_total) membership mask.
    mem = np.ones((1, 1), bool)
    for n, o in zip(sp, out_sz):
        mm = _adaptive_matrix(n, o) > 0
        mem = np.einsum("ab,cd->acbd", mem, mm).reshape(mem.shape[0] * o, mem.shape[1] * n)
    masked = jnp.where(jnp.asarray(mem), x[..., None, :], lowest)  # (..., O, I)
    key = jnp.where(jnp.isnan(masked), jnp.inf, masked) if is_float(self) else masked
    idx = jnp.argmax(key, axis=-1)
    vals = jnp.take_along_axis(masked, idx[..., None], axis=-1)[..., 0]
    return vals.reshape(lead + out_sz), idx.astype(jnp.int32).reshape(lead + out_sz)


for _n in (1, 2, 3):

    def _amp(self: Array, output_size: Sequence[int], _n: int = _n) -> tuple[Array, Array]:
        return _adaptive_max(self, output_size, _n)

    def _ampb(grad_output: Array, self: Array, indices: Array, _n: int = _n) -> Array:
        return _max_pool_backward(grad_output, self, indices, _n)

    register(f"adaptive_max_pool{_n}d.default")(_amp)
    register(f"adaptive_max_pool{_n}d_backward.default")(_ampb)


# ---------------------------------------------------------------------------
# Fractional max pooling (the pooling regions come from ``random_samples``,
# one sample in [0, 1) per plane and spatial dim, as torch's CPU kernel)


def _fractional_starts(sample: Array, n_in: int, n_out: int, k: int) -> Array:
    """Window starts ``(..., n_out)`` for per-plane ``sample`` (...), torch's ``generate_intervals``."""
    i = jnp.arange(n_out, dtype=jnp.float32)
    if n_out > 1:
        alpha = jnp.float32(n_in - k) / jnp.float32(n_out - 1)
        s = sample.astype(jnp.float32)[..., None]
        # C++ static_cast<int>: truncation (the operands are >= 0)
        starts = jnp.trunc((i + s) * alpha).astype(jnp.int32) - jnp.trunc(s * alpha).astype(jnp.int32)
    else:
        starts = jnp.zeros(sample.shape + (n_out,), jnp.int32)
    return starts.at[..., n_out - 1].set(n_in - k) if n_out > 0 else starts


def _fractional_max_pool(
    self: Array, kernel_size: Sequence[int], output_size: Sequence[int], random_samples: Array
) -> tuple[Array, Array]:
    nsp = len(kernel_size)
    unbatched = self.ndim == nsp + 1
    x = self[None] if unbatched else self
    sp = x.shape[2:]
    out_shape = x.shape[:2] + tuple(output_size)
    if x.size == 0 or 0 in out_shape:
        out, idx = jnp.zeros(out_shape, x.dtype), jnp.zeros(out_shape, jnp.int32)
        return (out[0], idx[0]) if unbatched else (out, idx)
    samples = random_samples.reshape(x.shape[:2] + (nsp,))
    # torch's sample order: 2-d (W, H); 3-d (T, H, W).
    order = (1, 0) if nsp == 2 else (0, 1, 2)
    # Per spatial dim d: absolute positions (N, C, out_d, k_d) of every window tap.
    pos = [
        _fractional_starts(samples[..., order[d]], sp[d], output_size[d], kernel_size[d])[..., None]
        + jnp.arange(kernel_size[d], dtype=jnp.int32)
        for d in range(nsp)
    ]
    # Flat in-plane index of every (output position, tap), shape (N, C, *out, *k).
    flat = jnp.zeros((), jnp.int32)
    for d in range(nsp):
        shape = [x.shape[0], x.shape[1]] + [1] * (2 * nsp)
        shape[2 + d], shape[2 + nsp + d] = output_size[d], kernel_size[d]
        flat = flat * sp[d] + pos[d].reshape(shape)
    n_k = int(np.prod(kernel_size))
    flat = flat.reshape(x.shape[:2] + tuple(output_size) + (n_k,))
    vals = jnp.take_along_axis(x.reshape(x.shape[:2] + (-1,)), flat.reshape(x.shape[:2] + (-1,)), axis=2)
    vals = vals.reshape(flat.shape)
    # First maximum in scan order; a NaN wins over everything and the last NaN wins
    # (the kernel's ``val > maxVal || isnan(val)``).
    is_nan = jnp.isnan(vals)
    last_nan = n_k - 1 - jnp.argmax(is_nan[..., ::-1], axis=-1)
    pick = jnp.where(jnp.any(is_nan, axis=-1), last_nan, jnp.argmax(vals, axis=-1))
    out = jnp.take_along_axis(vals, pick[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(flat, pick[..., None], axis=-1)[..., 0]
    return (out[0], idx[0]) if unbatched else (out, idx)


def _fractional_max_pool_backward(
    grad_output: Array, self: Array, kernel_size: Sequence[int], output_size: Sequence[int], indices: Array
) -> Array:
    """Each output's gradient added at the input position its ``indices`` entry names."""
    nsp = len(kernel_size)
    unbatched = self.ndim == nsp + 1
    lead = self.shape[:1] if unbatched else self.shape[:2]
    if self.size == 0 or grad_output.size == 0:
        return jnp.zeros(self.shape, upcast(grad_output).dtype)
    g = upcast(grad_output).reshape(lead + (-1,))
    idx = indices.reshape(lead + (-1,)).astype(jnp.int32)
    plane = int(np.prod(self.shape[len(lead) :]))
    out = jnp.zeros(lead + (plane,), g.dtype)
    if unbatched:
        out = jax.vmap(lambda o, i, v: o.at[i].add(v))(out, idx, g)
    else:
        out = jax.vmap(jax.vmap(lambda o, i, v: o.at[i].add(v)))(out, idx, g)
    # jax.vmap's result is typed Any.
    res: Array = out.reshape(self.shape)
    return res


@register_meta("fractional_max_pool3d_backward.default")  # torch ships none (the 2-d op has one)
def _fractional_max_pool_backward_meta(
    grad_output: torch.Tensor,
    self: torch.Tensor,
    kernel_size: Sequence[int],
    output_size: Sequence[int],
    indices: torch.Tensor,
) -> torch.Tensor:
    return self.new_empty(self.shape)


for _n in (2, 3):
    register(f"fractional_max_pool{_n}d.default")(_fractional_max_pool)
    register(f"fractional_max_pool{_n}d_backward.default")(_fractional_max_pool_backward)


# ---------------------------------------------------------------------------
# Upsampling


def _out_and_scales(
    in_sp: Sequence[int], output_size: Sequence[int] | None, scale_factors: Sequence[float] | None
) -> tuple[tuple[int, ...], list[float | None]]:
    """(output sizes, per-dim scale (in/out) or user scale) for .vec overloads."""
    if output_size is not None:
        return tuple(output_size), [None] * len(in_sp)
    scale_factors = cast("Sequence[float]", scale_factors)  # torch requires one of the two
    out = tuple(int(math.floor(n * f)) for n, f in zip(in_sp, scale_factors))
    return out, list(scale_factors)


def _src_scale(n_in: int, n_out: int, scale: float | None, align_corners: bool = False) -> float:
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return n_in / n_out


def _nearest(x: Array, out_sz: Sequence[int], scales: Sequence[float | None], exact: bool = False) -> Array:
    nsp = len(out_sz)
    for i, (o, sc) in enumerate(zip(out_sz, scales)):
        ax = x.ndim - nsp + i
        n = x.shape[ax]
        r = _src_scale(n, o, sc)
        if exact:  # round-half-up of the pixel centre
            src = np.floor((np.arange(o) + 0.5) * np.float32(r)).astype(np.int64)
        else:
            src = np.floor(np.arange(o, dtype=np.float32) * np.float32(r)).astype(np.int64)
        x = jnp.take(x, jnp.asarray(np.minimum(src, n - 1).astype(np.int32)), axis=ax)
    return x


def _linear(
    x: Array, out_sz: Sequence[int], align_corners: bool, scales: Sequence[float | None], cubic: bool = False
) -> Array:
    nsp = len(out_sz)
    x = upcast(x)
    for i, (o, sc) in enumerate(zip(out_sz, scales)):
        ax = x.ndim - nsp + i
        n = x.shape[ax]
        r = _src_scale(n, o, sc, align_corners)
        dst = np.arange(o, dtype=np.float32)
        if align_corners:
            src = dst * np.float32(r)
        else:
            src = np.maximum((dst + 0.5) * np.float32(r) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), n - 1)
        i1 = np.minimum(i0 + 1, n - 1)
        lam = (src - i0).astype(np.float32)
        shape = [1] * x.ndim
        shape[ax] = o
        lam = jnp.asarray(lam).reshape(shape)
        a = jnp.take(x, jnp.asarray(i0.astype(np.int32)), axis=ax)
        b = jnp.take(x, jnp.asarray(i1.astype(np.int32)), axis=ax)
        x = a * (1 - lam) + b * lam
    return x


def _register_upsample(nsp: int, name: str, fwd: Callable[..., Array]) -> None:
    """Register ``name`` (.default and .vec) and its backward for ``fwd``."""

    def vec(input: Array, output_size: Sequence[int] | None, *rest: bool | Sequence[float] | None) -> Array:
        *ac, scale_factors = rest
        # .vec's tail: (align_corners,) for the linear modes, then the scale factors.
        out, scales = _out_and_scales(input.shape[-nsp:], output_size, cast("Sequence[float] | None", scale_factors))
        return fwd(input, out, scales, *ac)

    def default(self: Array, output_size: Sequence[int], *rest: bool | float | None) -> Array:
        ac = list(rest[:1]) if "linear" in name or "bicubic" in name else []
        scales = list(rest[len(ac) :]) + [None] * nsp
        return fwd(self, tuple(output_size), scales[:nsp], *ac)

    def backward(
        grad_output: Array, output_size: Sequence[int], input_size: Sequence[int], *rest: bool | float | None
    ) -> Array:
        ac = list(rest[:1]) if "linear" in name or "bicubic" in name else []
        scales = list(rest[len(ac) :]) + [None] * nsp
        x0 = jnp.zeros(tuple(input_size), jnp.float32)
        f = lambda x: fwd(x, tuple(output_size), scales[:nsp], *ac)
        # jax types a pullback's result Any.
        res: Array = jax.vjp(f, x0)[1](upcast(grad_output))[0]
        return res

    # The scales build static (numpy) index tables, so they stay Python numbers.
    register(f"{name}.vec", lift_scalars=False)(vec)
    register(f"{name}.default", lift_scalars=False)(default)
    register(f"{name}_backward.default", lift_scalars=False)(backward)


for _nsp, _suffix in ((1, "1d"), (2, "2d"), (3, "3d")):
    _register_upsample(_nsp, f"upsample_nearest{_suffix}", lambda x, o, s: _nearest(x, o, s))
    _register_upsample(_nsp, f"_upsample_nearest_exact{_suffix}", lambda x, o, s: _nearest(x, o, s, exact=True))
_register_upsample(1, "upsample_linear1d", lambda x, o, s, ac: _linear(x, o, ac, s))
_register_upsample(2, "upsample_bilinear2d", lambda x, o, s, ac: _linear(x, o, ac, s))
_register_upsample(3, "upsample_trilinear3d", lambda x, o, s, ac: _linear(x, o, ac, s))


def _area_scale(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.float32:
    """ATen's ``area_pixel_compute_scale`` in float32 (the CPU kernels' opmath type)."""
    if align_corners:
        return np.float32((n_in - 1) / (n_out - 1)) if n_out > 1 else np.float32(0.0)
    if scale is not None and scale > 0:
        return np.float32(1.0 / scale)
    return np.float32(n_in / n_out)


def _cubic_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    """(n_out, n_in) weights of torch's bicubic upsampling along one dim (A = -0.75,
    taps clamped to the edge), computed in float32 as the CPU kernel does."""
    f32 = np.float32
    r = _area_scale(n_in, n_out, align_corners, scale)
    dst = np.arange(n_out, dtype=f32)
    src = dst * r if align_corners else (dst + f32(0.5)) * r - f32(0.5)  # no clamp at 0 for cubic
    i0 = np.floor(src).astype(np.int64)
    t = (src - i0.astype(f32)).astype(f32)
    a = f32(-0.75)

    def conv1(x: np.ndarray) -> np.ndarray:  # |x| <= 1
        # NumPy arithmetic on an untyped ndarray is Any.
        res: np.ndarray = ((a + 2) * x - (a + 3)) * x * x + 1
        return res

    def conv2(x: np.ndarray) -> np.ndarray:  # 1 < |x| < 2
        # NumPy arithmetic on an untyped ndarray is Any.
        res: np.ndarray = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
        return res

    coeffs = [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]
    m = np.zeros((n_out, n_in), np.float32)
    rows = np.arange(n_out)
    for k, c in enumerate(coeffs):
        np.add.at(m, (rows, np.clip(i0 - 1 + k, 0, n_in - 1)), c.astype(f32))
    return m


def _aa_linear_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None) -> np.ndarray:
    """(n_out, n_in) weights of torch's antialiased bilinear resize along one dim:
    a triangle filter widened by the scale when downsampling, normalised per
    output pixel (``_compute_weights_aa`` of the CPU kernel)."""
    f32 = np.float32
    r = _area_scale(n_in, n_out, align_corners, scale)
    support = f32(1.0) * r if r >= 1.0 else f32(1.0)  # interp_size / 2 = 1 for bilinear
    invscale = f32(1.0) / r if r >= 1.0 else f32(1.0)
    m = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
        center = r * f32(i + 0.5)
        xmin = max(int(center - support + f32(0.5)), 0)
        xmax = min(int(center + support + f32(0.5)), n_in)
        j = np.arange(xmin, xmax)
        w = np.maximum(f32(1.0) - np.abs((j.astype(f32) - center + f32(0.5)) * invscale), f32(0.0)).astype(f32)
        total = w.sum(dtype=np.float32)
        m[i, xmin:xmax] = w / total if total != 0 else w
    return m


def _separable(
    x: Array,
    out_sz: Sequence[int],
    scales: Sequence[float | None],
    align_corners: bool,
    matrix: Callable[[int, int, bool, float | None], np.ndarray],
) -> Array:
    """Apply one (n_out, n_in) matrix per spatial dim (the last ``len(out_sz)`` dims)."""
    nsp = len(out_sz)
    x = upcast(x)
    for i, (o, sc) in enumerate(zip(out_sz, scales)):
        ax = x.ndim - nsp + i
        m = jnp.asarray(matrix(x.shape[ax], o, align_corners, sc))
        x = jnp.moveaxis(jnp.tensordot(x, m, axes=[[ax], [1]], precision=lax.Precision.HIGHEST), -1, ax)
    return x


def _upsample_backward_of(
    fwd: Callable[[Array, tuple[int, ...], list[float | None], bool], Array],
) -> Callable[..., Array]:
    def backward(
        grad_output: Array,
        output_size: Sequence[int],
        input_size: Sequence[int],
        align_corners: bool,
        scales_h: float | None = None,
        scales_w: float | None = None,
    ) -> Array:
        x0 = jnp.zeros(tuple(input_size), jnp.float32)
        f = lambda x: fwd(x, tuple(output_size), [scales_h, scales_w], align_corners)
        # jax types a pullback's result Any.
        res: Array = jax.vjp(f, x0)[1](upcast(grad_output))[0]
        return res

    return backward


def _bicubic(x: Array, out_sz: Sequence[int], scales: Sequence[float | None], align_corners: bool) -> Array:
    return _separable(x, out_sz, scales, align_corners, _cubic_matrix)


def _bilinear_aa(x: Array, out_sz: Sequence[int], scales: Sequence[float | None], align_corners: bool) -> Array:
    return _separable(x, out_sz, scales, align_corners, _aa_linear_matrix)


# The bicubic forward runs through torch's decomposition; its backward (no
# decomposition) is the transpose of the same per-dim weights.
register("upsample_bicubic2d_backward.default", lift_scalars=False)(_upsample_backward_of(_bicubic))
register("_upsample_bilinear2d_aa_backward.default", lift_scalars=False)(_upsample_backward_of(_bilinear_aa))


@register("_upsample_bilinear2d_aa.default", lift_scalars=False)
def _upsample_bilinear2d_aa(
    self: Array,
    output_size: Sequence[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> Array:
    return _bilinear_aa(self, tuple(output_size), [scales_h, scales_w], align_corners)


@register("_upsample_bilinear2d_aa.vec", lift_scalars=False)
def _upsample_bilinear2d_aa_vec(
    input: Array, output_size: Sequence[int] | None, align_corners: bool, scale_factors: Sequence[float] | None
) -> Array:
    out, scales = _out_and_scales(input.shape[-2:], output_size, scale_factors)
    return _bilinear_aa(input, out, scales, align_corners)


# ---------------------------------------------------------------------------
# grid_sample (grid_sampler_2d/3d and their backward ops)
#
# One N-d formulation; the backward ops are its jax.vjp. Padding and clipping
# use ``where`` rather than min/max/abs so that the gradient at a boundary is
# the CPU kernels' (0 on a clipped coordinate, +1 for a reflection at 0)
# instead of jax's split gradients at ties.


def _gs_unnormalize(coord: Array, size: int, align_corners: bool, nsp: int) -> Array:
    if nsp == 2:  # the vectorised 2-d CPU kernel's form
        if align_corners:
            return (coord + 1) * ((size - 1) / 2)
        return (coord + 1) * (size / 2) - 0.5
    if align_corners:  # the scalar 3-d kernel's form
        return ((coord + 1) / 2) * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _gs_clip(coord: Array, size: int) -> Array:
    return jnp.where(coord > 0, jnp.where(coord < size - 1, coord, float(size - 1)), 0.0)


def _gs_reflect(coord: Array, twice_low: int, twice_high: int) -> Array:
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    x = coord - lo
    x = jnp.where(x < 0, -x, x)
    extra = jnp.fmod(x, span)
    flips = jnp.floor(lax.stop_gradient(x) / span)
    odd = jnp.fmod(flips, 2) != 0
    return jnp.where(odd, span - extra + lo, extra + lo)


def _gs_reflect_2d(coord: Array, size: int, align_corners: bool) -> Array:
    """The vectorised 2-d kernel's reflection (abs / trunc / fold), with its gradient sign."""
    if align_corners and size <= 1:
        return jnp.zeros_like(coord)
    low = 0.0 if align_corners else -0.5
    twice_span = 2.0 * (size - 1) if align_corners else 2.0 * size
    x = coord - low
    x = jnp.where(x < 0, -x, x)
    extra = x - jnp.trunc(lax.stop_gradient(x) / twice_span) * twice_span
    reflected = twice_span - extra
    return jnp.where(extra > reflected, reflected, extra) + low


def _gs_pad(coord: Array, size: int, padding_mode: int, align_corners: bool, nsp: int = 3) -> Array:
    """``compute_coordinates``: 0 zeros (unchanged), 1 border, 2 reflection."""
    if padding_mode == 1:
        return _gs_clip(coord, size)
    if padding_mode == 2 and nsp == 2:
        return _gs_clip(_gs_reflect_2d(coord, size, align_corners), size)
    if padding_mode == 2:
        if align_corners:
            coord = _gs_reflect(coord, 0, 2 * (size - 1))
        else:
            coord = _gs_reflect(coord, -1, 2 * size - 1)
        return _gs_clip(coord, size)
    return coord


def _gs_gather(flat: Array, sizes: Sequence[int], taps: Sequence[Array]) -> Array:
    """Values of ``flat`` (N, C, prod(sizes)) at integer tap coordinates.

    ``taps`` is one (N, *out) float array per spatial dim (outermost first);
    taps outside the input read 0.
    """
    n, c = flat.shape[:2]
    out_shape = taps[0].shape
    valid = jnp.ones(out_shape, bool)
    lin = jnp.zeros(out_shape, jnp.int32)
    for t, size in zip(taps, sizes):
        valid = valid & (t >= 0) & (t <= size - 1)
        lin = lin * size + jnp.clip(t, 0, size - 1).astype(jnp.int32)
    vals = jnp.take_along_axis(flat, lin.reshape(n, 1, -1), axis=2).reshape((n, c) + out_shape[1:])
    return jnp.where(valid[:, None], vals, 0.0)


def _cubic_coeffs(t: Array) -> list[Array]:
    a = -0.75

    def conv1(x: Array) -> Array:
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def conv2(x: Array) -> Array:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return [conv2(t + 1), conv1(t), conv1(1 - t), conv2(2 - t)]


def _grid_sample(input: Array, grid: Array, interpolation_mode: int, padding_mode: int, align_corners: bool) -> Array:
    """torch's ``grid_sampler_{2,3}d`` (mode 0 bilinear, 1 nearest, 2 bicubic;
    padding 0 zeros, 1 border, 2 reflection) on (N, C, *S) with an (N, *out, nsp) grid."""
    x, g = upcast(input), upcast(grid)
    nsp = x.ndim - 2
    sizes = x.shape[2:]
    flat = x.reshape(x.shape[:2] + (-1,))
    # grid[..., 0] indexes the last (W) dim: reverse to outermost-first.
    coords = [g[..., nsp - 1 - k] for k in range(nsp)]
    src = [_gs_unnormalize(cd, sz, align_corners, nsp) for cd, sz in zip(coords, sizes)]
    if interpolation_mode == 2:
        if nsp != 2:
            raise NotImplementedError("grid_sample: bicubic interpolation supports 4-D input only")
        base = [lax.stop_gradient(jnp.floor(sv)) for sv in src]
        cy, cx = (_cubic_coeffs(sv - b) for sv, b in zip(src, base))
        out: Array | float = 0.0
        for i in range(4):
            row: Array | float = 0.0
            for j in range(4):
                ty = _gs_pad(base[0] - 1 + i, sizes[0], padding_mode, align_corners, nsp)
                tx = _gs_pad(base[1] - 1 + j, sizes[1], padding_mode, align_corners, nsp)
                row = row + _gs_gather(flat, sizes, [lax.stop_gradient(ty), lax.stop_gradient(tx)]) * cx[j][:, None]
            out = out + row * cy[i][:, None]
        return cast(Array, out)  # 16 terms were added
    src = [_gs_pad(sv, sz, padding_mode, align_corners, nsp) for sv, sz in zip(src, sizes)]
    if interpolation_mode == 1:
        return _gs_gather(flat, sizes, [lax.stop_gradient(jnp.round(sv)) for sv in src])
    if interpolation_mode != 0:
        raise ValueError(f"grid_sample: unknown interpolation mode {interpolation_mode}")
    lo = [lax.stop_gradient(jnp.floor(sv)) for sv in src]
    frac = [sv - l for sv, l in zip(src, lo)]  # weight of the upper neighbour
    out = 0.0
    for corner in range(2**nsp):
        bits = [(corner >> (nsp - 1 - k)) & 1 for k in range(nsp)]
        w = functools.reduce(operator.mul, [f if b else 1 - f for b, f in zip(bits, frac)])
        out = out + _gs_gather(flat, sizes, [l + b for l, b in zip(lo, bits)]) * w[:, None]
    return cast(Array, out)  # 2**nsp terms were added


@register("grid_sampler_3d.default")
def _grid_sampler_3d(
    input: Array, grid: Array, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Array:
    return _grid_sample(input, grid, interpolation_mode, padding_mode, align_corners)


def _cubic_coeffs_grad(t: Array) -> list[Array]:
    """d coeff / d t of ``_cubic_coeffs``, in the 2-d CPU kernel's (negated) form."""
    a = -0.75
    x0, x1, x2, x3 = -1 - t, -t, 1 - t, 2 - t
    return [
        (-3 * a * x0 - 10 * a) * x0 - 8 * a,
        (-3 * (a + 2) * x1 - 2 * (a + 3)) * x1,
        (3 * (a + 2) * x2 - 2 * (a + 3)) * x2,
        (3 * a * x3 - 10 * a) * x3 + 8 * a,
    ]


def _grid_sampler_2d_grid_grad(
    grad_output: Array, input: Array, grid: Array, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Array:
    """Gradient w.r.t. the grid of ``grid_sampler_2d``, with the CPU kernel's formulas.

    The grid gradient is a sum over channels of differences of neighbouring
    pixels; its terms can be far larger than the result, so the jax.vjp of
    the forward (which sums per-corner products) lands 1e-4 away from
    torch's. The kernel's grouping is kept here: the per-channel term is
    ``((ne - nw) * s + (se - sw) * n) * gOut`` (bilinear), the channel sum
    comes first and the coordinate derivative (scale, clip, reflection sign)
    multiplies last.
    """
    x, go, g = upcast(input), upcast(grad_output), upcast(grid)
    if interpolation_mode == 1:
        return jnp.zeros_like(g)
    sizes = x.shape[2:]
    flat = x.reshape(x.shape[:2] + (-1,))
    coords = [g[..., 1], g[..., 0]]  # (y, x): outermost first
    # The coordinate's derivative: its value and jvp of the padded, unnormalised location.
    locs, mults = [], []
    for cd, sz in zip(coords, sizes):
        if interpolation_mode == 2:  # bicubic pads each tap, not the location
            fn = lambda c, sz=sz: _gs_unnormalize(c, sz, align_corners, 2)
        else:
            fn = lambda c, sz=sz: _gs_pad(
                _gs_unnormalize(c, sz, align_corners, 2),
                sz,
                padding_mode,
                align_corners,
                2,
            )
        loc, mult = jax.jvp(fn, (cd,), (jnp.ones_like(cd),))
        locs.append(loc)
        mults.append(mult)
    (y, x_), (gy_mult, gx_mult) = locs, mults
    y_n, x_w = jnp.floor(y), jnp.floor(x_)
    if interpolation_mode == 0:
        w = x_ - x_w
        e = 1 - w
        n = y - y_n
        s = 1 - n
        nw = _gs_gather(flat, sizes, [y_n, x_w])
        ne = _gs_gather(flat, sizes, [y_n, x_w + 1])
        sw = _gs_gather(flat, sizes, [y_n + 1, x_w])
        se = _gs_gather(flat, sizes, [y_n + 1, x_w + 1])
        gx = jnp.sum(((ne - nw) * s[:, None] + (se - sw) * n[:, None]) * go, axis=1)
        gy = jnp.sum(((sw - nw) * e[:, None] + (se - ne) * w[:, None]) * go, axis=1)
    elif interpolation_mode == 2:
        tx, ty = x_ - x_w, y - y_n
        cx, cy = _cubic_coeffs(tx), _cubic_coeffs(ty)
        cxg, cyg = _cubic_coeffs_grad(tx), _cubic_coeffs_grad(ty)
        taps = [
            [
                _gs_gather(
                    flat,
                    sizes,
                    [
                        _gs_pad(y_n - 1 + j, sizes[0], padding_mode, align_corners, 2),
                        _gs_pad(x_w - 1 + i, sizes[1], padding_mode, align_corners, 2),
                    ],
                )
                for j in range(4)
            ]
            for i in range(4)
        ]
        vals = jnp.stack([jnp.stack(row) for row in taps])  # (4, 4, N, C, ...)
        vals = jnp.moveaxis(vals * go, 3, 0)  # (C, 4, 4, N, ...): channel-major, as the kernel loops

        def step(carry: tuple[Array, Array], v: Array) -> tuple[tuple[Array, Array], None]:
            # 16 terms per channel in the kernel's (i, j) order: the sum is
            # a long cancellation, so its order is kept.
            gx, gy = carry
            for i in range(4):
                for j in range(4):
                    gx = gx - v[i, j] * cxg[i] * cy[j]
                    gy = gy - v[i, j] * cyg[j] * cx[i]
            return (gx, gy), None

        zero = jnp.zeros_like(tx)
        (gx, gy), _ = lax.scan(step, (zero, zero), vals)
    else:
        raise ValueError(f"grid_sample: unknown interpolation mode {interpolation_mode}")
    return jnp.stack([gx * gx_mult, gy * gy_mult], axis=-1)


@register("grid_sampler_2d_backward.default", "grid_sampler_3d_backward.default")
def _grid_sampler_backward(
    grad_output: Array,
    input: Array,
    grid: Array,
    interpolation_mode: int,
    padding_mode: int,
    align_corners: bool,
    output_mask: Sequence[bool],
) -> tuple[Array | None, Array]:
    """Input gradient: jax.vjp of the forward. Grid gradient: the 2-d kernel's own
    arrangement (see ``_grid_sampler_2d_grid_grad``); for 3-d the vjp too, which
    is as accurate as torch's kernel but not bit-close on large, cancelling sums."""
    f = lambda x, g: _grid_sample(x, g, interpolation_mode, padding_mode, align_corners)
    gi, gg = jax.vjp(f, upcast(input), upcast(grid))[1](upcast(grad_output))
    if input.ndim == 4:
        gg = _grid_sampler_2d_grid_grad(grad_output, input, grid, interpolation_mode, padding_mode, align_corners)
    return (gi if output_mask[0] else None), gg


# ---------------------------------------------------------------------------
# im2col / col2im


def _im2col(
    self: Array,
    kernel_size: int | Sequence[int],
    dilation: int | Sequence[int],
    padding: int | Sequence[int],
    stride: int | Sequence[int],
) -> Array:
    k, d, p, s = (_tuple(v, 2) for v in (kernel_size, dilation, padding, stride))
    unbatched = self.ndim == 3
    x = self[None] if unbatched else self
    n, c = x.shape[:2]
    xp = jnp.pad(x, ((0, 0), (0, 0), (p[0], p[0]), (p[1], p[1])))
    out = tuple((xp.shape[2 + i] - (d[i] * (k[i] - 1) + 1)) // s[i] + 1 for i in range(2))
    win, _ = _windows(xp, k, s, d, out, 2)  # (K, N, C, oh, ow)
    cols = jnp.moveaxis(win, 0, 2).reshape(n, c * k[0] * k[1], out[0] * out[1])
    return cols[0] if unbatched else cols


@register("im2col.default")
def _im2col_op(
    self: Array, kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int], stride: Sequence[int]
) -> Array:
    return _im2col(self, kernel_size, dilation, padding, stride)


@register("col2im.default")
def _col2im(
    self: Array,
    output_size: Sequence[int],
    kernel_size: Sequence[int],
    dilation: Sequence[int],
    padding: Sequence[int],
    stride: Sequence[int],
) -> Array:
    # col2im is the adjoint (transpose) of im2col: sum overlapping patches.
    unbatched = self.ndim == 2
    cols = self[None] if unbatched else self
    k = _tuple(kernel_size, 2)
    c = cols.shape[1] // (k[0] * k[1])
    x0 = jnp.zeros((cols.shape[0], c) + tuple(output_size), upcast(cols).dtype)
    f = lambda x: _im2col(x, kernel_size, dilation, padding, stride)
    out = jax.vjp(f, x0)[1](upcast(cols))[0]
    # jax types a pullback's result Any.
    res: Array = out[0] if unbatched else out
    return res
