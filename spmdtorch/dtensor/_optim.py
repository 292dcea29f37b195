"""torch optimizers over ``XlaDTensor`` parameters take their ``foreach`` path by default.

Why: ``torch.optim`` picks its multi-tensor (``foreach``) implementation only
for cuda-like devices, so a ``foreach=None`` optimizer runs its per-parameter
Python loop on xla tensors. spmdtorch switches such groups to ``foreach`` for
plain xla parameters (``spmdtorch.tensor.optim_hooks``); this module does the
same for groups whose parameters are all ``XlaDTensor``: each ``_foreach_*``
op over every parameter then crosses ``XlaDTensor.__torch_function__`` once
(one sharding propagation, the lazy tracer's one foreach record) instead of
once per parameter and op. The recorded per-element arithmetic is the same.

How: as for xla tensors, a global step pre-hook sets ``group["foreach"] = True``
on the groups left at ``foreach=None`` (not ``fused``, ``differentiable`` or
``capturable``, and not while ``spmdtorch.compile`` traces), and the post-hook
puts ``None`` back, so ``param_groups`` and ``state_dict()`` look as the user
made them.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.utils.hooks
from torch.optim.optimizer import (
    _foreach_supported_types as _optim_foreach_types,
)
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._foreach_utils import _foreach_supported_types as _util_foreach_types

from spmdtorch.lazy.contract import TraceState

__all__ = ["install"]

# optimizer -> the groups switched to foreach for its current step (restored by
# the post-hook, or by the next pre-hook when the step raised before it).
_SWITCHED: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[dict[str, Any]]] = weakref.WeakKeyDictionary()
_HANDLES: list[torch.utils.hooks.RemovableHandle] = []


def _restore(optimizer: torch.optim.Optimizer) -> None:
    for group in _SWITCHED.pop(optimizer, ()):
        group["foreach"] = None


def _wants_foreach(group: dict[str, Any], cls: type[torch.Tensor]) -> bool:
    if "foreach" not in group or group["foreach"] is not None:
        return False  # no foreach path, or the user chose
    if group.get("fused") or group.get("differentiable") or group.get("capturable") or TraceState.active:
        return False  # (spmdtorch.compile makes the optimizer capturable and snapshots param_groups)
    params = group["params"]
    return bool(params) and all(type(p) is cls for p in params)


def install(cls: type[torch.Tensor]) -> None:
    """Register the global optimizer hooks for parameters of type ``cls`` (idempotent).

    Also lists ``cls`` with the parameter types torch's foreach paths accept,
    as torch lists its own ``DTensor``.
    """
    if cls not in _optim_foreach_types:
        _optim_foreach_types.append(cls)
    if cls not in _util_foreach_types:
        _util_foreach_types.append(cls)
    if _HANDLES:
        return

    def pre_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _restore(optimizer)
        switched = [g for g in optimizer.param_groups if _wants_foreach(g, cls)]
        for group in switched:
            group["foreach"] = True
        if switched:
            _SWITCHED[optimizer] = switched

    def post_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _restore(optimizer)

    _HANDLES.append(register_optimizer_step_pre_hook(pre_hook))
    _HANDLES.append(register_optimizer_step_post_hook(post_hook))
