"""``torch_xla.utils.checkpoint``: activation checkpointing that keeps its optimisation barrier.

``checkpoint(function, *args)`` on a module (or a module's bound method, as
Hugging Face's gradient checkpointing passes ``layer.__call__``) recomputes
through :func:`spmdtorch.fsdp.checkpoint_module`, whose barrier stops XLA
from merging the recomputation back (PyTorch/XLA's reason for this module).
Other callables go to ``torch.utils.checkpoint.checkpoint`` (correct
gradients; on XLA the recomputation may be merged back, saving no memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from spmdtorch.fsdp import checkpoint_module

__all__ = ["checkpoint"]


class _Call(nn.Module):
    """A module whose forward is ``fn`` and whose parameters are its owner's."""

    def __init__(self, owner: nn.Module, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.owner = owner
        self.fn = fn

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """Runs ``function(*args, **kwargs)`` without keeping its activations; backward recomputes them."""
    for key in ("preserve_rng_state", "context_fn", "determinism_check", "debug"):
        kwargs.pop(key, None)  # torch.utils.checkpoint's options: the barrier path preserves the RNG anyway
    owner = function if isinstance(function, nn.Module) else getattr(function, "__self__", None)
    if isinstance(owner, nn.Module):
        return checkpoint_module(_Call(owner, function))(*args, **kwargs)
    return torch.utils.checkpoint.checkpoint(
        function, *args, use_reentrant=False if use_reentrant is None else use_reentrant, **kwargs
    )
