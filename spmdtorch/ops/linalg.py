"""Matrix products (mm, addmm, bmm, baddbmm, dot, mv, ...) and torch.linalg factorizations.

Low-precision float products accumulate in float32, as torch's kernels do:
XLA's dots of bf16/f16 operands do on CPU, GPU (cuBLAS's float32 compute
type) and TPU (the MXU), and round once to the operands' dtype. So a plain
product (mm, bmm, matmul, ...) is one dot in the operands' dtype, the
program the same model written in JAX has (a float32 result converted back
doubled what such a dot writes and read it again, on an accelerator). The
products with an epilogue (addmm, baddbmm, addbmm, addmv) keep the float32
result until the addition, then round once, as torch's fused kernels.
``MATMUL_PRECISION`` is
passed as ``precision=`` to every product: None follows JAX's configured
default (``jax_default_matmul_precision``), which on TPU (bf16 passes) and on
Ampere+ GPUs (TF32) is *less* precise than torch's default float32 matmul;
set it to ``jax.lax.Precision.HIGHEST`` for bit-closer results.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import DTypeLike

from spmdtorch.ops._util import Array, Scalar, is_float
from spmdtorch.ops.registry import register

MATMUL_PRECISION = None


_F32: DTypeLike = jnp.float32  # jax types its scalar types Any


def _result_type(a: Scalar, b: Scalar, float32_result: bool) -> DTypeLike | None:
    """``preferred_element_type`` of a product: float32 for an epilogue's float operands, else their own."""
    if float32_result and is_float(a) and not jnp.iscomplexobj(a) and not jnp.iscomplexobj(b):
        return _F32
    return None


def matmul(a: Array, b: Array, *, float32_result: bool = False) -> Array:
    """``jnp.matmul``; ``float32_result``: a float32 product of float operands, to add to before rounding.

    Example:
        >>> import jax.numpy as jnp
        >>> a = jnp.ones((2, 3), jnp.bfloat16)
        >>> matmul(a, a.T).dtype, matmul(a, a.T, float32_result=True).dtype
        (dtype(bfloat16), dtype('float32'))
    """
    pet = _result_type(a, b, float32_result)
    if a.dtype == jnp.bool_ or b.dtype == jnp.bool_:
        a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    return jnp.matmul(a, b, precision=MATMUL_PRECISION, preferred_element_type=pet)


def matmul_transposed(a: Array, b: Array, *, ta: bool = False, tb: bool = False, float32_result: bool = False) -> Array:
    """``matmul(a.T if ta else a, b.T if tb else b)`` for 2-D ``a``, ``b``, with no transpose op.

    The graph rewrite (``spmdtorch.lazy.rewrite``) records ``mm(t(y), x)`` as
    ``matmul_transposed(y, x, ta=True)`` for a computed ``y``: a linear
    layer's backward ``g @ t(t(W))`` then reads the forward's ``t(W)`` itself,
    so the partitioner gathers a sharded weight once for both products, as
    for ``jax.grad`` of ``x @ W.T``.

    Example:
        >>> import jax.numpy as jnp
        >>> a, b = jnp.ones((3, 2)), jnp.ones((3, 4))
        >>> matmul_transposed(a, b, ta=True).shape
        (2, 4)
    """
    pet = _result_type(a, b, float32_result)
    if a.dtype == jnp.bool_ or b.dtype == jnp.bool_:
        a, b = a.astype(jnp.int32), b.astype(jnp.int32)
    if a.dtype != b.dtype:  # what jnp.matmul's promotion does
        dt = jnp.promote_types(a.dtype, b.dtype)
        a, b = a.astype(dt), b.astype(dt)
    dims = (((0 if ta else 1,), (1 if tb else 0,)), ((), ()))
    return lax.dot_general(a, b, dims, precision=MATMUL_PRECISION, preferred_element_type=pet)


def mm_transposed(self: Array, mat2: Array, *, ta: bool = False, tb: bool = False) -> Array:
    """``mm`` whose operands are read through a transpose (see ``matmul_transposed``)."""
    return matmul_transposed(self, mat2, ta=ta, tb=tb)


def addmm_transposed(
    self: Array, mat1: Array, mat2: Array, *, beta: Scalar = 1, alpha: Scalar = 1, ta: bool = False, tb: bool = False
) -> Array:
    """``addmm`` whose matrix operands are read through a transpose (see ``matmul_transposed``)."""
    return _scaled_sum(self, matmul_transposed(mat1, mat2, ta=ta, tb=tb, float32_result=True), beta, alpha)


