"""Scaled dot-product attention kernels.

``F.scaled_dot_product_attention`` on xla tensors is routed (by
``spmdtorch.tensor.dispatch``'s torch-function override) to the ATen op
``_scaled_dot_product_flash_attention_for_cpu``, one node whose lowering is
``jax.nn.dot_product_attention`` (``_jax_attention``): XLA's implementation
on CPU and TPU; on GPU cuDNN's fused kernel for the inputs it takes
(``_cudnn_candidate``: bf16/f16; jax's own checks of shapes, masks and the
cuDNN version run while tracing, and any input they refuse takes XLA's
implementation instead; jax's default, ``implementation=None``, is always
XLA's). Its backward
(torch's derivative calls the ``_backward`` op) is the ``jax.vjp`` of the same
function. ``_attention`` (math formulation, f32 softmax) stays the lowering
of the math op ``_scaled_dot_product_attention_math`` and the fallback for
inputs the jax function does not take. On TPU (``SPMDTORCH_ATTENTION_KERNEL``)
both ops lower to jax's Pallas flash-attention kernel instead, for the inputs
it takes (``_pallas_attention``: no mask, whole 128-blocks of sequence). Dropout inside attention has no
lowering here: the override leaves ``dropout_p > 0`` to torch's math
decomposition, whose dropout lowers like any other.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from spmdtorch import config
from spmdtorch.ops import _pallas_attention as pallas
from spmdtorch.ops import linalg
from spmdtorch.ops._util import Array
from spmdtorch.ops.registry import register


def _attention(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Array | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool = False,
) -> tuple[Array, Array, Array]:
    """Returns (output, logsumexp, probs); logsumexp over the key axis, f32."""
    q = query.astype(jnp.float32)
    k = key.astype(jnp.float32)
    v = value.astype(jnp.float32)
    if enable_gqa or (q.ndim >= 3 and k.shape[-3] != q.shape[-3]):
        rep = q.shape[-3] // k.shape[-3]
        k = jnp.repeat(k, rep, axis=-3)
        v = jnp.repeat(v, rep, axis=-3)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = linalg.matmul(q, jnp.swapaxes(k, -1, -2)) * scale
    L, S = s.shape[-2], s.shape[-1]
    if is_causal:
        s = jnp.where(jnp.tril(jnp.ones((L, S), jnp.bool_)), s, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            s = jnp.where(attn_mask, s, -jnp.inf)
        else:
            s = s + attn_mask.astype(jnp.float32)
    lse = jax.nn.logsumexp(s, axis=-1)
    # Fully masked rows: torch's math path gives NaN, the fused ones 0; use 0
    # (finite) so training does not blow up on padding rows.
    p = jnp.exp(s - jnp.where(jnp.isfinite(lse), lse, 0.0)[..., None])
    p = jnp.where(jnp.isfinite(lse)[..., None], p, 0.0)
    return linalg.matmul(p, v), lse, p


def _jax_supports(query: Array, key: Array, value: Array, attn_mask: Array | None) -> bool:
    """Whether ``jax.nn.dot_product_attention`` takes these (B, H, L, D) inputs."""
    if not (query.ndim == key.ndim == value.ndim == 4):
        return False
    if query.dtype != key.dtype or key.dtype != value.dtype or key.shape[1] != value.shape[1]:
        return False
    if query.shape[1] % key.shape[1]:  # grouped-query heads must divide evenly
        return False
    return attn_mask is None or attn_mask.ndim <= 4


def _jax_attention(
    query: Array, key: Array, value: Array, attn_mask: Array | None, is_causal: bool, scale: float | None
) -> tuple[Array, Array]:
    """(output, logsumexp) of ``jax.nn.dot_product_attention`` in torch's layout.

    torch's (B, H, L, D) is jax's (B, L, H, D) transposed; a bool mask is
    jax's ``mask``, a float one its ``bias``; grouped-query heads (fewer key
    heads) are native. Rows no key may attend to give 0 (torch's safe
    softmax) and a logsumexp of -inf, where jax would average the values.
    """
    q, k, v = (jnp.swapaxes(t, 1, 2) for t in (query, key, value))
    mask = bias = None
    if attn_mask is not None:
        attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.ndim) + attn_mask.shape)
        if attn_mask.dtype == jnp.bool_:
            mask = attn_mask
        else:
            bias = attn_mask.astype(jnp.promote_types(q.dtype, jnp.float32))
    out, lse = _dot_product_attention(q, k, v, bias, mask, scale, is_causal)
    out = jnp.swapaxes(out, 1, 2)
    lse = jnp.swapaxes(lse, 1, 2).astype(jnp.float32)  # (B, L, H) -> (B, H, L)
    if mask is not None:
        L, S = query.shape[-2], key.shape[-2]
        allowed = jnp.broadcast_to(mask, mask.shape[:2] + (L, S))
        if is_causal:
            allowed = allowed & jnp.tril(jnp.ones((L, S), jnp.bool_))
        live = jnp.any(allowed, axis=-1)  # (B or 1, H or 1, L)
        out = jnp.where(live[..., None], out, jnp.zeros((), out.dtype))
        lse = jnp.where(live, lse, -jnp.inf)
    return out, lse


def _platform() -> str:
    return jax.default_backend()


def _cudnn_candidate(query: Array) -> bool:
    """Whether to try cuDNN's fused attention (read at trace time): on GPU, bf16/f16, unless
    ``SPMDTORCH_ATTENTION_KERNEL=xla``."""
    if config.settings().attention_kernel == "xla" or _platform() != "gpu":
        return False
    return query.dtype in (jnp.bfloat16, jnp.float16)


def _dot_product_attention(
    q: Array, k: Array, v: Array, bias: Array | None, mask: Array | None, scale: float | None, is_causal: bool
) -> tuple[Array, Array]:
    """(out, logsumexp) of ``jax.nn.dot_product_attention`` in jax's layout: cuDNN's kernel where it applies."""
    if _cudnn_candidate(q):
        try:
            return jax.nn.dot_product_attention(
                q, k, v, bias, mask, scale=scale, is_causal=is_causal, return_residual=True, implementation="cudnn"
            )
        except (ValueError, NotImplementedError, RuntimeError, TypeError):
            pass  # jax refused these inputs (or this cuDNN) while tracing: XLA's implementation below
    return jax.nn.dot_product_attention(q, k, v, bias, mask, scale=scale, is_causal=is_causal, return_residual=True)


@register("_scaled_dot_product_flash_attention_for_cpu.default", lift_scalars=False)
def _sdpa_flash_cpu(
    query: Array,
    key: Array,
    value: Array,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: Array | None = None,
    scale: float | None = None,
) -> tuple[Array, Array]:
    _check_no_dropout(dropout_p)
    if pallas.use_pallas(query, key, value, attn_mask):
        # torch's op also returns the logsumexp: the math formulation's, beside
        # the kernel. Only the backward op receives it, and it recomputes
        # through the kernel, so in a training step XLA removes it as dead code.
        lse = _attention(query, key, value, None, is_causal, scale)[1]
        return pallas.attention(query, key, value, is_causal, scale), lse
    if _jax_supports(query, key, value, attn_mask):
        return _jax_attention(query, key, value, attn_mask, is_causal, scale)
    out, lse, _ = _attention(query, key, value, attn_mask, is_causal, scale)
    return out.astype(query.dtype), lse


@register("_scaled_dot_product_flash_attention_for_cpu_backward.default", lift_scalars=False)
def _sdpa_flash_cpu_backward(
    grad_out: Array,
    query: Array,
    key: Array,
    value: Array,
    out: Array,
    logsumexp: Array,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: Array | None = None,
    scale: float | None = None,
) -> tuple[Array, Array, Array]:
    _check_no_dropout(dropout_p)
    if pallas.use_pallas(query, key, value, attn_mask):
        return pallas.attention_vjp(grad_out, query, key, value, is_causal, scale)
    if _jax_supports(query, key, value, attn_mask):
        f = lambda q, k, v: _jax_attention(q, k, v, attn_mask, is_causal, scale)[0]
        _, vjp = jax.vjp(f, query, key, value)
        grads: tuple[Array, Array, Array] = vjp(grad_out.astype(query.dtype))  # jax types a pullback's result Any
        return grads
    f = lambda q, k, v: _attention(q, k, v, attn_mask, is_causal, scale)[0]

    def f32(t: Array) -> Array:
        return t.astype(jnp.float32)

    _, vjp = jax.vjp(f, f32(query), f32(key), f32(value))
    return tuple(g.astype(t.dtype) for g, t in zip(vjp(f32(grad_out)), (query, key, value)))


@register("_scaled_dot_product_attention_math.default", lift_scalars=False)
def _sdpa_math(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Array | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    dropout_mask: Array | None = None,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> tuple[Array, Array]:
    _check_no_dropout(dropout_p)
    out, _, probs = _attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    # The second output is the attention-probability matrix.
    return out, probs


def _check_no_dropout(dropout_p: float | Array) -> None:
    if isinstance(dropout_p, (int, float)) and dropout_p > 0:
        raise NotImplementedError(
            "spmdtorch: fused attention with dropout_p > 0 has no lowering; "
            "apply dropout outside scaled_dot_product_attention"
        )
