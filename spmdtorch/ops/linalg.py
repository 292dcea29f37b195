"""Matrix products: mm, addmm, bmm, baddbmm, dot, mv, addmv, addbmm, ...

Float products accumulate in float32 (``preferred_element_type``) so bf16
matmuls match torch's fp32-accumulating kernels. ``MATMUL_PRECISION`` is
passed as ``precision=`` to every product: None follows JAX's configured
default (``jax_default_matmul_precision``), which on TPU (bf16 passes) and on
Ampere+ GPUs (TF32) is *less* precise than torch's default float32 matmul;
set it to ``jax.lax.Precision.HIGHEST`` for bit-closer results.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from spmdtorch.ops._util import is_float
from spmdtorch.ops.registry import register

MATMUL_PRECISION = None


def matmul(a, b):
    """``jnp.matmul`` with float32 accumulation for low-precision floats."""
    pet = None
    if is_float(a) and not jnp.iscomplexobj(a) and not jnp.iscomplexobj(b):
        pet = jnp.float32
    elif a.dtype == jnp.bool_ or b.dtype == jnp.bool_:
        a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    return jnp.matmul(a, b, precision=MATMUL_PRECISION, preferred_element_type=pet)


def _scaled_sum(self, prod, beta, alpha):
    """``beta * self + alpha * prod`` where ``beta == 0`` ignores ``self``.

    torch does not propagate NaN/inf from ``self`` when beta is 0; ``beta``
    may be a traced scalar so this is a ``where``, not a Python branch.
    """
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        prod = prod * alpha
    if isinstance(beta, (int, float)):
        if beta == 0:
            return prod + jnp.zeros_like(self, dtype=prod.dtype)
        if beta == 1:
            return self.astype(prod.dtype) + prod
        return beta * self.astype(prod.dtype) + prod
    term = jnp.where(beta == 0, jnp.zeros((), prod.dtype), beta * self.astype(prod.dtype))
    return term + prod


@register("mm.default")
def _mm(self, mat2):
    return matmul(self, mat2)


@register("bmm.default")
def _bmm(self, mat2):
    return matmul(self, mat2)


@register("matmul.default")
def _matmul(self, other):
    return matmul(self, other)


@register("dot.default", "vdot.default", "inner.default")
def _dot(self, tensor):
    return matmul(self, tensor)


@register("mv.default")
def _mv(self, vec):
    return matmul(self, vec)


@register("outer.default", "ger.default")
def _outer(self, vec2):
    return self[:, None] * vec2[None, :]


@register("addmm.default")
def _addmm(self, mat1, mat2, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat1, mat2), beta, alpha)


@register("_addmm_activation.default")
def _addmm_activation(self, mat1, mat2, *, beta=1, alpha=1, use_gelu=False):
    import jax

    out = _addmm(self, mat1, mat2, beta=beta, alpha=alpha)
    return jax.nn.gelu(out, approximate=True) if use_gelu else jnp.maximum(out, 0)


@register("addmv.default")
def _addmv(self, mat, vec, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(mat, vec), beta, alpha)


@register("baddbmm.default")
def _baddbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(self, matmul(batch1, batch2), beta, alpha)


@register("addbmm.default")
def _addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    return _scaled_sum(self, jnp.sum(matmul(batch1, batch2), axis=0), beta, alpha)


@register("addr.default")
def _addr(self, vec1, vec2, *, beta=1, alpha=1):
    return _scaled_sum(self, vec1[:, None] * vec2[None, :], beta, alpha)


# ``p`` picks the formula (0, 1, 2, inf are special), so it stays a Python
# number: a lifted 0-d array would always take the generic ``**p`` path.
@register("_cdist_forward.default", lift_scalars=False)
def _cdist_forward(x1, x2, p, compute_mode=None):
    x1f, x2f = x1.astype(jnp.float32), x2.astype(jnp.float32)
    if isinstance(p, (int, float)) and p == 2:
        # The matmul form (compute_mode 0/1 with many rows) is what torch uses
        # for speed; the direct difference is exact and fine for XLA too.
        d = x1f[..., :, None, :] - x2f[..., None, :, :]
        return jnp.sqrt(jnp.sum(d * d, axis=-1))
    d = jnp.abs(x1f[..., :, None, :] - x2f[..., None, :, :])
    if isinstance(p, (int, float)):
        if p == 0:
            return jnp.sum((d != 0).astype(d.dtype), axis=-1)
        if p == float("inf"):
            return jnp.max(d, axis=-1)
        if p == 1:
            return jnp.sum(d, axis=-1)
    return jnp.sum(d**p, axis=-1) ** (1.0 / p)


@register("_pdist_forward.default", lift_scalars=False)
def _pdist_forward(self, p=2.0):
    import numpy as np

    n = self.shape[0]
    i, j = np.triu_indices(n, k=1)
    full = _cdist_forward(self, self, p)
    return full[i, j]


@register("tril.default")
def _tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@register("triu.default")
def _triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@register("trace.default")
def _trace(self):
    return jnp.trace(self, dtype=jnp.int32 if not is_float(self) else None)


@register("linalg_cross.default")
def _cross(self, other, *, dim=-1):
    return jnp.cross(self, other, axis=dim)


@register("_linalg_det.default")
def _linalg_det(A):

    lu, piv, perm = lax.linalg.lu(A)
    det = jnp.linalg.det(A)
    return det, lu, piv.astype(jnp.int32) + 1


@register("linalg_solve_triangular.default")
def _solve_triangular(self, B, *, upper, left=True, unitriangular=False):
    return lax.linalg.triangular_solve(
        self, B, left_side=left, lower=not upper, unit_diagonal=unitriangular, transpose_a=False
    )


@register("cholesky.default")
def _cholesky(self, upper=False):
    L = jnp.linalg.cholesky(self)
    return jnp.swapaxes(L, -1, -2).conj() if upper else L
