"""``torch.autocast("xla")`` for xla tensors.

torch implements autocast as a dispatch key per backend (AutocastCPU,
AutocastCUDA, AutocastXLA...). spmdtorch tensors are wrapper subclasses whose
storage lives on ``meta``, so torch's own autocast kernels never see them and
``with torch.autocast("xla", dtype=torch.bfloat16):`` would silently compute
in float32. spmdtorch applies the autocast rules itself, one level up, at the
``torch`` function level (its device mode sees every call), with torch's CUDA
op lists: matmul-like ops run in the autocast dtype; reductions, norms,
softmax and losses run in float32; the other ops run in the dtype of their
inputs. The casts are ordinary autograd-recorded ``.to()`` calls, so
gradients reach float32 parameters in float32 (as torch's autocast does).

Example:
    >>> import torch, spmdtorch
    >>> lin = torch.nn.Linear(4, 4).to("xla")
    >>> with torch.autocast("xla", dtype=torch.bfloat16):
    ...     y = lin(torch.ones(2, 4, device="xla"))
    ...     p = torch.softmax(y, dim=-1)
    >>> y.dtype, p.dtype, lin.weight.dtype
    (torch.bfloat16, torch.float32, torch.float32)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F

from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["autocast_inputs", "enabled"]

# torch's autocast op lists (CUDA), at the torch-function level.
_LOWER = {
    F.linear,
    F.bilinear,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    F.conv_transpose1d,
    F.conv_transpose2d,
    F.conv_transpose3d,
    F.scaled_dot_product_attention,
    F.prelu,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.mv,
    torch.addmm,
    torch.addmv,
    torch.addr,
    torch.baddbmm,
    torch.addbmm,
    torch.einsum,
    torch.chain_matmul,
    torch.linalg.multi_dot,
    torch.prelu,
    torch.Tensor.matmul,
    torch.Tensor.__matmul__,
    torch.Tensor.__rmatmul__,
    torch.Tensor.mm,
    torch.Tensor.bmm,
    torch.Tensor.mv,
    torch.Tensor.addmm,
    torch.Tensor.baddbmm,
}
_FLOAT32 = {
    torch.softmax,
    torch.log_softmax,
    F.softmax,
    F.log_softmax,
    F.softmin,
    torch.Tensor.softmax,
    torch.Tensor.log_softmax,
    F.layer_norm,
    F.group_norm,
    F.rms_norm,
    torch.norm,
    torch.Tensor.norm,
    torch.linalg.vector_norm,
    torch.linalg.norm,
    F.cross_entropy,
    F.nll_loss,
    F.mse_loss,
    F.l1_loss,
    F.smooth_l1_loss,
    F.huber_loss,
    F.kl_div,
    F.binary_cross_entropy_with_logits,
    F.cosine_similarity,
    F.poisson_nll_loss,
    F.cosine_embedding_loss,
    F.hinge_embedding_loss,
    F.margin_ranking_loss,
    F.soft_margin_loss,
    F.multilabel_margin_loss,
    F.multi_margin_loss,
    F.triplet_margin_loss,
    F.softplus,
    torch.exp,
    torch.expm1,
    torch.log,
    torch.log10,
    torch.log2,
    torch.log1p,
    torch.reciprocal,
    torch.rsqrt,
    torch.pow,
    torch.acos,
    torch.asin,
    torch.cosh,
    torch.sinh,
    torch.tan,
    torch.erfinv,
    torch.cumsum,
    torch.cumprod,
    torch.sum,
    torch.prod,
    torch.logsumexp,
    torch.cdist,
    torch.dist,
    torch.renorm,
    torch.Tensor.exp,
    torch.Tensor.log,
    torch.Tensor.pow,
    torch.Tensor.rsqrt,
    torch.Tensor.sum,
    torch.Tensor.cumsum,
    torch.Tensor.logsumexp,
}
_LOW_DTYPES = (torch.float16, torch.bfloat16)


def enabled() -> bool:
    """True inside ``torch.autocast("xla")`` (and not inside a disabled nested one)."""
    return torch.is_autocast_enabled("xla")


def _has_xla(tree: Iterable[Any]) -> bool:
    for a in tree:
        if isinstance(a, XlaTensor):
            return True
        if isinstance(a, (list, tuple)) and _has_xla(a):
            return True
    return False


def _cast(tree: Any, want: torch.dtype, only_from: tuple[torch.dtype, ...] | None = None) -> Any:
    """``tree`` (a tensor, or lists/tuples of them and other values) with its floating tensors cast to ``want``."""

    def one(a: Any) -> Any:
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != want:
            if only_from is None or a.dtype in only_from:
                return a.to(want)
        elif isinstance(a, (list, tuple)):
            return type(a)(one(x) for x in a)
        return a

    return one(tree)


def autocast_inputs(
    func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments ``func`` runs with under ``torch.autocast("xla")`` (unchanged for other ops).

    Lower-precision ops get every floating tensor cast to the autocast dtype;
    float32 ops get float16/bfloat16 tensors cast to float32. Calls without
    an xla tensor argument are left to torch.
    """
    if func in _LOWER:
        dtype = torch.get_autocast_dtype("xla")
        if _has_xla(args) or _has_xla(kwargs.values()):
            return _cast(args, dtype), {k: _cast(v, dtype) for k, v in kwargs.items()}
    elif func in _FLOAT32:
        if _has_xla(args) or _has_xla(kwargs.values()):
            # dtype= arguments (softmax(x, dtype=...)) are the user's explicit choice.
            return _cast(args, torch.float32, _LOW_DTYPES), {
                k: (v if k == "dtype" else _cast(v, torch.float32, _LOW_DTYPES)) for k, v in kwargs.items()
            }
    return args, kwargs
