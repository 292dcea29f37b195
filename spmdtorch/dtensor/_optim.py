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
made them. From its second step an ``Adam``/``AdamW`` group takes torch's fused
path instead, as it does for xla tensors (``spmdtorch.tensor.optim_hooks``):
``torch._fused_adamw_`` over every parameter crosses ``__torch_function__`` once
and spmdtorch records it as one node.
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
from spmdtorch.tensor import optim_hooks

__all__ = ["install"]

# optimizer -> the (group, key) pairs switched on for its current step (restored by
# the post-hook, or by the next pre-hook when the step raised before it).
_SWITCHED: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[tuple[dict[str, Any], str]]] = (
    weakref.WeakKeyDictionary()
)
# The optimizers whose fused step spmdtorch records as one node: these exact classes
# (a subclass may override step()).
_FUSED_ADAM = (torch.optim.Adam, torch.optim.AdamW)
_HANDLES: list[torch.utils.hooks.RemovableHandle] = []


def _restore(optimizer: torch.optim.Optimizer) -> None:
    for group, key in _SWITCHED.pop(optimizer, ()):
        group[key] = None


def _wants_foreach(group: dict[str, Any], cls: type[torch.Tensor]) -> bool:
    if "foreach" not in group or group["foreach"] is not None:
        return False  # no foreach path, or the user chose
    if group.get("fused") or group.get("differentiable") or group.get("capturable") or TraceState.active:
        return False  # (spmdtorch.compile makes the optimizer capturable and snapshots param_groups)
    params = group["params"]
    return bool(params) and all(type(p) is cls for p in params)


def _under_dynamo() -> bool:
    """Whether this step runs inside a ``torch.compile``d function (assumed when torch cannot say).

    Dynamo would trace the rest of ``step()`` and move a fused group's CPU step
    counters to the device for good.
    """
    get = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    get = getattr(get, "get_eval_frame_callback", None)
    return get is None or bool(get())


def _wants_fused(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether a foreach-eligible group may take torch's fused Adam path instead.

    The conditions spmdtorch puts on xla parameters: torch refuses ``fused=True``
    for them when it creates their state, so only groups whose every parameter
    has state with a CPU ``step`` already (from the second step on); numbers for
    ``lr`` and ``betas``; real floating parameters; not under ``torch.compile``.
    """
    if not getattr(optim_hooks, "fused_adam_by_default", True) or type(optimizer) not in _FUSED_ADAM:
        return False
    if group.get("fused", False) is not None or torch.compiler.is_compiling() or _under_dynamo():
        return False
    beta1, beta2 = group["betas"]
    if not all(type(x) is float or type(x) is int for x in (group["lr"], beta1, beta2)):
        return False
    state = optimizer.state
    for p in group["params"]:
        st = state.get(p)
        step = None if not st else st.get("step")
        if type(step) is not torch.Tensor or step.device.type != "cpu" or not p.dtype.is_floating_point:
            return False
    return True


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
        if not optim_hooks.foreach_by_default:
            return
        switched = []
        for group in optimizer.param_groups:
            if _wants_foreach(group, cls):
                key = "fused" if _wants_fused(optimizer, group) else "foreach"
                group[key] = True
                switched.append((group, key))
        if switched:
            _SWITCHED[optimizer] = switched

    def post_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        _restore(optimizer)

    _HANDLES.append(register_optimizer_step_pre_hook(pre_hook))
    _HANDLES.append(register_optimizer_step_post_hook(post_hook))
