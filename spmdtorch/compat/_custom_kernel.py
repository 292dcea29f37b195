"""``torch_xla.experimental.custom_kernel``: ``flash_attention`` as attention that XLA lowers and shards.

PyTorch/XLA's ``flash_attention(q, k, v, causal, q_segment_ids,
kv_segment_ids, sm_scale, *, ab, partition_spec, mesh)`` calls its Pallas
TPU kernel. spmdtorch computes the same function with
``F.scaled_dot_product_attention`` (which spmdtorch lowers to JAX's attention,
the fused kernel on TPU): softmax(q·kᵀ · sm_scale + ab, masked by causality
and equal segment ids)·v. ``partition_spec`` (with ``mesh`` or the global
mesh) shards q, k, v, the output and their gradients as PyTorch/XLA's SPMD
path does. The rest of the module (the paged, ragged and quantized kernels)
has no spmdtorch meaning: those names raise ``TorchXlaNameError`` when used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from spmdtorch.compat.errors import CompatError
from spmdtorch.mesh import Mesh, get_global_mesh
from spmdtorch.sharding import mark_sharding_with_gradients

__all__ = ["FlashAttentionError", "flash_attention"]


class FlashAttentionError(CompatError, ValueError):
    """``flash_attention`` got tensors or options it cannot use (a ``ValueError`` too)."""


def _check_4d(t: Any, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        what = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise FlashAttentionError(
            f"flash_attention: {name} must be a 4-D tensor [batch, heads, seq, head_dim], got {what}"
        )
    return t


def _mask(q: torch.Tensor, k: torch.Tensor, causal: bool, q_seg: Any, kv_seg: Any) -> torch.Tensor | None:
    """Which (query, key) pairs attend: [batch or 1, 1, q_len, kv_len] booleans, or None for all."""
    mask = None
    if (q_seg is None) != (kv_seg is None):
        raise FlashAttentionError(
            "flash_attention: pass both q_segment_ids and kv_segment_ids, or neither "
            f"(got q_segment_ids={'None' if q_seg is None else 'a tensor'}, "
            f"kv_segment_ids={'None' if kv_seg is None else 'a tensor'})"
        )
    if q_seg is not None:
        want_q, want_kv = (q.shape[0], q.shape[2]), (k.shape[0], k.shape[2])
        if tuple(q_seg.shape) != want_q or tuple(kv_seg.shape) != want_kv:
            raise FlashAttentionError(
                f"flash_attention: segment ids must be [batch, seq]: q_segment_ids {tuple(q_seg.shape)} "
                f"(expected {want_q}), kv_segment_ids {tuple(kv_seg.shape)} (expected {want_kv})"
            )
        mask = (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]
    if causal:
        lq, lk = q.shape[2], k.shape[2]
        # Query i sees keys up to i (aligned at the start, as the Pallas kernel's causal mask).
        tri = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()[None, None]
        mask = tri if mask is None else mask & tri
    return mask


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    q_segment_ids: torch.Tensor | None = None,
    kv_segment_ids: torch.Tensor | None = None,
    sm_scale: float = 1.0,
    *,
    ab: torch.Tensor | None = None,
    partition_spec: Sequence[Any] | None = None,
    mesh: Mesh | None = None,
) -> torch.Tensor:
    """Attention of ``q`` over ``k``/``v``, as PyTorch/XLA's Pallas ``flash_attention`` computes it.

    Args:
        q: ``[batch, heads, q_len, head_dim]`` (not scaled here: ``sm_scale`` is applied to q·kᵀ).
        k: ``[batch, heads, kv_len, head_dim]``.
        v: ``[batch, heads, kv_len, head_dim]``.
        causal: query ``i`` attends to keys ``<= i`` only.
        q_segment_ids: ``[batch, q_len]``; with ``kv_segment_ids``, a query
            attends only to keys of its segment.
        kv_segment_ids: ``[batch, kv_len]``.
        sm_scale: the factor on q·kᵀ (1.0, PyTorch/XLA's default: scale q yourself or pass 1/sqrt(head_dim)).
        ab: an additive bias ``[batch, heads, q_len, kv_len]`` on the scores.
        partition_spec: shard q, k, v and the output (and their gradients) this way over ``mesh``.
        mesh: the mesh for ``partition_spec`` (default: the global mesh).

    Returns:
        ``[batch, heads, q_len, head_dim]``.

    Raises:
        FlashAttentionError: tensors that are not 4-D, inconsistent segment
            ids, or a ``partition_spec`` without a mesh.
    """
    q, k, v = _check_4d(q, "q"), _check_4d(k, "k"), _check_4d(v, "v")
    shard: tuple[Mesh, tuple[Any, ...]] | None = None
    if partition_spec is not None:
        on = mesh if mesh is not None else get_global_mesh()
        if on is None:
            raise FlashAttentionError(
                "flash_attention: partition_spec needs a mesh: pass mesh= or set one with xs.set_global_mesh(mesh)"
            )
        shard = (on, tuple(partition_spec))
        q, k, v = (mark_sharding_with_gradients(t, *shard) for t in (q, k, v))
    mask = _mask(q, k, causal, q_segment_ids, kv_segment_ids)
    attn_mask: torch.Tensor | None = mask
    if ab is not None:
        attn_mask = ab.to(q.dtype) if mask is None else ab.to(q.dtype).masked_fill(~mask, float("-inf"))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=float(sm_scale))
    if shard is not None:
        out = mark_sharding_with_gradients(out, *shard)
    return out
