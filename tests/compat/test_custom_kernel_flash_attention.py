"""``torch_xla.experimental.custom_kernel.flash_attention`` against attention written out on eager CPU torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spmdtorch.compat._custom_kernel import FlashAttentionError

TOL = {"rtol": 1e-4, "atol": 1e-5}
# Gradients through the softmax reach |g| ~ 20 here, so float32 rounding alone
# moves them by ~1e-5: eager torch and XLA each land that far from the exact
# value, in directions that change with either library's kernels (torch 2.15 and
# jax 0.12 differ from torch 2.13 and jax 0.10 there). Gradients are therefore
# checked against a float64 reference, within this many float32 roundings of the
# largest gradient; a wrong mask or scale is off by far more.
F32_ROUNDINGS = 32


def assert_close_to_exact(actual, exact):
    """``actual`` (float32) within F32_ROUNDINGS float32 roundings of ``exact`` (float64)'s scale."""
    atol = F32_ROUNDINGS * torch.finfo(torch.float32).eps * exact.abs().max().item()
    torch.testing.assert_close(actual.double(), exact, rtol=1e-5, atol=atol)


def reference(q, k, v, causal=False, q_seg=None, kv_seg=None, sm_scale=1.0, ab=None):
    """softmax(q kᵀ · sm_scale + ab, masked) v, written out."""
    s = q @ k.transpose(-1, -2) * sm_scale
    if ab is not None:
        s = s + ab
    keep = torch.ones(s.shape[-2:], dtype=torch.bool)
    if causal:
        keep = keep.tril()
    keep = keep[None, None].expand(s.shape)
    if q_seg is not None:
        keep = keep & (q_seg[:, :, None] == kv_seg[:, None, :])[:, None]
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, -1) @ v


def qkv(seed, b=2, h=4, lq=8, lk=8, d=16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) for n in (lq, lk, lk)]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"causal": True}, {"sm_scale": 0.25}, {"segments": True}, {"causal": True, "segments": True, "bias": True}],
    ids=["plain", "causal", "scale", "segments", "causal_segments_bias"],
)
def test_values_and_gradients_match_eager_cpu(devices8, kwargs):
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v = qkv(0)
    opts = {"causal": kwargs.get("causal", False), "sm_scale": kwargs.get("sm_scale", 1.0)}
    if kwargs.get("segments"):
        opts["q_seg"] = opts["kv_seg"] = torch.tensor([[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1, 1]])
    if kwargs.get("bias"):
        opts["ab"] = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref = reference(*ref_in, **{n: t.double() if n == "ab" else t for n, t in opts.items()})
    ref.pow(2).sum().backward()

    xla_in = [t.to("xla").requires_grad_() for t in (q, k, v)]
    out = flash_attention(
        *xla_in,
        causal=opts["causal"],
        q_segment_ids=None if "q_seg" not in opts else opts["q_seg"].to("xla"),
        kv_segment_ids=None if "kv_seg" not in opts else opts["kv_seg"].to("xla"),
        sm_scale=opts["sm_scale"],
        ab=None if "ab" not in opts else opts["ab"].to("xla"),
    )
    out.pow(2).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach().float(), **TOL)
    for a, b in zip(xla_in, ref_in):
        assert_close_to_exact(a.grad.cpu(), b.grad)


def test_partition_spec_over_the_global_mesh(devices8):
    """PyTorch/XLA's FSDPv2 flash-attention example: partition_spec=('fsdp', None, None, None), global mesh."""
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.custom_kernel import flash_attention

    from spmdtorch.sharding import get_sharding_spec

    q, k, v = qkv(2, b=8)
    xs.set_global_mesh(xs.Mesh(np.arange(8), (8, 1), ("fsdp", "model")))
    try:
        xla_in = [t.to("xla").requires_grad_() for t in (q, k, v)]
        out = flash_attention(*xla_in, causal=False, partition_spec=("fsdp", None, None, None))
        out.sum().backward()
        assert get_sharding_spec(out) == "{devices=[8,1,1,1]0,1,2,3,4,5,6,7}"  # batch over the 8 devices
        torch.testing.assert_close(out.detach().cpu(), reference(q, k, v), **TOL)
        assert xla_in[0].grad is not None
    finally:
        xs.set_global_mesh(None)
    with pytest.raises(FlashAttentionError, match="partition_spec needs a mesh"):
        flash_attention(*(t.to("xla") for t in (q, k, v)), partition_spec=("fsdp", None, None, None))


def test_bad_inputs_raise_named_errors(devices8):
    from torch_xla.experimental.custom_kernel import flash_attention

    q, k, v = (t.to("xla") for t in qkv(3))
    with pytest.raises(FlashAttentionError, match=r"q must be a 4-D tensor .* got shape \(8, 16\)"):
        flash_attention(q[0, 0], k, v)
    with pytest.raises(FlashAttentionError, match="both q_segment_ids and kv_segment_ids"):
        flash_attention(q, k, v, q_segment_ids=torch.ones(2, 8, device="xla"))
    with pytest.raises(FlashAttentionError, match=r"expected \(2, 8\)"):
        seg = torch.ones(2, 5, device="xla")
        flash_attention(q, k, v, q_segment_ids=seg, kv_segment_ids=seg)
