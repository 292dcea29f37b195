"""Histograms with a fixed number of bins: ``histc``.

``histc``'s output shape is ``(bins,)`` whatever the data, so it lowers to
one scatter-add on the device (no CPU trip), for floating and integer inputs
alike: Hugging Face's grouped-matmul MoE path counts the tokens per expert
with ``torch.histc`` on integer expert ids off CPU, as CUDA allows.
(``bincount``, whose length depends on the data, is a special op in
``spmdtorch.tensor.dispatch``.)
"""

from __future__ import annotations

import jax.numpy as jnp

from spmdtorch.ops._util import Array, Number, is_int
from spmdtorch.ops.registry import register

__all__ = ["histc"]


def _range(x: Array, lo: Number, hi: Number) -> tuple[Array, Array]:
    """torch's ``[lo, hi]``: the data's extrema when ``lo == hi``, widened by 1 if still empty."""
    if lo == hi:
        if x.size == 0:
            lo_a, hi_a = jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)
        else:
            lo_a, hi_a = jnp.min(x), jnp.max(x)
        empty = lo_a == hi_a
        return jnp.where(empty, lo_a - 1, lo_a), jnp.where(empty, hi_a + 1, hi_a)
    return jnp.asarray(lo, x.dtype), jnp.asarray(hi, x.dtype)


@register("histc.default", lift_scalars=False)
def histc(self: Array, bins: int = 100, min: Number = 0, max: Number = 0) -> Array:
    """Counts of ``self`` in ``bins`` equal bins over ``[min, max]`` (dtype of ``self``).

    The bin of ``x`` is ``trunc((x - min) * bins / (max - min))``, with
    ``x == max`` in the last bin and values outside ``[min, max]`` (and NaN)
    not counted: in the input's floating type, in that order, as torch's CPU
    kernel computes it, and in integer arithmetic for integer inputs, as its
    CUDA kernel does. ``min == max`` takes the data's extrema. Unlike eager,
    non-finite data extrema are not reported as an error (that needs the data
    on the host).

    Example:
        >>> import numpy as np
        >>> histc(jnp.array([0, 1, 1, 3], jnp.int32), bins=4, min=0, max=3).tolist()
        [1, 2, 0, 1]
    """
    if not isinstance(bins, int) or bins <= 0:
        raise ValueError(f"torch.histc: bins must be > 0, but got {bins}")
    if min > max:
        raise ValueError(f"torch.histc: max must be larger than min (min={min}, max={max})")
    x = self.reshape(-1)
    lo, hi = _range(x, min, max)
    if is_int(x):
        xi, loi, hii = (v.astype(jnp.int32) for v in (x, lo, hi))
        pos = (xi - loi) * bins // (hii - loi)
    else:
        pos = jnp.trunc((x - lo) * jnp.asarray(bins, x.dtype) / (hi - lo)).astype(jnp.int32)
    pos = jnp.where(pos == bins, bins - 1, pos)
    inside = (x >= lo) & (x <= hi)
    pos = jnp.where(inside, pos, bins)  # out of range: dropped by the scatter below
    counts = jnp.zeros((bins,), jnp.int32).at[pos].add(1, mode="drop")
    return counts.astype(self.dtype)
