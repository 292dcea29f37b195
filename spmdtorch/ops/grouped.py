"""Grouped matrix multiplication: ``_grouped_mm`` (``F.grouped_mm``) as ``jax.lax.ragged_dot``.

``F.grouped_mm(a, b, offs=...)`` is what mixture-of-experts layers (Hugging
Face's default expert code) use: the rows of the tokens, sorted by expert,
form groups ending at ``offs`` (cumulative int32 ends), and each group meets
its own expert's weight. The four layouts torch accepts, with ``G`` groups:

* ``a (M, K)``, ``b (G, K, N)``, offs over M  → ``(M, N)``: ragged rows (the
  forward, and the input gradient);
* ``a (M, K)``, ``b (K, N)``, offs over K  → ``(G, M, N)``: ragged contraction
  (the weight gradient);
* ``a (G, M, K)``, ``b (K, N)``, offs over N → ``(M, N)``: ragged columns;
* ``a (G, M, K)``, ``b (G, K, N)``, no offs → ``(G, M, N)``: a batched matmul.

Rows (columns) past ``offs[-1]`` are zero here; torch leaves them
uninitialised. On TPU ``ragged_dot`` is a native grouped kernel; XLA:CPU
computes it as masked dense products.
"""

from __future__ import annotations

from typing import cast

import jax.numpy as jnp
import torch
from jax import lax

from spmdtorch.ops._util import Array, jdtype
from spmdtorch.ops.registry import register

__all__ = ["grouped_mm"]


def _group_sizes(offs: Array) -> Array:
    """``offs`` (cumulative ends) → the size of each group."""
    offs = offs.astype(jnp.int32)
    return jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(f"grouped_mm: {message}")


def _grouped_mm_meta(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Output metadata: torch's shape rules without its CUDA-only bfloat16 rule."""
    _check(
        mat_a.dim() in (2, 3) and mat_b.dim() in (2, 3),
        f"multiplicands must be 2D or 3D but got mat_a.dim()={mat_a.dim()} and mat_b.dim()={mat_b.dim()}",
    )
    _check(mat_a.dtype == mat_b.dtype, f"mat_a and mat_b must have one dtype, got {mat_a.dtype} and {mat_b.dtype}")
    _check(mat_a.dtype.is_floating_point, f"expected floating-point inputs, got {mat_a.dtype}")
    a2, b2 = mat_a.dim() == 2, mat_b.dim() == 2
    _check(mat_a.shape[-1] == mat_b.shape[-2], f"contraction dims differ: mat_a {mat_a.shape}, mat_b {mat_b.shape}")
    n_offs = 0  # the number of groups (offs' length) where an operand is 2-D
    if a2 or b2:
        if offs is None:
            raise RuntimeError("grouped_mm: offs is required when an operand is 2D")
        _check(offs.dim() == 1 and offs.dtype == torch.int32, f"offs must be a 1D int32 tensor, got {offs.dtype}")
        n_offs = offs.shape[0]
    else:
        _check(offs is None, "offs must be None when both operands are 3D")
        _check(mat_a.shape[0] == mat_b.shape[0], f"batch dims differ: {mat_a.shape[0]} and {mat_b.shape[0]}")
    shape: tuple[int, ...]
    if a2 and b2:
        shape = (n_offs, mat_a.shape[0], mat_b.shape[1])
    elif a2:
        _check(n_offs == mat_b.shape[0], f"{n_offs} offsets for {mat_b.shape[0]} matrices of mat_b")
        shape = (mat_a.shape[0], mat_b.shape[-1])
    elif b2:
        _check(n_offs == mat_a.shape[0], f"{n_offs} offsets for {mat_a.shape[0]} matrices of mat_a")
        shape = (mat_a.shape[1], mat_b.shape[1])
    else:
        shape = (mat_a.shape[0], mat_a.shape[1], mat_b.shape[-1])
    return torch.empty(shape, dtype=out_dtype or mat_a.dtype, device="meta")


@register("_grouped_mm.default", meta=_grouped_mm_meta)
def grouped_mm(
    self: Array, mat2: Array, offs: Array | None = None, bias: Array | None = None, out_dtype: torch.dtype | None = None
) -> Array:
    """``torch._grouped_mm``: see the module docstring for the layouts.

    Example:
        >>> a = jnp.ones((3, 2)); b = jnp.stack([jnp.eye(2), 2 * jnp.eye(2)])
        >>> grouped_mm(a, b, jnp.array([1, 3], jnp.int32)).tolist()
        [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]
    """
    out_t = jdtype(out_dtype, self.dtype)
    # Accumulate in f32 at least, as torch's kernels do.
    acc = jnp.promote_types(out_t, jnp.float32)
    a2, b2 = self.ndim == 2, mat2.ndim == 2
    # _grouped_mm_meta (which runs first) required offs where an operand is 2-D.
    offs = cast(Array, offs)
    if a2 and not b2:  # ragged rows of a, one matrix of b per group
        out = lax.ragged_dot(self, mat2, _group_sizes(offs), preferred_element_type=acc)
    elif a2 and b2:  # ragged contraction: one (M, N) product per group
        dn = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        )
        out = lax.ragged_dot_general(self, mat2, _group_sizes(offs), dn, preferred_element_type=acc)
    elif b2:  # ragged columns of b, one matrix of a per group: the first layout, transposed
        out = lax.ragged_dot(mat2.T, jnp.swapaxes(self, 1, 2), _group_sizes(offs), preferred_element_type=acc).T
    else:
        out = jnp.matmul(self, mat2, preferred_element_type=acc)
    if bias is not None:
        out = out + bias.astype(acc)
    return out.astype(out_t)