def _scaled_sum(self: Array, prod: Array, beta: Scalar, alpha: Scalar) -> Array:
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
def _mm(self: Array, mat2: Array) -> Array:
    return matmul(self, mat2)


@register("bmm.default")
def _bmm(self: Array, mat2: Array) -> Array:
    return matmul(self, mat2)


@register("matmul.default")
def _matmul(self: Array, other: Array) -> Array:
    return matmul(self, other)


@register("dot.default", "vdot.default", "inner.default")
def _dot(self: Array, tensor: Array) -> Array:
    return matmul(self, tensor)


@register("mv.default")
def _mv(self: Array, vec: Array) -> Array:
    return matmul(self, vec)


@register("outer.default", "ger.default")
def _outer(self: Array, vec2: Array) -> Array:
    return self[:, None] * vec2[None, :]


@register("addmm.default")
def _addmm(self: Array, mat1: Array, mat2: Array, *, beta: Scalar = 1, alpha: Scalar = 1) -> Array:
    return _scaled_sum(self, matmul(mat1, mat2, float32_result=True), beta, alpha)


@register("_addmm_activation.default")
def _addmm_activation(
    self: Array, mat1: Array, mat2: Array, *, beta: Scalar = 1, alpha: Scalar = 1, use_gelu: bool = False
) -> Array:
    import jax

    out = _addmm(self, mat1, mat2, beta=beta, alpha=alpha)
    return jax.nn.gelu(out, approximate=True) if use_gelu else jnp.maximum(out, 0)


@register("addmv.default")
def _addmv(self: Array, mat: Array, vec: Array, *, beta: Scalar = 1, alpha: Scalar = 1) -> Array:
    return _scaled_sum(self, matmul(mat, vec, float32_result=True), beta, alpha)


@register("baddbmm.default")
def _baddbmm(self: Array, batch1: Array, batch2: Array, *, beta: Scalar = 1, alpha: Scalar = 1) -> Array:
    return _scaled_sum(self, matmul(batch1, batch2, float32_result=True), beta, alpha)


@register("addbmm.default")
def _addbmm(self: Array, batch1: Array, batch2: Array, *, beta: Scalar = 1, alpha: Scalar = 1) -> Array:
    return _scaled_sum(self, jnp.sum(matmul(batch1, batch2, float32_result=True), axis=0), beta, alpha)


@register("addr.default")
def _addr(self: Array, vec1: Array, vec2: Array, *, beta: Scalar = 1, alpha: Scalar = 1) -> Array:
    return _scaled_sum(self, vec1[:, None] * vec2[None, :], beta, alpha)


# ``p`` picks the formula (0, 1, 2, inf are special), so it stays a Python
# number: a lifted 0-d array would always take the generic ``**p`` path.
@register("_cdist_forward.default", lift_scalars=False)
def _cdist_forward(x1: Array, x2: Array, p: float, compute_mode: int | None = None) -> Array:
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
def _pdist_forward(self: Array, p: float = 2.0) -> Array:
    import numpy as np

    n = self.shape[0]
    i, j = np.triu_indices(n, k=1)
    full = _cdist_forward(self, self, p)
    return full[i, j]


def _dist_grad_terms(diff: Array, dist: Array, grad: Array, p: float) -> Array:
    """Per-pair gradient terms of a p-norm distance, as ATen's cdist/pdist backward kernels.

    Args:
        diff: ``x_i - x_j`` (..., c).
        dist: their distance, broadcast against ``diff`` (..., 1).
        grad: the incoming gradient of that distance (..., 1).
        p: the norm (a Python number).

    Returns:
        ``d dist / d x_i * grad`` with ATen's conventions: 0 where the
        distance is 0 (the norm is not differentiable there), and for
        ``p = inf`` the gradient flows to every coordinate that attains the max.
    """
    zero = jnp.zeros((), diff.dtype)
    if p == 0:
        return jnp.zeros_like(diff * grad)
    if p == 1:
        return jnp.sign(diff) * grad
    if p == float("inf"):
        return grad * jnp.sign(diff) * (jnp.abs(diff) == dist).astype(diff.dtype)
    safe = jnp.where(dist == 0, 1.0, dist)  # keeps the masked lanes finite (no NaN in where's other branch)
    if p == 2:
        return jnp.where(dist == 0, zero, grad * diff / safe)
    ad = jnp.abs(diff)
    if p < 2:
        dead = (dist == 0) | ((diff == 0) & (p < 1))
        term = jnp.sign(diff) * jnp.where(dead, 1.0, ad) ** (p - 1) * grad / safe ** (p - 1)
        return jnp.where(dead, zero, term)
    return jnp.where(dist == 0, zero, diff * ad ** (p - 2) * grad / safe ** (p - 1))


