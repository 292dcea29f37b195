"""``nn.TransformerEncoder`` in eval with ``src_key_padding_mask``, against eager CPU.

In eval, torch asks ``aten._nested_tensor_from_mask_left_aligned`` whether the
padding mask is left-aligned to pick its nested-tensor fast path. xla tensors
never take that path (they have a ``__torch_function__``), so the output is
the general path's: eager's with the fast path off everywhere, and eager's
fast-path output at every position that is not padding (the fast path writes
0 at padding positions).
"""

import pytest
import torch

import spmdtorch

PAD = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)


@pytest.mark.parametrize(
    "mask",
    [
        ~PAD,
        PAD,
        torch.zeros(3, 5, dtype=torch.bool),
        torch.ones(3, 5, dtype=torch.bool),
        torch.tensor([[1, 0, 1, 0, 0]] * 3, dtype=torch.bool),
    ],
)
def test_left_aligned_check_matches_eager(mask):
    x = torch.randn(3, 5, 4)
    want = torch._nested_tensor_from_mask_left_aligned(x, mask)
    assert torch._nested_tensor_from_mask_left_aligned(x.to("xla"), mask.to("xla")) is want


@pytest.mark.parametrize(
    "t,mask,match",
    [
        (torch.randn(3, 5, 4), PAD.int(), "of ScalarType Bool, but got Int"),
        (torch.randn(3, 5, 4), PAD[0], "2D"),
        (torch.randn(3, 5), PAD, "3D"),
        (torch.randn(5, 3, 4), PAD, "match input size"),
    ],
)
def test_left_aligned_check_raises_as_eager(t, mask, match):
    with pytest.raises(RuntimeError, match=match):
        torch._nested_tensor_from_mask_left_aligned(t, mask)
    with pytest.raises(RuntimeError, match=match):
        torch._nested_tensor_from_mask_left_aligned(t.to("xla"), mask.to("xla"))


def _encoder(norm=True):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(8) if norm else None).eval()


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("pad", [PAD, torch.zeros(3, 5, dtype=torch.bool)])
# The eval fast path with a padding mask is torch's nested-tensor path, which warns on eager CPU too.
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage:UserWarning")
def test_encoder_eval_with_padding_mask_matches_eager(grad, pad):
    enc = _encoder()
    src = torch.randn(3, 5, 8)
    xenc = _encoder().to("xla")
    with torch.set_grad_enabled(grad):
        got = xenc(src.to("xla"), src_key_padding_mask=pad.to("xla")).cpu()
        fast = enc(src, src_key_padding_mask=pad)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            general = enc(src, src_key_padding_mask=pad)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    keep = ~pad
    torch.testing.assert_close(got, general.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[keep], fast.detach()[keep], rtol=1e-5, atol=1e-5)


def test_encoder_eval_with_padding_mask_under_compile():
    enc = _encoder()
    xenc = _encoder().to("xla")
    src = torch.randn(3, 5, 8)

    @spmdtorch.compile
    def run(x, m):
        with torch.no_grad():
            return xenc(x, src_key_padding_mask=m)

    for _ in range(3):
        got = run(src.to("xla"), PAD.to("xla")).cpu()
    with torch.no_grad():
        want = enc(src, src_key_padding_mask=PAD)
    torch.testing.assert_close(got[~PAD], want[~PAD], rtol=1e-5, atol=1e-5)
