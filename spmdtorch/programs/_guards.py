"""What of a module the recorders that skip Python on later calls key or guard.

``spmdtorch.compile`` replays a traced program and ``assume_pure`` /
``scan_layers`` replay a recorded body without running the modules' Python
again. What decides that Python besides tensors and the global modes (grad,
autocast, precision) is, for torch code, mostly per module: its hooks (added
or removed after a recording they change what the module computes) and its
plain attributes (``self.training``, ``self.scale = 0.5``, a flag a forward
branches on). The recorders key or guard their recordings by these, taken
from here. Hooks are compared by handle (``RemovableHandle`` ids, unique in a
process); spmdtorch's own hooks (``compile`` observes the modules it traces
with a global forward pre-hook) carry :data:`INTERNAL` and are left out, and
so are the modules of a class that carries it: a wrapper spmdtorch builds on
every call (``accumulate_gradients``' runner around the user's model), which
is a new object each time and so would never match a recording; the modules
it calls are the user's and are kept.

Example:
    >>> import torch
    >>> from spmdtorch.programs import _guards
    >>> lin = torch.nn.Linear(2, 2)
    >>> _guards.module_hooks(lin) is None
    True
    >>> h = lin.register_forward_hook(lambda m, i, o: o)
    >>> _guards.module_hooks(lin) == ((), (h.id,), (), ())
    True
    >>> _guards.plain_attributes(lin)
    (('training', <class 'bool'>, True), ('in_features', <class 'int'>, 2), ('out_features', <class 'int'>, 2))
    >>> attrs = _guards.plain_attributes(lin)
    >>> _guards.attributes_unchanged(lin.eval(), attrs)
    False
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

from torch import nn
from torch.nn.modules.module import (
    _global_backward_hooks,
    _global_backward_pre_hooks,
    _global_forward_hooks,
    _global_forward_pre_hooks,
)

__all__ = [
    "INTERNAL",
    "HookKeys",
    "attributes_unchanged",
    "is_internal_module",
    "global_backward_hooks",
    "global_forward_hooks",
    "module_hooks",
    "plain_attributes",
    "user_hooks",
]

#: Attribute that marks a hook function, or a module class, as spmdtorch's own (set it to True).
INTERNAL = "spmdtorch_internal"


def is_internal_module(m: nn.Module) -> bool:
    """Whether ``m``'s class is spmdtorch's own per-call wrapper (carries :data:`INTERNAL`): recorders skip it."""
    return getattr(type(m), INTERNAL, False) is True


class HookKeys(NamedTuple):
    """A module's own hooks by kind: their handle ids, in registration order."""

    forward_pre: tuple[int, ...]
    forward: tuple[int, ...]
    backward_pre: tuple[int, ...]
    backward: tuple[int, ...]

    @property
    def any_backward(self) -> bool:
        return bool(self.backward_pre or self.backward)


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
    d = m.__dict__  # .get: a module built without nn.Module.__init__ has none of them
    fp, f = d.get("_forward_pre_hooks"), d.get("_forward_hooks")
    bp, b = d.get("_backward_pre_hooks"), d.get("_backward_hooks")
    if not (fp or f or bp or b):
        return None
    return HookKeys(tuple(fp or ()), tuple(f or ()), tuple(bp or ()), tuple(b or ()))


# Plain Python values in a module's __dict__ that may decide what its forward records.
_PLAIN = (bool, int, float, str, type(None))


def plain_attributes(m: nn.Module) -> tuple[tuple[str, type, Any], ...]:
    """``(name, type, value)`` of ``m``'s public attributes holding plain values.

    Floats are kept by bit pattern (``-0.0`` and ``0.0`` differ, a NaN equals
    itself) and the type is kept because ``True == 1 == 1.0``.
    """
    return tuple(
        (k, type(v), v.hex() if type(v) is float else v)
        for k, v in m.__dict__.items()
        if type(v) in _PLAIN and k[0] != "_"
    )


def attributes_unchanged(m: nn.Module, attrs: tuple[tuple[str, type, Any], ...]) -> bool:
    """Whether ``m``'s attributes named in ``attrs`` (from :func:`plain_attributes`) still hold those values.

    Looks up only those names (a replay guard: cheaper than taking
    :func:`plain_attributes` again); an attribute added since is not seen.
    """
    d = m.__dict__
    for k, t, v in attrs:
        x = d.get(k, _MISSING)
        if type(x) is not t or (cast(float, x).hex() if t is float else x) != v:
            return False
    return True


_MISSING = object()