@register("_cdist_backward.default", lift_scalars=False)
def _cdist_backward(grad: Array, x1: Array, x2: Array, p: float, cdist: Array) -> Array:
    """Gradient of ``cdist`` w.r.t. ``x1`` (autograd calls it with the operands swapped for ``x2``).

    The result has the batch-broadcast shape of ``x1``; autograd reduces it
    to ``x1``'s own shape, as for torch's kernel.
    """
    batch = jnp.broadcast_shapes(x1.shape[:-2], x2.shape[:-2])
    if x1.size == 0 or x2.size == 0 or any(b == 0 for b in batch):
        # torch's kernel (and meta) return zeros of x1's own, unbroadcast shape here.
        return jnp.zeros(x1.shape, jnp.float32)
    x1 = jnp.broadcast_to(x1, batch + x1.shape[-2:]).astype(jnp.float32)
    x2 = jnp.broadcast_to(x2, batch + x2.shape[-2:]).astype(jnp.float32)
    diff = x1[..., :, None, :] - x2[..., None, :, :]
    terms = _dist_grad_terms(diff, cdist.astype(jnp.float32)[..., None], grad.astype(jnp.float32)[..., None], p)
    return jnp.sum(terms, axis=-2)


@register("_pdist_backward.default", lift_scalars=False)
def _pdist_backward(grad: Array, self: Array, p: float, pdist: Array) -> Array:
    """Gradient of ``pdist``: the cdist gradient of ``self`` against itself with the
    pair gradients placed symmetrically (each pair's term is odd in ``x_i - x_j``,
    so row j receives minus row i's)."""
    import numpy as np

    n = self.shape[0]
    i, j = np.triu_indices(n, k=1)
    g = jnp.zeros((n, n), jnp.float32).at[i, j].set(grad.astype(jnp.float32))
    d = jnp.zeros((n, n), jnp.float32).at[i, j].set(pdist.astype(jnp.float32))
    return _cdist_backward(g + g.T, self, self, p, d + d.T)


@register("tril.default")
def _tril(self: Array, diagonal: int = 0) -> Array:
    return jnp.tril(self, diagonal)


@register("triu.default")
def _triu(self: Array, diagonal: int = 0) -> Array:
    return jnp.triu(self, diagonal)


@register("trace.default")
def _trace(self: Array) -> Array:
    return jnp.trace(self, dtype=jnp.int32 if not is_float(self) else None)


@register("linalg_cross.default")
def _cross(self: Array, other: Array, *, dim: int = -1) -> Array:
    return jnp.cross(self, other, axis=dim)


def _det_lu(A: Array) -> tuple[Array, Array]:
    """The (LU, pivots) that torch's ``_linalg_det``/``_linalg_slogdet`` return.

    torch factors ``A^H`` rather than ``A`` when A is contiguous and real
    (LAPACK wants column-major input; det(A^T) = det(A)), and the backward
    solves with ``adjoint = not (A contiguous and real)`` accordingly. A
    lowering sees values only, so real inputs always take the A^T branch
    here; the dispatcher hands a non-contiguous real A over as the
    contiguous A^T (``spmdtorch.tensor.dispatch._special``), whose factors are
    those of A.
    """
    src = A if jnp.iscomplexobj(A) else _mT(A)
    lu, piv, _perm = lax.linalg.lu(src)
    return lu, piv.astype(jnp.int32) + 1


@register("_linalg_det.default")
def _linalg_det(A: Array) -> tuple[Array, Array, Array]:
    lu, piv = _det_lu(A)
    return jnp.linalg.det(A), lu, piv


@register("linalg_solve_triangular.default")
def _solve_triangular(self: Array, B: Array, *, upper: bool, left: bool = True, unitriangular: bool = False) -> Array:
    return lax.linalg.triangular_solve(
        self, B, left_side=left, lower=not upper, unit_diagonal=unitriangular, transpose_a=False
    )


