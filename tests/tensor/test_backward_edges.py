"""Backward passes started from xla tensors' gradient edges (``spmdtorch.tensor.run_backward``), against eager CPU.

``Tensor.backward`` / ``torch.autograd.backward`` / ``torch.autograd.grad``
on xla tensors start the engine from the tensors' edges with torch-function
handling on (the checkpoint recomputation must see the forward's routing).
These check the seed rule and the non-leaf policy the module documents.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint


def _pair(seed: int = 0):
    torch.manual_seed(seed)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(2, 4, 8)
    wx = w.detach().to("xla").requires_grad_()
    return w, x, wx, x.to("xla")


def _attention_block(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # SDPA routes through xla tensors' torch-function handler (a fused op): the recomputation must too.
    q = x @ w
    return F.scaled_dot_product_attention(q, q, q, is_causal=True) * 2


def test_backward_inputs_non_leaf_and_leaf_accumulate_as_torch():
    w, x, wx, xx = _pair()
    h, hx = x @ w, xx @ wx
    loss, lossx = h.tanh().sum(), hx.tanh().sum()
    for _ in range(2):  # twice: .grad accumulates for both kinds of input
        loss.backward(inputs=[h, w], retain_graph=True)
        lossx.backward(inputs=[hx, wx], retain_graph=True)
    assert hx.retains_grad and h.retains_grad  # torch's engine retains a non-leaf input's grad; so does this
    torch.testing.assert_close(hx.grad.cpu(), h.grad)
    torch.testing.assert_close(wx.grad.cpu(), w.grad)


def test_backward_inputs_non_leaf_under_non_reentrant_checkpoint():
    w, x, wx, xx = _pair()
    out = torch.utils.checkpoint.checkpoint(_attention_block, w, x, use_reentrant=False)
    outx = torch.utils.checkpoint.checkpoint(_attention_block, wx, xx, use_reentrant=False)
    mid, midx = out * 3, outx * 3
    mid.square().sum().backward(inputs=[mid, w])
    midx.square().sum().backward(inputs=[midx, wx])
    torch.testing.assert_close(midx.grad.cpu(), mid.grad)
    torch.testing.assert_close(wx.grad.cpu(), w.grad, rtol=1e-4, atol=1e-5)


def test_leaf_post_accumulate_hook_runs():
    _, _, wx, xx = _pair()
    seen = []
    wx.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.shape))
    (xx @ wx).sum().backward(inputs=[wx])
    assert seen == [torch.Size([8, 8])]


def test_grad_materialize_grads_gives_zeros_for_unused():
    w, x, wx, xx = _pair()
    unused, unusedx = torch.ones(3, requires_grad=True), torch.ones(3, device="xla", requires_grad=True)
    want = torch.autograd.grad((x @ w).sum(), [w, unused], materialize_grads=True)
    got = torch.autograd.grad((xx @ wx).sum(), [wx, unusedx], materialize_grads=True)
    for g, e in zip(got, want, strict=True):
        assert g.device.type == "xla"
        torch.testing.assert_close(g.cpu(), e)


def test_seed_rule_explicit_gradient_and_implicit_non_scalar():
    w, x, wx, xx = _pair()
    seed = torch.randn(2, 4, 8)
    (want,) = torch.autograd.grad(x @ w, [w], grad_outputs=seed)
    (got,) = torch.autograd.grad(xx @ wx, [wx], grad_outputs=seed.to("xla"))
    torch.testing.assert_close(got.cpu(), want)
    # No implicit gradient for a root of several elements: torch's own error, as on the CPU.
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        (xx @ wx).backward()
