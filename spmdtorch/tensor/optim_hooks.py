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

Adam and AdamW go one further from their second step on: their group gets
``fused=True`` for the step instead (restored the same way), so torch calls
``_fused_adam_`` / ``_fused_adamw_`` once per dtype, which
``spmdtorch.tensor.dispatch._fused_adam`` records as one node with the foreach
path's arithmetic. The foreach step costs ~100 µs of Python per parameter in
lazy mode (eight ``_foreach_*`` ops, each walking every list element); the
fused call a few µs. ``fused_adam_by_default = False`` keeps foreach.

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
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.hooks
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from spmdtorch.lazy.contract import TraceState
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["foreach_by_default", "install", "register_parameter_type"]

# optimizer -> the (param group, key) pairs this module switched on for its
# current step (restored by the post-hook, or by the next pre-hook when the
# step raised and the post-hook never ran).
_SWITCHED: weakref.WeakKeyDictionary[torch.optim.Optimizer, list[tuple[dict[str, Any], str]]] = (
    weakref.WeakKeyDictionary()
)
_HANDLES: list[torch.utils.hooks.RemovableHandle] = []

# When False the hooks leave every optimizer as it is (for comparisons).
foreach_by_default = True
# When False an eligible Adam/AdamW keeps the foreach path instead of the fused one (for comparisons).
fused_adam_by_default = True

# Parameter types beside XlaTensor whose groups the hooks switch too (a group's
# parameters all of one such exact type), each with its "is a real floating
# dtype" question: register_parameter_type (spmdtorch.dtensor registers XlaDTensor).
_OTHER_TYPES: dict[type[torch.Tensor], Callable[[torch.Tensor], bool]] = {}


def _xla_floating(p: torch.Tensor) -> bool:
    dtype: torch.dtype = p._mk.dtype  # type: ignore[attr-defined]  # XlaTensor's meta: no torch-function round trip
    return dtype.is_floating_point


# The optimizers whose fused step spmdtorch records as one node (tensor.dispatch._fused_adam):
# these exact classes, whose step() is torch's (a subclass may override it).
_FUSED_ADAM = (torch.optim.Adam, torch.optim.AdamW)


def _restore(optimizer: torch.optim.Optimizer) -> None:
    switched = _SWITCHED.pop(optimizer, None)
    if switched:
        for group, key in switched:
            group[key] = None


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
    return _floating_check(group["params"]) is not None


def _floating_check(params: list[torch.Tensor]) -> Callable[[torch.Tensor], bool] | None:
    """The dtype question for a group's parameters: None unless all are xla tensors or all one registered type."""
    if not params:
        return None
    if all(isinstance(p, XlaTensor) for p in params):
        return _xla_floating
    check = _OTHER_TYPES.get(type(params[0]))
    return check if check is not None and all(type(p) is type(params[0]) for p in params) else None


def _under_dynamo() -> bool:
    """Whether this step runs inside a ``torch.compile``d function (between two of its graphs).

    Dynamo runs this module's hooks eagerly (spmdtorch.dynamo skips the
    engine's files) and then traces the rest of ``step()``: a fused group
    would make it move the CPU step counters to the device for good, which
    the foreach path it traces afterwards cannot take. torch has no public
    question for this; without the private one, assume yes (foreach, as before).
    """
    get = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    get = getattr(get, "get_eval_frame_callback", None)
    return get is None or bool(get())


def _wants_fused(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> bool:
    """Whether a group that may take the foreach path may take torch's fused Adam path instead.

    torch refuses ``fused=True`` for xla parameters when it creates their
    state, so only groups whose every parameter already has state with a CPU
    ``step`` (what the foreach path creates) qualify: from the second step on.
    Numbers only (a tensor lr or beta keeps foreach), real floating
    parameters, and not inside a ``torch.compile``d function (see
    :func:`_under_dynamo`).
    """
    if not fused_adam_by_default or type(optimizer) not in _FUSED_ADAM or group.get("fused", False) is not None:
        return False
    if torch.compiler.is_compiling() or _under_dynamo():
        return False
    beta1, beta2 = group["betas"]
    if not all(type(x) is float or type(x) is int for x in (group["lr"], beta1, beta2)):
        return False
    state = optimizer.state
    floating = _floating_check(group["params"])
    if floating is None:
        return False
    for p in group["params"]:
        st = state.get(p)
        step = None if not st else st.get("step")
        if type(step) is not torch.Tensor or step.device.type != "cpu" or not floating(p):
            return False
    return True


def _pre_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _restore(optimizer)
    if not foreach_by_default:
        return
    switched = []
    for group in optimizer.param_groups:
        if _wants_foreach(group):
            key = "fused" if _wants_fused(optimizer, group) else "foreach"
            group[key] = True
            switched.append((group, key))
    if switched:
        _SWITCHED[optimizer] = switched
    return


def _post_hook(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    _restore(optimizer)


def register_parameter_type(cls: type[torch.Tensor], is_floating: Callable[[torch.Tensor], bool]) -> None:
    """Let groups whose parameters are all of the exact type ``cls`` take the foreach and fused paths too.

    Args:
        cls: a tensor subclass whose ``_foreach_*`` and ``_fused_adam(w)_``
            calls spmdtorch records (``spmdtorch.dtensor``'s ``XlaDTensor``).
        is_floating: whether a parameter of that type has a real floating dtype
            (the fused Adam path takes only those).
    """
    _OTHER_TYPES[cls] = is_floating


def install() -> None:
    """Register the global optimizer hooks (idempotent)."""
    if not _HANDLES:
        _HANDLES.append(register_optimizer_step_pre_hook(_pre_hook))
        _HANDLES.append(register_optimizer_step_post_hook(_post_hook))
