"""Scaled dot-product attention kernels (math formulation, f32 softmax).

torch's ``scaled_dot_product_attention`` picks a fused backend by device;
these lower the CPU flash kernel and the math fallback that it can pick, plus
the flash kernel's backward (via ``jax.vjp``). Dropout inside attention is
supported forward-only: the backward cannot re-draw the forward's mask, so a
non-zero ``dropout_p`` in a backward raises.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from spmdtorch.ops import linalg
from spmdtorch.ops.registry import register


def _attention(query, key, value, attn_mask, is_causal, scale, enable_gqa=False):
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


@register("_scaled_dot_product_flash_attention_for_cpu.default", lift_scalars=False)
def _sdpa_flash_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
    _check_no_dropout(dropout_p)
    out, lse, _ = _attention(query, key, value, attn_mask, is_causal, scale)
    return out, lse


@register("_scaled_dot_product_flash_attention_for_cpu_backward.default", lift_scalars=False)
def _sdpa_flash_cpu_backward(
    grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None
):
    _check_no_dropout(dropout_p)
    f = lambda q, k, v: _attention(q, k, v, attn_mask, is_causal, scale)[0]  # noqa: E731
    f32 = lambda t: t.astype(jnp.float32)  # noqa: E731
    _, vjp = jax.vjp(f, f32(query), f32(key), f32(value))
    return vjp(f32(grad_out))


@register("_scaled_dot_product_attention_math.default", lift_scalars=False)
def _sdpa_math(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    dropout_mask=None,
    *,
    scale=None,
    enable_gqa=False,
):
    _check_no_dropout(dropout_p)
    out, _, probs = _attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)
    # The second output is the attention-probability matrix.
    return out, probs


def _check_no_dropout(dropout_p):
    if isinstance(dropout_p, (int, float)) and dropout_p > 0:
        raise NotImplementedError(
            "spmdtorch: fused attention with dropout_p > 0 has no lowering; "
            "apply dropout outside scaled_dot_product_attention"
        )
