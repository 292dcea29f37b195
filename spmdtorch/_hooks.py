"""Module hooks, as the recorders that skip Python on later calls guard them.

``spmdtorch.compile`` replays a traced program and ``assume_pure`` /
``scan_layers`` replay a recorded body without running the modules' Python
again, so their hooks do not run again either. A hook added or removed after a
recording changes what the module computes: the recorders key or guard their
recordings by the hooks' handles (`RemovableHandle` ids, unique in a process),
taken from here. spmdtorch's own hooks (``compile`` observes the modules it
traces with a global forward pre-hook) carry :data:`INTERNAL` and are left out.

Example:
    >>> import torch
    >>> from spmdtorch import _hooks
    >>> lin = torch.nn.Linear(2, 2)
    >>> _hooks.module_hooks(lin) is None
    True
    >>> h = lin.register_forward_hook(lambda m, i, o: o)
    >>> _hooks.module_hooks(lin) == ((), (h.id,), (), ())
    True
"""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

__all__ = ["INTERNAL", "global_backward_hooks", "global_forward_hooks", "module_hooks", "user_hooks"]

#: Attribute that marks a hook function as spmdtorch's own (set it to True).
INTERNAL = "spmdtorch_internal"

HookKeys = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def user_hooks(hooks: dict[int, Any]) -> tuple[int, ...]:
    """The handle ids of ``hooks`` (a hook dict of torch's), less spmdtorch's own."""
    if not hooks:
        return ()
    return tuple(k for k, h in hooks.items() if not getattr(h, INTERNAL, False))


def global_forward_hooks() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global module forward pre-hooks and forward hooks (``register_module_forward_*``) of users."""
    return user_hooks(_global_forward_pre_hooks), user_hooks(_global_forward_hooks)


def global_backward_hooks() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The global module backward pre-hooks and backward hooks (``register_module_*backward*``)."""
    return user_hooks(_global_backward_pre_hooks), user_hooks(_global_backward_hooks)


def module_hooks(m: nn.Module) -> HookKeys | None:
    """``m``'s own hooks: (forward pre, forward, backward pre, backward) handle ids, or None without any."""
    d = m.__dict__
    fp, f, bp, b = d["_forward_pre_hooks"], d["_forward_hooks"], d["_backward_pre_hooks"], d["_backward_hooks"]
    if not (fp or f or bp or b):
        return None
    return tuple(fp), tuple(f), tuple(bp), tuple(b)
