"""torch optimizers take their ``foreach`` path on xla tensors by default.

Why: ``torch.optim`` picks the multi-tensor (``foreach``) implementation only
for its own devices (``_default_to_fused_or_foreach``: cuda, xpu...); on any
other device a ``foreach=None`` optimizer runs its per-parameter Python loop.
For the lazy tracer that loop costs one torch call (dispatcher, autograd
check, Python dispatch) per op per parameter, while one ``_foreach_*`` call
reaches ``spmdtorch.tensor.dispatch.foreach`` once and records the
per-parameter nodes straight from there. The recorded arithmetic is the same
per-element ops either way.

How: a global step pre-hook sets ``group["foreach"] = True`` on the groups
the user left at ``foreach=None`` whose parameters are all xla tensors, and
a post-hook puts ``None`` back, so ``param_groups`` and ``state_dict()``
look as the user made them. Groups are left alone when foreach is not
possible: ``fused``, ``differentiable``, or ``capturable`` (torch refuses
capturable foreach on xla), and while ``spmdtorch.compile`` traces (it makes
optimizers capturable; a compiled step's Python runs only while tracing).

Example:
    >>> import torch, spmdtorch
    >>> p = torch.nn.Parameter(torch.ones(3, device="xla"))
    >>> opt = torch.optim.SGD([p], lr=0.1)
    >>> p.grad = torch.ones(3, device="xla")
    >>> opt.step()                       # one _foreach_add_ for every parameter
    >>> opt.param_groups[0]["foreach"] is None
    True
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.utils.hooks
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from spmdtorch.lazy.contract import TraceState
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["foreach_by_default", "install"]

# optimizer -> the param groups this module switched to foreach for its
# current step (restored by the post-hook, or by the next pre-hook when the
# step raised and the post-hook never ran).
_SWITCHED: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[dict[str, Any]]] = weakref.WeakKeyDictionary()
_HANDLES: list[torch.utils.hooks.RemovableHandle] = []

# When False the hooks leave every optimizer as it is (for comparisons).
foreach_by_default = True


def _restore(optimizer: torch.optim.Optimizer) -> None:
    groups = _SWITCHED.pop(optimizer, None)
    if groups:
        for group in groups:
            group["foreach"] = None


def _wants_foreach(group: dict[str, Any]) -> bool:
    if "foreach" not in group or group["foreach"] is not None:
        return False  # the optimizer has no foreach path, or the user chose
    if group.get("fused") or group.get("differentiable") or group.get("capturable"):
        return False
    if TraceState.active:
        # spmdtorch.compile is tracing: it makes the optimizer capturable, and
        # it snapshots param_groups to detect hyper-parameter changes, which
        # a temporary foreach=True would make differ at every replay.
        return False
    params = group["params"]
    return bool(params) and all(isinstance(p, XlaTensor) for p in params)


def _pre_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _restore(optimizer)
    if not foreach_by_default:
        return
    switched = [g for g in optimizer.param_groups if _wants_foreach(g)]
    for group in switched:
        group["foreach"] = True
    if switched:
        _SWITCHED[optimizer] = switched
    return


def _post_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _restore(optimizer)


def install() -> None:
    """Register the global optimizer hooks (idempotent)."""
    if not _HANDLES:
        _HANDLES.append(register_optimizer_step_pre_hook(_pre_hook))
        _HANDLES.append(register_optimizer_step_post_hook(_post_hook))