@register("cholesky.default")
def _cholesky(self: Array, upper: bool = False) -> Array:
    L = jnp.linalg.cholesky(self)
    return jnp.swapaxes(L, -1, -2).conj() if upper else L


# -- factorizations and solvers (torch.linalg) ------------------------------------
#
# ``info`` outputs are computed from the results (0 where they are finite), as
# the device cannot raise from inside a program; ``check_errors=True`` callers
# reach ``_linalg_check_errors``, which the engine treats as PyTorch/XLA does
# (no host round trip per call: a singular input gives inf/nan, not an error).


def _info(*xs: Array) -> Array:
    """int32 ``info`` of shape batch: 0 where every value of ``xs`` (at least one) is finite, else 1."""
    oks = [jnp.all(jnp.isfinite(x), axis=(-2, -1)) if x.ndim >= 2 else jnp.all(jnp.isfinite(x), axis=-1) for x in xs]
    return jnp.where(functools.reduce(operator.and_, oks), 0, 1).astype(jnp.int32)


def _mT(x: Array) -> Array:
    return jnp.swapaxes(x, -1, -2)


@register("linalg_cholesky_ex.default")
def _cholesky_ex(self: Array, *, upper: bool = False, check_errors: bool = False) -> tuple[Array, Array]:
    L = jnp.linalg.cholesky(self)
    return (_mT(L).conj() if upper else L), _info(L)


@register("linalg_inv_ex.default")
def _inv_ex(A: Array, *, check_errors: bool = False) -> tuple[Array, Array]:
    inv = jnp.linalg.inv(A)
    return inv, _info(inv)


@register("_linalg_slogdet.default")
def _slogdet(A: Array) -> tuple[Array, Array, Array, Array]:
    lu, piv = _det_lu(A)
    sign, logabsdet = jnp.linalg.slogdet(A)
    return sign, logabsdet, lu, piv


@register("_linalg_eigh.default")
def _eigh(A: Array, UPLO: str = "L", compute_v: bool = True) -> tuple[Array, Array]:
    w, v = jnp.linalg.eigh(A, UPLO=UPLO, symmetrize_input=False)
    return w, (v if compute_v else jnp.zeros((0,), A.dtype))


@register("linalg_qr.default")
def _qr(A: Array, mode: str = "reduced") -> tuple[Array, Array]:
    if mode == "r":
        return jnp.zeros((0,), A.dtype), jnp.linalg.qr(A, mode="r")
    q, r = jnp.linalg.qr(A, mode="complete" if mode == "complete" else "reduced")
    return q, r


@register("_linalg_svd.default")
def _svd(
    A: Array, full_matrices: bool = False, compute_uv: bool = True, *, driver: str | None = None
) -> tuple[Array, Array, Array]:
    if not compute_uv:
        s = jnp.linalg.svd(A, compute_uv=False)
        return jnp.zeros((0,), A.dtype), s, jnp.zeros((0,), A.dtype)
    u, s, vh = jnp.linalg.svd(A, full_matrices=full_matrices)
    return u, s, vh


def _lu_factor(A: Array, pivot: bool = True) -> tuple[Array, Array, Array]:
    lu, piv, perm = lax.linalg.lu(A)
    return lu, piv.astype(jnp.int32) + 1, perm


@register("linalg_lu_factor_ex.default")
def _lu_factor_ex(A: Array, *, pivot: bool = True, check_errors: bool = False) -> tuple[Array, Array, Array]:
    lu, piv, _ = _lu_factor(A)
    k = min(A.shape[-2], A.shape[-1])
    return lu, piv[..., :k], _info(lu)


def _unpack(lu: Array, perm: Array, m: int, n: int) -> tuple[Array, Array, Array]:
    k = min(m, n)
    L = jnp.tril(lu[..., :, :k], -1) + jnp.eye(m, k, dtype=lu.dtype)
    U = jnp.triu(lu[..., :k, :])
    # lax.linalg.lu gives A[perm] == L @ U, i.e. P^T A = L U with rows of P^T
    # one-hot at perm; torch returns P with A = P L U.
    P = _mT(jax.nn.one_hot(perm, m, dtype=lu.dtype))
    return P, L, U


@register("linalg_lu.default")
def _lu(A: Array, *, pivot: bool = True) -> tuple[Array, Array, Array]:
    lu, _, perm = _lu_factor(A)
    m, n = A.shape[-2], A.shape[-1]
    return _unpack(lu, perm, m, n)


