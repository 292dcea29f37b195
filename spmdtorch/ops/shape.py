"""Shape-changing copies: cat, stack, flip, roll, repeat, padding.

(Pure views live in ``views.py``; these ops produce new tensors.)
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spmdtorch.ops._util import Array, Scalar, canon_dim
from spmdtorch.ops.registry import register


@register("cat.default")
def _cat(tensors: Sequence[Array], dim: int = 0) -> Array:
    # torch skips legacy 1-d empty tensors (shape (0,)) when concatenating
    # higher-rank tensors.
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not ts:
        return tensors[0]
    nd = ts[0].ndim
    dt = jnp.result_type(*ts)
    return jnp.concatenate([t.astype(dt) for t in ts], axis=canon_dim(dim, nd))


@register("stack.default")
def _stack(tensors: Sequence[Array], dim: int = 0) -> Array:
    dt = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dt) for t in tensors], axis=canon_dim(dim, tensors[0].ndim + 1))


@register("flip.default")
def _flip(self: Array, dims: Sequence[int]) -> Array:
    if self.ndim == 0:
        return self
    return jnp.flip(self, [canon_dim(d, self.ndim) for d in dims])


@register("roll.default")
def _roll(self: Array, shifts: Sequence[int], dims: Sequence[int] = ()) -> Array:
    if len(dims) == 0:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), tuple(canon_dim(d, self.ndim) for d in dims))


@register("rot90.default")
def _rot90(self: Array, k: int = 1, dims: Sequence[int] = (0, 1)) -> Array:
    d0, d1 = dims  # torch checks there are exactly two
    return jnp.rot90(self, k, axes=(canon_dim(d0, self.ndim), canon_dim(d1, self.ndim)))


@register("repeat.default")
def _repeat(self: Array, repeats: Sequence[int]) -> Array:
    # torch's repeat is numpy's tile with leading dims added to ``self``.
    x = jnp.reshape(self, (1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


@register("repeat_interleave.self_int")
def _repeat_interleave_int(
    self: Array, repeats: int, dim: int | None = None, *, output_size: int | None = None
) -> Array:
    if dim is None:
        return jnp.repeat(self.reshape(-1), repeats)
    return jnp.repeat(self, repeats, axis=canon_dim(dim, self.ndim))


@register("repeat_interleave.Tensor")
def _repeat_interleave_tensor(repeats: Array, *, output_size: int | None = None) -> Array:
    # Data-dependent length: needs concrete repeats or output_size.
    n = repeats.shape[0]
    return jnp.repeat(jnp.arange(n, dtype=jnp.int32), repeats, total_repeat_length=output_size)


def _pad_config(ndim: int, pad: Sequence[int]) -> list[tuple[int, int, int]]:
    """ATen pad list (last dim first, (lo, hi) pairs) -> lax.pad config."""
    cfg = [(0, 0, 0)] * ndim
    for i in range(len(pad) // 2):
        d = ndim - 1 - i
        cfg[d] = (pad[2 * i], pad[2 * i + 1], 0)
    return cfg


@register("constant_pad_nd.default")
def _constant_pad_nd(self: Array, pad: Sequence[int], value: Scalar = 0) -> Array:
    # lax.pad takes negative widths, which crop (torch allows that too).
    v = jnp.asarray(value).astype(self.dtype)
    return lax.pad(self, v, _pad_config(self.ndim, pad))


def _np_pad(self: Array, padding: Sequence[int], mode: str) -> Array:
    """reflect / edge (replicate) / wrap (circular) padding as one gather per dim.

    Output position ``j`` of a dim of size ``n`` padded by ``(lo, hi)`` reads
    input ``j - lo`` mapped back into range; negative widths crop, as in torch.
    """
    out = self
    for d, (lo, hi, _) in enumerate(_pad_config(self.ndim, padding)):
        if lo == 0 and hi == 0:
            continue
        n = out.shape[d]
        k = np.arange(n + lo + hi) - lo
        if mode == "edge":
            src = np.clip(k, 0, n - 1)
        elif mode == "wrap":
            src = np.mod(k, n)
        else:  # reflect about the first and last element (no repeat)
            src = np.abs(k)
            src = np.where(src > n - 1, 2 * (n - 1) - src, src)
        out = jnp.take(out, jnp.asarray(src, jnp.int32), axis=d)
    return out


for _n in (1, 2, 3):

    def _reflect(self: Array, padding: Sequence[int]) -> Array:
        return _np_pad(self, padding, "reflect")

    def _replicate(self: Array, padding: Sequence[int]) -> Array:
        return _np_pad(self, padding, "edge")

    def _circular(self: Array, padding: Sequence[int]) -> Array:
        return _np_pad(self, padding, "wrap")

    def _reflect_bw(grad_output: Array, self: Array, padding: Sequence[int]) -> Array:
        # jax types a pullback's result Any.
        res: Array = jax.vjp(lambda x: _np_pad(x, padding, "reflect"), self)[1](grad_output)[0]
        return res

    def _replicate_bw(grad_output: Array, self: Array, padding: Sequence[int]) -> Array:
        # jax types a pullback's result Any.
        res: Array = jax.vjp(lambda x: _np_pad(x, padding, "edge"), self)[1](grad_output)[0]
        return res

    register(f"reflection_pad{_n}d.default")(_reflect)
    register(f"replication_pad{_n}d.default")(_replicate)
    register(f"reflection_pad{_n}d_backward.default")(_reflect_bw)
    register(f"replication_pad{_n}d_backward.default")(_replicate_bw)

register("_pad_circular.default")(_circular)


@register("_pad_enum.default")
def _pad_enum(self: Array, pad: Sequence[int], mode: int, value: Array | float | None = None) -> Array:
    # mode: 0 constant, 1 reflect, 2 replicate, 3 circular (at::padding_mode)
    if mode == 0:
        return _constant_pad_nd(self, pad, 0 if value is None else value)
    return _np_pad(self, pad, {1: "reflect", 2: "edge", 3: "wrap"}[mode])


@register("pad.default")
def _pad(self: Array, pad: Sequence[int], mode: str = "constant", value: Array | float | None = None) -> Array:
    if mode == "constant":
        return _constant_pad_nd(self, pad, 0 if value is None else value)
    return _np_pad(self, pad, {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode])


@register("tile.default")
def _tile(self: Array, dims: Sequence[int]) -> Array:
    return jnp.tile(self, tuple(dims))


@register("movedim.int")
def _movedim(self: Array, source: int, destination: int) -> Array:
    return jnp.moveaxis(self, source, destination)


@register("movedim.intlist")
def _movedim_list(self: Array, source: Sequence[int], destination: Sequence[int]) -> Array:
    return jnp.moveaxis(self, tuple(source), tuple(destination))
