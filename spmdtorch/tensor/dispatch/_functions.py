"""Torch-level overrides: torch functions that xla tensors run as one fused ATen op.

Some torch functions decompose in C++ before any ATen call reaches the
dispatcher, because their fused kernels are chosen by device and the xla
tensors' storage device is ``meta``: ``F.scaled_dot_product_attention``
becomes a dozen math ops there. ``FUNCTION_OVERRIDES`` maps such a function
to a handler with its signature; the torch-function handler
(``spmdtorch.tensor.device_mode``) calls it for calls with an xla argument.
A handler returns what torch's function returns, or ``NotImplemented`` for
a case it does not take: the handler then runs torch's function as for any
other call (with its retry for helpers that C++ composites build on meta).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from spmdtorch.ops import LinearFn
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["FUNCTION_OVERRIDES", "linear", "matmul", "scaled_dot_product_attention", "under_saved_tensor_hooks"]

FUNCTION_OVERRIDES: dict[Callable[..., Any], Callable[..., Any]] = {}

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def under_saved_tensor_hooks() -> bool:
    """Whether saved-tensor hooks are active (``torch.utils.checkpoint``'s non-reentrant forward).

    The overrides below must not change what a checkpointed region saves:
    its recomputation runs inside a backward pass, and torch refuses
    recomputed tensors whose shapes differ from the saved ones. Under such
    hooks the overrides step aside, so both passes take torch's path.
    """
    return torch._C._autograd._top_saved_tensors_default_hooks(True) is not None


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> object:  # a tensor, or NotImplemented
    """``F.scaled_dot_product_attention`` as one fused op (``jax.nn.dot_product_attention``).

    The call becomes ``aten._scaled_dot_product_flash_attention_for_cpu``,
    whose lowering (``spmdtorch.ops.attention``) is jax's fused attention and
    whose autograd formula torch supplies (its backward op lowers to the
    ``jax.vjp`` of the same function). torch's own function (the math
    decomposition) runs instead for what that op does not take: dropout,
    calls under saved-tensor hooks (``under_saved_tensor_hooks``), inputs
    that are not 4-d xla tensors of one dtype, a mask that needs a
    gradient or is not an xla tensor, and the argument errors torch reports
    (a mask with ``is_causal``, head counts that do not match): for those it
    returns ``NotImplemented``.
    """
    fused = (
        isinstance(query, XlaTensor)
        and isinstance(key, XlaTensor)
        and isinstance(value, XlaTensor)
        and isinstance(dropout_p, (int, float))
        and dropout_p == 0
        and query.dim() == key.dim() == value.dim() == 4
        and query.dtype == key.dtype == value.dtype
        and query.dtype.is_floating_point
        and key.shape[1] == value.shape[1]
        and (query.shape[1] == key.shape[1] or (enable_gqa and query.shape[1] % key.shape[1] == 0))
        and not (is_causal and attn_mask is not None)
        and (attn_mask is None or (isinstance(attn_mask, XlaTensor) and not attn_mask.requires_grad))
    )
    if not fused or under_saved_tensor_hooks():
        return NotImplemented
    return _FLASH(query, key, value, 0.0, bool(is_causal), attn_mask=attn_mask, scale=scale)[0]


FUNCTION_OVERRIDES[F.scaled_dot_product_attention] = scaled_dot_product_attention

_BATCHED_MATMUL = torch.ops.spmdtorch.batched_matmul.default


def matmul(
    input: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor | None = None
) -> object:  # a tensor, or NotImplemented
    """``torch.matmul`` / ``@`` of xla tensors with two or more equal batch dims, as one batched product.

    torch decomposes such a product into ``bmm`` over the merged batch dims,
    which the partitioner cannot keep sharded when one of them is (heads in
    tensor-parallel attention: it would gather both operands). The call
    becomes ``spmdtorch::batched_matmul`` (``spmdtorch.ops._batched_matmul``):
    one product keeping every batch dim. Everything else (1-3 dims,
    broadcasting batch dims, mixed dtypes or devices, ``out=``, saved-tensor
    hooks) returns ``NotImplemented`` and takes torch's path.
    """
    if (
        out is None
        and isinstance(input, XlaTensor)
        and isinstance(other, XlaTensor)
        and input.dim() == other.dim() >= 4
        and input.shape[:-2] == other.shape[:-2]
        and input.shape[-1] == other.shape[-2]
        and input.dtype == other.dtype
        and input.dtype.is_floating_point
        and not under_saved_tensor_hooks()
    ):
        return _BATCHED_MATMUL(input, other)
    return NotImplemented


FUNCTION_OVERRIDES[torch.matmul] = matmul
FUNCTION_OVERRIDES[torch.Tensor.matmul] = matmul
FUNCTION_OVERRIDES[torch.Tensor.__matmul__] = matmul


def linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> object:  # a tensor, or NotImplemented
    """``F.linear`` of xla tensors as one op each way (``spmdtorch.ops._linear``).

    torch decomposes it into about four ATen calls forward and eight
    backward (transposes, views and ``mm`` of the flattened input); the call
    becomes ``spmdtorch::linear`` (through ``spmdtorch.ops.LinearFn``, its autograd
    function), whose gradient is ``linear_input_grad`` and
    ``linear_weight_grad``: the products ``jax.grad`` of ``x @ w.T`` has,
    every leading dim kept. Anything else (a weight that is not 2-d,
    mixed dtypes or devices, integer tensors, saved-tensor hooks) returns
    ``NotImplemented`` and takes torch's path, which also reports shape
    errors in torch's words.
    """
    if (
        isinstance(input, XlaTensor)
        and isinstance(weight, XlaTensor)
        and weight.dim() == 2
        and input.dim() >= 1
        and input.shape[-1] == weight.shape[1]
        and input.dtype == weight.dtype
        and input.dtype.is_floating_point
        and (
            bias is None
            or (isinstance(bias, XlaTensor) and bias.shape == weight.shape[:1] and bias.dtype == input.dtype)
        )
        and not under_saved_tensor_hooks()
    ):
        # torch.autograd.Function.apply is unannotated in torch's stubs.
        return LinearFn.apply(input, weight, bias)  # type: ignore[no-untyped-call]
    return NotImplemented


FUNCTION_OVERRIDES[F.linear] = linear