def _perm_from_pivots(piv: Array, m: int) -> Array:
    """LAPACK 1-based sequential row swaps → the permutation they make."""
    piv = piv.astype(jnp.int32) - 1
    batch = piv.shape[:-1]
    perm = jnp.broadcast_to(jnp.arange(m, dtype=jnp.int32), batch + (m,))

    def body(i: int | Array, perm: Array) -> Array:
        j = piv[..., i]
        pi = jnp.take_along_axis(perm, jnp.full(batch + (1,), i, jnp.int32), -1)[..., 0]
        pj = jnp.take_along_axis(perm, j[..., None], -1)[..., 0]
        idx = jnp.arange(m, dtype=jnp.int32)
        perm = jnp.where(idx == i, pj[..., None], perm)
        return jnp.where(idx == j[..., None], pi[..., None], perm)

    if piv.shape[-1] == 0:  # no swaps (fori_loop would still trace body's piv[..., i])
        return perm
    # lax.fori_loop is typed Any.
    res: Array = lax.fori_loop(0, piv.shape[-1], body, perm)
    return res


@register("lu_unpack.default")
def _lu_unpack(
    LU_data: Array, LU_pivots: Array, unpack_data: bool = True, unpack_pivots: bool = True
) -> tuple[Array, Array, Array]:
    m, n = LU_data.shape[-2], LU_data.shape[-1]
    perm = _perm_from_pivots(LU_pivots, m)
    P, L, U = _unpack(LU_data, perm, m, n)
    if not unpack_data:
        L = jnp.zeros((0,), LU_data.dtype)
        U = jnp.zeros((0,), LU_data.dtype)
    if not unpack_pivots:
        P = jnp.zeros((0,), LU_data.dtype)
    return P, L, U


@register("linalg_lu_solve.default")
def _lu_solve(LU: Array, pivots: Array, B: Array, *, left: bool = True, adjoint: bool = False) -> Array:
    m = LU.shape[-1]
    if LU.size == 0 or B.size == 0:
        return jnp.zeros(jnp.broadcast_shapes(LU.shape[:-2], B.shape[:-2]) + B.shape[-2:], B.dtype)
    perm = _perm_from_pivots(pivots, m)
    P, L, U = _unpack(LU, perm, m, m)
    A_fac = (P, L, U)
    if not left:
        # X A = B  <=>  A^H X^H = B^H
        X = _lu_solve_left(A_fac, _mT(B).conj(), not adjoint)
        return _mT(X).conj()
    return _lu_solve_left(A_fac, B, adjoint)


