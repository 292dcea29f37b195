"""Convolution, pooling, upsampling and adaptive pooling (N-d, NC* layout).

Backward ops whose arguments fully determine the forward are ``jax.vjp`` of
the forward lowering; ``max_pool*_with_indices_backward`` scatters into the
saved indices, which is exact (and matches torch's tie-breaking).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spmdtorch.ops import linalg
from spmdtorch.ops._util import is_float, upcast
from spmdtorch.ops.registry import register


def _tuple(v, n):
    if isinstance(v, int):
        return (v,) * n
    v = tuple(v)
    if len(v) == 1:
        return v * n
    return v


# ---------------------------------------------------------------------------
# Convolution


def _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    nsp = weight.ndim - 2
    unbatched = input.ndim == nsp + 1
    x = input[None] if unbatched else input
    stride, padding, dilation = _tuple(stride, nsp), _tuple(padding, nsp), _tuple(dilation, nsp)
    output_padding = _tuple(output_padding, nsp) if output_padding else (0,) * nsp
    pet = jnp.float32 if is_float(x) else None
    if not transposed:
        out = lax.conv_general_dilated(
            x, weight, window_strides=stride, padding=[(p, p) for p in padding],
            rhs_dilation=dilation, feature_group_count=groups,
            dimension_numbers=_dn(nsp), precision=linalg.MATMUL_PRECISION,
            preferred_element_type=pet)
    else:
        # Transposed conv = conv of the stride-dilated input with the flipped
        # kernel, in/out channels swapped per group.
        cin, cout_g = weight.shape[0], weight.shape[1]
        k = weight.shape[2:]
        w = weight.reshape((groups, cin // groups, cout_g) + k)
        w = jnp.swapaxes(w, 1, 2).reshape((groups * cout_g, cin // groups) + k)
        w = jnp.flip(w, axis=tuple(range(2, 2 + nsp)))
        pads = [
            (d * (kk - 1) - p, d * (kk - 1) - p + op)
            for kk, d, p, op in zip(k, dilation, padding, output_padding)
        ]
        out = lax.conv_general_dilated(
            x, w, window_strides=(1,) * nsp, padding=pads, lhs_dilation=stride,
            rhs_dilation=dilation, feature_group_count=groups, dimension_numbers=_dn(nsp),
            precision=linalg.MATMUL_PRECISION, preferred_element_type=pet)
    if bias is not None:
        out = out + bias.astype(out.dtype).reshape((1, -1) + (1,) * nsp)
    return out[0] if unbatched else out


def _dn(nsp):
    sp = "DHW"[-nsp:] if nsp <= 3 else None
    return ("NC" + sp, "OI" + sp, "NC" + sp)


@register("convolution.default", "_convolution.default", "_convolution.deprecated")
def _convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups, *unused):
    # ``_convolution`` adds benchmark/deterministic/cudnn/tf32 flags: ignored.
    return _conv(input, weight, bias, stride, padding, dilation, transposed, output_padding,
                 groups)


@register("convolution_backward.default")
def _convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
                          transposed, output_padding, groups, output_mask):
    f = lambda x, w: _conv(x, w, None, stride, padding, dilation, transposed,  # noqa: E731
                           output_padding, groups)
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


def _pool_out_size(n, k, s, p, d, ceil_mode):
    eff = d * (k - 1) + 1
    num = n + 2 * p - eff
    out = (-(-num // s) if ceil_mode else num // s) + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1  # the last window must start inside the input or left pad
    return max(out, 0)


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode, nsp):
    k = _tuple(kernel_size, nsp)
    s = _tuple(stride, nsp) if stride else k
    p = _tuple(padding, nsp)
    d = _tuple(dilation, nsp)
    sp = x.shape[-nsp:]
    out = tuple(_pool_out_size(n, kk, ss, pp, dd, ceil_mode)
                for n, kk, ss, pp, dd in zip(sp, k, s, p, d))
    # Right padding so that every window of the output fits.
    hi = tuple(max(0, (o - 1) * ss + dd * (kk - 1) + 1 - n - pp)
               for o, ss, dd, kk, n, pp in zip(out, s, d, k, sp, p))
    return k, s, p, d, out, hi


def _windows(xp, k, s, d, out, nsp):
    """Stack of strided slices, one per kernel offset: shape (K, ..., *out)."""
    lead = xp.ndim - nsp
    slices = []
    for offs in np.ndindex(*k):
        start = (0,) * lead + tuple(o * dd for o, dd in zip(offs, d))
        limit = tuple(xp.shape[:lead]) + tuple(
            o * dd + (n - 1) * ss + 1 for o, dd, n, ss in zip(offs, d, out, s))
        slices.append(lax.slice(xp, start, limit, (1,) * lead + tuple(s)))
    return jnp.stack(slices), list(np.ndindex(*k))


def _max_pool_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode, nsp):
    k, s, p, d, out, hi = _pool_geometry(self, kernel_size, stride, padding, dilation,
                                         ceil_mode, nsp)
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
    flat = []
    for offs in offsets:
        coords = [np.arange(o) * ss - pp + off * dd
                  for o, ss, pp, off, dd in zip(out, s, p, offs, d)]
        grid = np.meshgrid(*coords, indexing="ij")
        flat.append(np.ravel_multi_index(grid, sp, mode="clip"))
    flat = jnp.asarray(np.stack(flat).astype(np.int32))  # (K, *out)
    # NaN counts as the maximum, as in torch's kernel.
    key = jnp.where(jnp.isnan(win), jnp.inf, win) if is_float(win) else win
    arg = jnp.argmax(key, axis=0)
    vals = jnp.take_along_axis(win, arg[None], axis=0)[0]
    idx = jnp.take_along_axis(
        jnp.broadcast_to(flat.reshape((flat.shape[0],) + (1,) * lead + tuple(out)), win.shape),
        arg[None], axis=0)[0]
    return vals, idx


def _max_pool_backward(grad_output, self, indices, nsp):
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

    def _mp(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, _n=_n):
        return _max_pool_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode, _n)

    def _mpb(grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices,
             _n=_n):
        return _max_pool_backward(grad_output, self, indices, _n)

    register(f"max_pool{_n}d_with_indices.default")(_mp)
    register(f"max_pool{_n}d_with_indices_backward.default")(_mpb)


@register("max_pool2d.default", "max_pool1d.default", "max_pool3d.default")
def _max_pool(self, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    nsp = len(_tuple(kernel_size, 1)) if not isinstance(kernel_size, int) else 1
    return _max_pool_with_indices(self, kernel_size, stride, padding, dilation, ceil_mode, nsp)[0]


def _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              nsp):
    k, s, p, d, out, hi = _pool_geometry(self, kernel_size, stride, padding, 1, ceil_mode, nsp)
    lead = self.ndim - nsp
    x = upcast(self)
    cfg = [(0, 0, 0)] * lead + [(pp, h, 0) for pp, h in zip(p, hi)]
    xp = lax.pad(x, jnp.zeros((), x.dtype), cfg)
    win_dims = (1,) * lead + k
    win_strides = (1,) * lead + s
    total = lax.reduce_window(xp, 0.0, lax.add, win_dims, win_strides, "VALID")
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
            m[pp: pp + n] = 1
        masks.append(m)
    mask = masks[0]
    for m in masks[1:]:
        mask = np.multiply.outer(mask, m)
    cnt = lax.reduce_window(jnp.asarray(mask), 0.0, lax.add, k, s, "VALID")
    return total / cnt


for _n in (1, 2, 3):

    def _ap(self, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
            divisor_override=None, _n=_n):
        return _avg_pool(self, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override, _n)

    def _apb(grad_output, self, kernel_size, stride, padding, ceil_mode, count_include_pad,
             divisor_override=None, _n=_n):
        f = lambda x: _avg_pool(x, kernel_size, stride, padding, ceil_mode,  # noqa: E731
                                count_include_pad, divisor_override, _n)
        return jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]

    register(f"avg_pool{_n}d.default")(_ap)
    register(f"avg_pool{_n}d_backward.default")(_apb)


# ---------------------------------------------------------------------------
# Adaptive pooling


def _adaptive_matrix(n_in, n_out):
    """(n_out, n_in) averaging matrix with torch's window bounds
    ``[floor(i*n/o), ceil((i+1)*n/o))``."""
    m = np.zeros((n_out, n_in), np.float32)
    for i in range(n_out):
        a = (i * n_in) // n_out
        b = -(-((i + 1) * n_in) // n_out)
        m[i, a:b] = 1.0 / (b - a)
    return m


def _adaptive_avg(self, output_size, nsp):
    x = upcast(self)
    out_sz = _tuple(output_size, nsp)
    for i, o in enumerate(out_sz):
        ax = x.ndim - nsp + i
        m = jnp.asarray(_adaptive_matrix(x.shape[ax], o))
        x = jnp.moveaxis(jnp.tensordot(x, m, axes=([ax], [1]),
                                       precision=lax.Precision.HIGHEST), -1, ax)
    return x


for _n in (1, 2, 3):

    def _aap(self, output_size, _n=_n):
        return _adaptive_avg(self, output_size, _n)

    def _aapb(grad_output, self, _n=_n):
        out_size = grad_output.shape[-_n:]
        f = lambda x: _adaptive_avg(x, out_size, _n)  # noqa: E731
        return jax.vjp(f, upcast(self))[1](upcast(grad_output))[0]

    register(f"_adaptive_avg_pool{_n}d.default", f"adaptive_avg_pool{_n}d.default")(_aap)
    register(f"_adaptive_avg_pool{_n}d_backward.default")(_aapb)


def _adaptive_max(self, output_size, nsp):
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

    def _amp(self, output_size, _n=_n):
        return _adaptive_max(self, output_size, _n)

    def _ampb(grad_output, self, indices, _n=_n):
        return _max_pool_backward(grad_output, self, indices, _n)

    register(f"adaptive_max_pool{_n}d.default")(_amp)
    register(f"adaptive_max_pool{_n}d_backward.default")(_ampb)


# ---------------------------------------------------------------------------
# Upsampling


def _out_and_scales(in_sp, output_size, scale_factors):
    """(output sizes, per-dim scale (in/out) or user scale) for .vec overloads."""
    if output_size is not None:
        return tuple(output_size), [None] * len(in_sp)
    out = tuple(int(math.floor(n * f)) for n, f in zip(in_sp, scale_factors))
    return out, list(scale_factors)


def _src_scale(n_in, n_out, scale, align_corners=False):
    if align_corners:
        return (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
    if scale is not None and scale > 0:
        return 1.0 / scale
    return n_in / n_out


def _nearest(x, out_sz, scales, exact=False):
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


def _linear(x, out_sz, align_corners, scales, cubic=False):
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


def _register_upsample(nsp, name, fwd):
    """Register ``name`` (.default and .vec) and its backward for ``fwd``."""

    def vec(input, output_size, *rest):
        *ac, scale_factors = rest
        out, scales = _out_and_scales(input.shape[-nsp:], output_size, scale_factors)
        return fwd(input, out, scales, *ac)

    def default(self, output_size, *rest):
        ac = list(rest[:1]) if "linear" in name or "bicubic" in name else []
        scales = list(rest[len(ac):]) + [None] * nsp
        return fwd(self, tuple(output_size), scales[:nsp], *ac)

    def backward(grad_output, output_size, input_size, *rest):
        ac = list(rest[:1]) if "linear" in name or "bicubic" in name else []
        scales = list(rest[len(ac):]) + [None] * nsp
        x0 = jnp.zeros(tuple(input_size), jnp.float32)
        f = lambda x: fwd(x, tuple(output_size), scales[:nsp], *ac)  # noqa: E731
        return jax.vjp(f, x0)[1](upcast(grad_output))[0]

    # The scales build static (numpy) index tables, so they stay Python numbers.
    register(f"{name}.vec", lift_scalars=False)(vec)
    register(f"{name}.default", lift_scalars=False)(default)
    register(f"{name}_backward.default", lift_scalars=False)(backward)


for _nsp, _suffix in ((1, "1d"), (2, "2d"), (3, "3d")):
    _register_upsample(_nsp, f"upsample_nearest{_suffix}",
                       lambda x, o, s: _nearest(x, o, s))
    _register_upsample(_nsp, f"_upsample_nearest_exact{_suffix}",
                       lambda x, o, s: _nearest(x, o, s, exact=True))
_register_upsample(1, "upsample_linear1d", lambda x, o, s, ac: _linear(x, o, ac, s))
_register_upsample(2, "upsample_bilinear2d", lambda x, o, s, ac: _linear(x, o, ac, s))
_register_upsample(3, "upsample_trilinear3d", lambda x, o, s, ac: _linear(x, o, ac, s))


# ---------------------------------------------------------------------------
# im2col / col2im


def _im2col(self, kernel_size, dilation, padding, stride):
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
def _im2col_op(self, kernel_size, dilation, padding, stride):
    return _im2col(self, kernel_size, dilation, padding, stride)


@register("col2im.default")
def _col2im(self, output_size, kernel_size, dilation, padding, stride):
    # col2im is the adjoint (transpose) of im2col: sum overlapping patches.
    unbatched = self.ndim == 2
    cols = self[None] if unbatched else self
    k = _tuple(kernel_size, 2)
    c = cols.shape[1] // (k[0] * k[1])
    x0 = jnp.zeros((cols.shape[0], c) + tuple(output_size), upcast(cols).dtype)
    f = lambda x: _im2col(x, kernel_size, dilation, padding, stride)  # noqa: E731
    out = jax.vjp(f, x0)[1](upcast(cols))[0]
    return out[0] if unbatched else out
