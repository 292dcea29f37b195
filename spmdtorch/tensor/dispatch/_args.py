"""Argument classification: one walk over an op's (args, kwargs).

It yields the node template (``Slot(i)`` for dynamic inputs), the dynamic
inputs (array values, lifted Python numbers) and the meta-cache key.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from spmdtorch.lazy.graph import Scalar, Slot, interned_scalar
from spmdtorch.tensor._host import to_device_array
from spmdtorch.tensor._values import read_value
from spmdtorch.tensor.dispatch._errors import DeviceMismatchError, MetaFactoryLeak
from spmdtorch.tensor.xla_tensor import XlaTensor

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op, OpFacts

__all__ = ["Args", "all_ints"]

_INT32 = (-(2**31), 2**31 - 1)


def _check_other_tensor(a: torch.Tensor, func: object, allow_cpu: bool) -> None:
    if a.device.type == "cpu" and (a.dim() == 0 or allow_cpu):
        return
    if a.device.type == "meta":
        raise MetaFactoryLeak(
            f"Expected all tensors to be on the same device, but found at least two devices, xla:0 and meta! "
            f"(when checking arguments for {func}). A meta tensor has no data; if it was made inside a torch "
            "op on xla tensors, that op created it from the xla tensor's options (run the op under "
            "spmdtorch.tensor.dispatch.capture_meta_factories())."
        )
    raise DeviceMismatchError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"xla:0 and {a.device}! (when checking arguments for {func})"
    )


class Args:
    """One walk over (args, kwargs): template with Slots, dynamic inputs, meta key.

    The hot path of tracing (every recorded op): xla tensors, the common
    argument, are handled inline; everything else goes through ``_leaf``.

    Attributes:
        template: ``(args, kwargs_items)`` with ``Slot(i)`` for ``inputs[i]``.
        inputs: the dynamic inputs (arrays, ``LazyRef``\\ s, ``Scalar``\\ s).
        key: the meta-cache key: the op's facts, each tensor's ``MetaKey``,
            the kinds of lifted numbers, and the template.
    """

    __slots__ = ("inputs", "key", "template")

    inputs: list[Any]
    key: tuple[Any, ...]
    template: tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]]

    def __init__(self, func: Op, facts: OpFacts, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        inputs = self.inputs = []
        key: list[Any] = [facts]
        lift_pos = facts.lift_pos
        t_args: list[Any] = []  # slots, static numbers, None, size tuples...
        for i, a in enumerate(args):
            if isinstance(a, XlaTensor):
                key.append(a._mk)  # MetaKey, stored when the tensor was made
                st = a._st
                inputs.append(st.value if not a._chain and st.logical_shape is None else read_value(a))
                n = len(inputs) - 1
                t_args.append(_SLOTS[n] if n < _N_SLOTS else Slot(n))
                continue
            t = type(a)
            if t is int or t is float:  # _leaf's rule for numbers, inline (optimizers pass hundreds)
                if i in lift_pos and _INT32[0] <= a <= _INT32[1] and a not in facts.static_scalars:
                    key.append(t)
                    inputs.append(interned_scalar(a, id(func)))
                    n = len(inputs) - 1
                    t_args.append(_SLOTS[n] if n < _N_SLOTS else Slot(n))
                else:
                    if t is float:  # 2.0 == 2 and -0.0 == 0.0 in the template: the key tells them apart
                        key.append(a.hex())
                    t_args.append(a)
            elif t is bool:
                key.append(bool)  # True == 1 in the template
                t_args.append(a)
            elif a is None:
                t_args.append(a)
            elif t is list and all_ints(a):  # sizes and dims (view, sum, _unsafe_view): static, no slots
                t_args.append(tuple(a))
            else:
                t_args.append(self._leaf(a, i in lift_pos, key, func, facts))
        if kwargs:
            lift_names = facts.lift_names
            t_kwargs = tuple((k, self._leaf(a, k in lift_names, key, func, facts)) for k, a in kwargs.items())
        else:
            t_kwargs = ()
        if facts.branch is not None:
            # Decided from the numbers as passed (before lifting); in the
            # template, so it is part of the node's signature and key.
            branch = facts.branch(*args, **kwargs)
            if branch is not None:
                t_kwargs += (("branch", branch),)
        self.template = (tuple(t_args), t_kwargs)
        key.append(self.template)
        self.key = tuple(key)

    def _leaf(self, a: Any, liftable: bool, key: list[Any], func: Op, facts: OpFacts) -> Any:
        if isinstance(a, XlaTensor):
            key.append(a._mk)
            self.inputs.append(read_value(a))
            return Slot(len(self.inputs) - 1)
        if isinstance(a, torch.Tensor):
            allow_cpu = facts.allow_cpu
            _check_other_tensor(a, func, allow_cpu)
            if a.dim() == 0 and not allow_cpu:
                key.append(("cpu0", a.dtype))
                self.inputs.append(Scalar(a.item()))
            else:
                key.append(("cpu", tuple(a.shape), a.dtype))
                self.inputs.append(to_device_array(a))
            return Slot(len(self.inputs) - 1)
        if isinstance(a, (list, tuple)):
            return tuple(self._leaf(x, False, key, func, facts) for x in a)
        if liftable and type(a) in (float, int) and _INT32[0] <= a <= _INT32[1] and a not in facts.static_scalars:
            key.append(type(a))
            self.inputs.append(interned_scalar(a, id(func)))  # equal numbers: one program input
            return Slot(len(self.inputs) - 1)
        if type(a) is float or type(a) is bool:  # see __init__: 2.0 == 2 == True, -0.0 == 0.0
            key.append((type(a), a.hex() if type(a) is float else a))
        return a


def all_ints(seq: Iterable[object]) -> bool:
    """Every element is a plain ``int`` (what ``Args._leaf`` would keep as is, one call each)."""
    for x in seq:
        if type(x) is not int:
            return False
    return True


# Interned slots for the inline path of Args (Slot(i) is always the same object).
_N_SLOTS = 64
Slot(_N_SLOTS - 1)
_SLOTS = [Slot(i) for i in range(_N_SLOTS)]
