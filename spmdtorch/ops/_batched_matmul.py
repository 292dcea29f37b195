"""``spmdtorch::batched_matmul``: a matmul that keeps every batch dim (no ``bmm`` reshape).

torch's ``matmul`` of two 4-d tensors, (B, H, L, D) @ (B, H, D, S) (eager
attention's scores and values), decomposes in C++ into ``bmm`` over (B*H, L,
D): merging a replicated batch dim with a sharded heads dim cannot be
expressed as a sharding, so the partitioner gathers both operands on every
device (for a tensor-parallel decode step: the whole KV cache, every layer).
This op is one ``dot_general`` with both batch dims, which XLA partitions
along heads (or batch) like the rest of the attention block. The torch-level
override (``spmdtorch.tensor.dispatch._functions``) sends ``torch.matmul``
and ``@`` of xla tensors here when both have the same batch dims; its
gradient is two more ``batched_matmul`` calls.

Defining the op adds ``torch.ops.spmdtorch.batched_matmul`` and nothing else:
on CPU tensors it is ``torch.matmul``.
"""

from __future__ import annotations

from typing import Any

import torch

from spmdtorch.ops import linalg
from spmdtorch.ops.registry import LOWERINGS, Lowering


@torch.library.custom_op("spmdtorch::batched_matmul", mutates_args=())
def batched_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` for ``a`` (..., n, k) and ``b`` (..., k, m) with equal batch dims."""
    return torch.matmul(a, b)


@batched_matmul.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((*a.shape[:-1], b.shape[-1]))


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
    a, b = inputs
    ctx.save_for_backward(a, b)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    a, b = ctx.saved_tensors
    grad_a = batched_matmul(grad, b.mT) if ctx.needs_input_grad[0] else None
    grad_b = batched_matmul(a.mT, grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


batched_matmul.register_autograd(_backward, setup_context=_setup_context)

LOWERINGS[torch.ops.spmdtorch.batched_matmul.default] = Lowering(linalg.matmul, lift_scalars=False)
