"""Factories: ``torch.zeros(..., device="xla")`` and helper tensors made inside C++ ops.

``factory_kernel`` is what ``spmdtorch.tensor.device_mode`` registers on the
XLA dispatch key for each lowered factory; ``capture_meta_factories`` turns the
``meta`` factories a C++ composite op makes from an xla tensor's options into
xla tensors.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spmdtorch.tensor._host import to_device_array
from spmdtorch.tensor._router import dispatch, facts_of
from spmdtorch.tensor.dispatch._paths import dispatch_lowering
from spmdtorch.tensor.xla_tensor import XLA_DEVICE, XlaTensor, new_base

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op

__all__ = ["CAPTURE_FUNCS", "capture_meta_factories", "factory_kernel"]

aten = torch.ops.aten


# -- factories inside C++ composite ops ----------------------------------------------

# Top-level torch functions known to build helper tensors from an xla tensor's
# options (so on meta); the device mode runs them under capture_meta_factories
# straight away instead of failing first.
CAPTURE_FUNCS: set[Callable[..., Any]] = set()


def _has_tensor(args: Iterable[Any], kwargs: dict[str, Any]) -> bool:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return True
    return False


class _MetaFactoriesToXla(TorchDispatchMode):
    """Factories asked for on ``meta`` (with no tensor arguments) create xla tensors."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable,
        # whose eval-frame bookkeeping costs about a microsecond per op; every
        # backward op runs through this mode, and TorchDynamo never traces
        # through it (it traces xla tensors as meta stand-ins, outside it).
        return False

    def __torch_dispatch__(
        self, func: Op, types: Sequence[type], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None:
            if torch.device(device).type == "meta":
                if not _has_tensor(args, kwargs):
                    kwargs = dict(kwargs, device=XLA_DEVICE)
                elif func is aten._to_copy.default and args[0].device.type == "cpu":
                    # Host data sent to "self's device" (index lists in x[[0, 2]]).
                    src = args[0] if kwargs.get("dtype") is None else args[0].to(kwargs["dtype"])
                    return new_base(to_device_array(src), src.dtype)
            return func(*args, **kwargs)
        for a in args:
            if isinstance(a, XlaTensor):
                # What XlaTensor.__torch_dispatch__ would do, minus a second
                # trip through the dispatcher (backward passes run here).
                return dispatch(func, args, kwargs)
        return func(*args, **kwargs)


def capture_meta_factories() -> TorchDispatchMode:
    """Context manager: factory ops on ``meta`` create xla tensors instead.

    Only for running one torch call on xla tensors whose C++ implementation
    makes helper tensors from the inputs' options (whose device is meta):
    every op in it pays one extra Python hop.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.tensor.dispatch import capture_meta_factories
        >>> x = torch.ones(3, 2, device="xla")
        >>> with capture_meta_factories():
        ...     c = torch.cov(x)
        >>> c.device.type
        'xla'
    """
    return _MetaFactoriesToXla()  # type: ignore[no-untyped-call]  # TorchDispatchMode.__init__ is unannotated in torch


# -- factories on the XLA dispatch key -------------------------------------------------


def factory_kernel(func: Op) -> Callable[..., Any]:
    """Kernel for ``torch.<factory>(..., device="xla")`` registered on the XLA key."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        facts = facts_of(func)
        if facts.lowering is None:
            raise NotImplementedError(f"spmdtorch has no lowering for factory {func}")
        return dispatch_lowering(func, args, kwargs, facts)

    return kernel