def _lu_solve_left(fac: tuple[Array, Array, Array], B: Array, adjoint: bool) -> Array:
    P, L, U = fac
    if not adjoint:  # A = P L U: X = U^-1 L^-1 P^T B
        y = jnp.matmul(_mT(P), B)
        y = lax.linalg.triangular_solve(L, y, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(U, y, left_side=True, lower=False)
    # A^H = U^H L^H P^T: X = P L^-H U^-H B
    y = lax.linalg.triangular_solve(U, B, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    y = lax.linalg.triangular_solve(
        L, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    return jnp.matmul(P, y)


@register("_linalg_solve_ex.default")
def _solve_ex(
    A: Array, B: Array, *, left: bool = True, check_errors: bool = False
) -> tuple[Array, Array, Array, Array]:
    lu, piv, perm = _lu_factor(A)
    m = A.shape[-1]
    P, L, U = _unpack(lu, perm, m, m)
    vector = B.ndim == 1 or (B.ndim == A.ndim - 1 and B.shape == A.shape[:-1])
    rhs = B[..., None] if vector else B
    if left:
        X = _lu_solve_left((P, L, U), rhs, False)
    else:
        X = _mT(_lu_solve_left((P, L, U), _mT(rhs).conj(), True)).conj()
    if vector:
        X = X[..., 0]
    return X, lu, piv, _info(lu)


@register("linalg_matrix_exp.default")
def _matrix_exp(self: Array) -> Array:
    # jax.scipy.linalg.expm is typed Any.
    res: Array = jax.scipy.linalg.expm(self)
    return res


@register("cholesky_solve.default")
def _cholesky_solve(self: Array, input2: Array, upper: bool = False) -> Array:
    L = _mT(input2).conj() if upper else input2
    y = lax.linalg.triangular_solve(L, self, left_side=True, lower=True)
    return lax.linalg.triangular_solve(L, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)


@register("cholesky_inverse.default")
def _cholesky_inverse(self: Array, upper: bool = False) -> Array:
    n = self.shape[-1]
    eye = jnp.broadcast_to(jnp.eye(n, dtype=self.dtype), self.shape)
    return _cholesky_solve(eye, self, upper)


@register("triangular_solve.default")
def _triangular_solve(
    self: Array, A: Array, upper: bool = True, transpose: bool = False, unitriangular: bool = False
) -> tuple[Array, Array]:
    X = lax.linalg.triangular_solve(
        A, self, left_side=True, lower=not upper, transpose_a=transpose, unit_diagonal=unitriangular
    )
    return X, A


@register("linalg_householder_product.default")
def _householder_product(input: Array, tau: Array) -> Array:
    return lax.linalg.householder_product(input, tau)


@register("linalg_pinv.atol_rtol_tensor", "linalg_pinv.atol_rtol_float")
def _pinv(
    self: Array, *, atol: Array | float | None = None, rtol: Array | float | None = None, hermitian: bool = False
) -> Array:
    m, n = self.shape[-2], self.shape[-1]
    if self.size == 0:
        return jnp.zeros(self.shape[:-2] + (n, m), self.dtype)
    if hermitian:
        w, v = jnp.linalg.eigh(self)
        s = jnp.abs(w)
        u, vh = v, _mT(v).conj() * jnp.sign(w)[..., :, None]
    else:
        u, s, vh = jnp.linalg.svd(self, full_matrices=False)
    smax = jnp.max(s, axis=-1, keepdims=True)
    # torch: rtol defaults to eps * max(m, n) unless a positive atol is given.
    eps = jnp.finfo(s.dtype).eps * max(m, n)
    a = jnp.zeros((), s.dtype) if atol is None else jnp.asarray(atol, s.dtype)
    if rtol is None:
        r = eps if atol is None else jnp.where(a > 0, 0.0, eps)
    else:
        r = jnp.asarray(rtol, s.dtype)
    a = a[..., None] if jnp.ndim(a) else a
    r = r[..., None] if isinstance(r, jax.Array) and r.ndim else r  # eps alone is a 0-d NumPy scalar
    tol = jnp.maximum(a, r * smax)
    s_inv = jnp.where(s > tol, 1 / jnp.where(s > tol, s, 1), 0).astype(self.dtype)
    return jnp.matmul(_mT(vh).conj() * s_inv[..., None, :], _mT(u).conj())


@register("_trilinear.default")
def _trilinear(
    i1: Array,
    i2: Array,
    i3: Array,
    expand1: Sequence[int],
    expand2: Sequence[int],
    expand3: Sequence[int],
    sumdim: Sequence[int],
    unroll_dim: int = 1,
) -> Array:
    """``bilinear``'s kernel: each input unsqueezed at its ``expand`` dims, the
    product summed over ``sumdim`` (removed), accumulated in float32."""

    def unsq(t: Array, dims: Sequence[int]) -> Array:
        for d in sorted(dims):
            t = jnp.expand_dims(t, d)
        return t.astype(jnp.float32) if is_float(t) else t

    prod = unsq(i1, expand1) * unsq(i2, expand2) * unsq(i3, expand3)
    return jnp.sum(prod, axis=tuple(sumdim)) if sumdim else prod


@register("ormqr.default")
def _ormqr(input: Array, input2: Array, input3: Array, left: bool = True, transpose: bool = False) -> Array:
    """``op(Q) @ C`` (or ``C @ op(Q)``) with Q the full m×m product of the
    Householder reflectors in ``input``/``input2`` (geqrf's output)."""
    m, k = input.shape[-2], input2.shape[-1]
    a = input[..., :, :k]
    if k < m:  # pad to m reflectors (zero taus are identities) for the full Q
        a = jnp.concatenate([a, jnp.zeros(a.shape[:-1] + (m - k,), a.dtype)], axis=-1)
        tau = jnp.concatenate([input2, jnp.zeros(input2.shape[:-1] + (m - k,), input2.dtype)], axis=-1)
    else:
        tau = input2
    q = lax.linalg.householder_product(a, tau)
    if transpose:
        q = _mT(q).conj()
    return jnp.matmul(q, input3) if left else jnp.matmul(input3, q)


@register("linalg_eig.default")
def _eig(self: Array) -> tuple[Array, Array]:
    w, v = jnp.linalg.eig(self)
    return w, v
