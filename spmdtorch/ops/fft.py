"""FFT primitives (``_fft_r2c``, ``_fft_c2r``, ``_fft_c2c``).

``normalization`` is ATen's fft_norm_mode: 0 none, 1 by 1/sqrt(n), 2 by 1/n,
applied to whichever direction the op computes; JAX's ``norm=`` names say
which direction is scaled, hence the two maps.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax.numpy as jnp

from spmdtorch.ops._util import Array, canon_dims
from spmdtorch.ops.registry import register

_FWD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INV_NORM = {0: "forward", 1: "ortho", 2: "backward"}


@register("_fft_r2c.default")
def _fft_r2c(self: Array, dim: Sequence[int], normalization: int, onesided: bool) -> Array:
    axes = canon_dims(dim, self.ndim)
    x = self.astype(jnp.float32)
    if onesided:
        return jnp.fft.rfftn(x, axes=axes, norm=_FWD_NORM[normalization])
    return jnp.fft.fftn(x, axes=axes, norm=_FWD_NORM[normalization])


@register("_fft_c2r.default")
def _fft_c2r(self: Array, dim: Sequence[int], normalization: int, last_dim_size: int) -> Array:
    axes = canon_dims(dim, self.ndim)
    s = [self.shape[a] for a in axes[:-1]] + [last_dim_size]
    return jnp.fft.irfftn(self, s=s, axes=axes, norm=_INV_NORM[normalization])


@register("_fft_c2c.default")
def _fft_c2c(self: Array, dim: Sequence[int], normalization: int, forward: bool) -> Array:
    axes = canon_dims(dim, self.ndim)
    if forward:
        return jnp.fft.fftn(self, axes=axes, norm=_FWD_NORM[normalization])
    return jnp.fft.ifftn(self, axes=axes, norm=_INV_NORM[normalization])
