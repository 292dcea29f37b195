"""Routing ``device="xla"`` to spmdtorch without taxing plain CPU torch.

Three mechanisms, each where it is the only cost:

* ATen factory ops (``torch.zeros(..., device="xla")``, ``randn``, ``empty``…)
  reach the dispatcher with the ``XLA`` backend key; spmdtorch registers a
  kernel for every factory it can lower on that key (``torch.library``).
* Calls with an xla tensor among their arguments reach
  ``XlaTensor.__torch_function__`` (``torch_function`` below): autocast,
  index lists, and composites that build helper tensors on the storage
  device (meta). torch calls it only when an ``XlaTensor`` is an argument,
  so CPU code never pays for it.
* The few calls that create xla tensors from CPU data without an xla
  argument — ``t.to("xla")`` (and so ``Module.to("xla")``),
  ``torch.tensor/as_tensor/asarray(..., device="xla")``,
  ``t.new_tensor(..., device="xla")`` — are thin wrappers installed over
  those functions (``install``). A wrapper looks at the device argument and
  otherwise calls torch's own function with the arguments untouched, so
  every other call behaves exactly as in plain torch (docs/design.md,
  decision 2: "a plain CPU program is unchanged by the import").
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.utils._device

from spmdtorch.ops import registry
from spmdtorch.tensor import transfer
from spmdtorch.tensor._backward import BACKWARD_FUNCS, BACKWARD_NOT_HANDLED, run_backward
from spmdtorch.tensor._router import torch_function_handler
from spmdtorch.tensor.autocast import autocast_inputs
from spmdtorch.tensor.dispatch import (
    CAPTURE_FUNCS,
    FUNCTION_OVERRIDES,
    MetaFactoryLeak,
    capture_meta_factories,
    factory_kernel,
    under_saved_tensor_hooks,
)
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["install", "to_xla", "torch_function"]


def _is_xla(device: object) -> bool:
    if isinstance(device, torch.device):
        return device.type == "xla"
    if isinstance(device, str):
        return device == "xla" or device.startswith("xla:")
    return False


class _ToXla(torch.autograd.Function):
    """CPU → xla transfer that autograd can differentiate (grad flows back to CPU)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return transfer.from_host(t)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.cpu()


def to_xla(t: torch.Tensor) -> torch.Tensor:
    """Copy a CPU tensor to the xla device (a no-op for xla tensors)."""
    if isinstance(t, XlaTensor):
        return t
    if t.requires_grad and torch.is_grad_enabled():
        return _ToXla.apply(t)  # type: ignore[no-untyped-call, no-any-return]  # Function.apply: unannotated in torch
    return transfer.from_host(t)


# -- the wrappers over torch's CPU -> xla entry points ------------------------------

_TORCH_TO = torch.Tensor.to
_DTYPE = torch.dtype
_DEVICE = torch.device
_STR = str
_TORCH_FROM_DATA: dict[str, Callable[..., torch.Tensor]] = {
    "tensor": torch.tensor,
    "as_tensor": torch.as_tensor,
    "asarray": torch.asarray,
}
_TORCH_NEW_TENSOR = torch.Tensor.new_tensor


def _to_targets_xla(self: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``self.to(*args, **kwargs)`` moves host data to the xla device.

    Only CPU tensors (and xla tensors) move here; other tensors (the meta
    tensors inside torch's decompositions, say) take torch's own path.
    """
    if args:
        a = args[0]
        if isinstance(a, torch.Tensor):  # t.to(other): other's device and dtype
            target = isinstance(a, XlaTensor)
        else:
            target = _is_xla(a) or _is_xla(kwargs.get("device"))
    else:
        target = _is_xla(kwargs.get("device"))
    return target and (isinstance(self, XlaTensor) or self.device.type == "cpu")


def _to_xla_device(self: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """``self.to(...)`` with an xla target: torch's conversion rules, then the transfer."""
    kwargs = dict(kwargs)
    copy = kwargs.pop("copy", False)
    _device, dtype, _non_blocking, _memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if isinstance(self, XlaTensor):
        out = self if dtype is None or dtype == self.dtype else _TORCH_TO(self, dtype)
        return out.clone() if copy and out is self else out
    if dtype is not None and dtype != self.dtype:
        self = _TORCH_TO(self, dtype)
    return to_xla(self)  # always a new tensor: `copy` is satisfied


def _tensor_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    # The common CPU calls exit after one or two class tests (this frame is
    # all that the import adds to them): `t.to(dtype)`, `t.to("cpu")`,
    # `t.to(torch.device("cpu"))`, and keyword-only calls without `device=`.
    if args:
        a = args[0]
        cls = a.__class__
        if (cls is _DTYPE or (cls is _STR and a[:3] != "xla") or (cls is _DEVICE and a.type != "xla")) and (
            not kwargs or "device" not in kwargs
        ):
            return _TORCH_TO(self, *args, **kwargs)
    elif "device" not in kwargs:
        return _TORCH_TO(self, **kwargs)
    if _to_targets_xla(self, args, kwargs):
        return _to_xla_device(self, args, kwargs)
    return _TORCH_TO(self, *args, **kwargs)


def _from_data(func: Callable[..., torch.Tensor], args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor:
    """torch.tensor / as_tensor / asarray / new_tensor with device="xla": build on CPU, then transfer."""
    kwargs = dict(kwargs, device="cpu")
    requires_grad = kwargs.pop("requires_grad", False)
    out = to_xla(func(*args, **kwargs))
    if requires_grad:
        out.requires_grad_(True)
    return out


def _default_device_is_xla() -> bool:
    """Whether ``with torch.device("xla")`` or ``set_default_device("xla")`` is in force.

    (``torch.get_default_device()`` itself builds a tensor to find the index,
    which on "xla" is the failure being handled.)
    """
    for mode in reversed(torch.overrides._get_current_function_mode_stack()):
        if isinstance(mode, torch.utils._device.DeviceContext):
            return _is_xla(mode.device)
    return False


def _from_data_wrapper(func: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    # torch.tensor, as_tensor and asarray take `device` by keyword only.
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> torch.Tensor:
        if kwargs and kwargs.get("device") is not None and _is_xla(kwargs["device"]):
            return _from_data(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except RuntimeError:
            # `with torch.device("xla"):` / set_default_device("xla") gave torch's
            # function the xla device, which torch alone cannot build on
            # (docs/design.md, hazard "no device guard for xla").
            if "device" not in kwargs and _default_device_is_xla():
                with torch.device("cpu"):  # the host copy, and the helpers the transfer makes
                    return _from_data(func, args, dict(kwargs, device="xla"))
            raise

    return wrapper


def _new_tensor(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    if kwargs and kwargs.get("device") is not None and _is_xla(kwargs["device"]):
        return _from_data(_TORCH_NEW_TENSOR, (self, *args), kwargs)
    return _TORCH_NEW_TENSOR(self, *args, **kwargs)


# -- calls with xla tensor arguments (XlaTensor.__torch_function__) ---------------

_autocast_on = torch.is_autocast_enabled
# No device argument to parse: the common case (no autocast at all) is one C call.
_any_autocast = torch._C._is_any_autocast_enabled
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}
_BACKWARD = BACKWARD_FUNCS
_NO_RETRY = _BACKWARD
# Functions with a branch of their own below (CAPTURE_FUNCS grows at run time;
# FUNCTION_OVERRIDES is complete once spmdtorch.tensor.dispatch is imported).
_SPECIAL_FUNCS = frozenset(_INDEXING | _BACKWARD | FUNCTION_OVERRIDES.keys())


def _host_list(seq: Sequence[Any]) -> torch.Tensor:
    t = torch.tensor(seq)
    return t if t.dtype == torch.bool else t.to(torch.long)


def _host_index(index: Any) -> Any:
    """``x[[0, 2]]``-style index lists → CPU index tensors (same meaning)."""
    if isinstance(index, list):
        # A list holding slices, None, ..., tensors or sequences is a tuple
        # of indices (torch's legacy rule); a flat list of numbers is one index.
        if any(isinstance(i, (list, tuple, slice, torch.Tensor)) or i is None or i is Ellipsis for i in index):
            index = tuple(index)
        else:
            return _host_list(index)
    if isinstance(index, tuple):
        return tuple(_host_list(i) if isinstance(i, list) else i for i in index)
    return index


def _any_xla(args: Iterable[Any], kwargs: dict[str, Any]) -> bool:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, XlaTensor):
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, XlaTensor) for x in a):
            return True
    return False


def _grad_back_to_xla(node: torch.autograd.graph.Node) -> None:
    """Make the backward of a host copy of an xla tensor return an xla gradient.

    Autograd's ``ToCopyBackward0`` copies the gradient to the source's
    options, whose device is the xla tensor's storage device (meta): a
    backward started from a CPU tensor (``x.cpu().sum().backward()``) runs
    without any xla tensor argument, so no capture mode turns that meta copy
    into an xla tensor. The node's hook replaces it with the host gradient
    sent to the device.
    """
    if type(node).__name__ != "ToCopyBackward0":
        return

    def to_xla(
        grad_inputs: tuple[torch.Tensor | None, ...], grad_outputs: tuple[torch.Tensor | None, ...]
    ) -> tuple[torch.Tensor] | None:
        (meta,), (grad,) = grad_inputs, grad_outputs
        if meta is None or grad is None or not meta.is_meta:
            return None
        return (grad.to(device="xla", dtype=meta.dtype),)

    node.register_hook(to_xla)


@torch_function_handler
def torch_function(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:  # noqa: C901  (why: the torch-function hot path: each special case is one early return, inline for speed)
    """Run one torch call that has an xla tensor among its arguments.

    Called by ``XlaTensor.__torch_function__`` with subclass torch-function
    handling disabled, so nested calls go straight to ``__torch_dispatch__``.
    """
    if _any_autocast() and _autocast_on("xla"):  # torch's AutocastXLA key never sees xla tensors (autocast.py)
        args, kwargs = autocast_inputs(func, args, kwargs)
    # The common case (no special handling) is two set lookups, then the call.
    if func not in _SPECIAL_FUNCS and func not in CAPTURE_FUNCS:
        pass
    elif func in _INDEXING and isinstance(args[0], XlaTensor) and len(args) > 1:
        # torch turns Python index lists into tensors on self's storage
        # device (meta, where the values are lost) with the dispatcher's
        # Python key masked; host tensors built here carry them instead.
        args = (args[0], _host_index(args[1])) + tuple(args[2:])
        return func(*args, **kwargs)
    elif func in FUNCTION_OVERRIDES:  # a fused op instead of torch's decomposition (attention)
        out = FUNCTION_OVERRIDES[func](*args, **kwargs)
        if out is not NotImplemented:  # else torch's function, as below
            return out
    elif func in CAPTURE_FUNCS:
        with capture_meta_factories():
            return func(*args, **kwargs)
    elif func in _BACKWARD:
        # Backward formulas (C++, in the autograd engine, which carries this
        # thread's dispatch modes) build tensors from the gradient's options
        # (device meta); unlike a forward op, a backward pass cannot be
        # retried once it fails.
        with capture_meta_factories():
            out = run_backward(func, args, kwargs)
            return func(*args, **kwargs) if out is BACKWARD_NOT_HANDLED else out
    if under_saved_tensor_hooks():
        # A checkpointed region (torch.utils.checkpoint): the retry below
        # would leave the failed attempt's saved tensors behind, and the
        # recomputation saves fewer. Capture from the start instead.
        with capture_meta_factories():
            return func(*args, **kwargs)
    try:
        out = func(*args, **kwargs)
        if type(out) is not torch.Tensor:
            return out
        if not out.is_meta:
            if out.grad_fn is not None:  # a host copy of an xla tensor (x.cpu()) that autograd records
                _grad_back_to_xla(out.grad_fn)
            return out
        # Else a composite that returns its meta helper itself (linalg.norm
        # of an empty matrix returns at::zeros(..., self.options())).
    except MetaFactoryLeak:
        # A C++ composite (cov, cosine_similarity...) made a helper tensor
        # on meta, the xla tensors' storage device. Run it again with such
        # factories creating xla tensors; what the failed attempt recorded
        # is unreferenced lazy nodes. Backward passes cannot run twice.
        if func in _NO_RETRY:
            raise
    except NotImplementedError as e:
        # The same, where the composite then ran an op on its meta helper
        # alone (combinations: masked_select on a meta mask) or read it
        # (linalg.norm of an empty matrix).
        msg = str(e)
        leaked = "with Meta tensors" in msg or "Cannot copy out of meta tensor" in msg
        if func in _NO_RETRY or not leaked:
            raise
    CAPTURE_FUNCS.add(func)
    with capture_meta_factories():
        return func(*args, **kwargs)


# -- installation -------------------------------------------------------------------

_LIB: torch.library.Library | None = None


def _register_torchscript_builtin(wrapper: Callable[..., Any], original: Callable[..., Any]) -> None:
    """TorchScript maps torch functions to ATen ops by object identity; its
    table, once built, must know the wrapper as the op it wraps."""
    import torch.jit._builtins as builtins

    if builtins._builtin_table is not None:
        op = builtins._builtin_table.get(id(original))
        if op is not None:
            builtins._builtin_table[id(wrapper)] = op


def _as_torch_function(fn: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``fn`` that ``help()`` shows as torch's ``original`` (name,
    docstring, ``__wrapped__``); a copy so that this module's own doctests
    do not run torch's examples."""
    wrapper = types.FunctionType(fn.__code__, fn.__globals__, original.__name__, fn.__defaults__, fn.__closure__)
    return functools.update_wrapper(wrapper, original)


def _identity_sets() -> list[set[Callable[..., Any]]]:
    """torch's cached sets of its own functions that are compared by identity.

    torch builds them the first time they are needed, by attribute
    (``torch.tensor``...), and later tests the function a call receives
    against them: ``with torch.device("meta"):`` adds its device only to the
    factories in ``torch.utils._device._device_constructors()``. Built here,
    before the wrappers replace the attributes, they hold torch's functions
    (which torch's C++ passes to modes); ``install`` then adds the wrappers
    (which user code sees as ``torch.tensor``), so both identities answer as
    torch's function does without spmdtorch.
    """
    return [torch.utils._device._device_constructors(), torch.overrides.get_ignored_functions()]


def install() -> None:
    """Register XLA-key factory kernels and the CPU -> xla wrappers (idempotent)."""
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL", "XLA")
    for op in list(registry.LOWERINGS):
        if any(a.name == "device" for a in op._schema.arguments):
            name = op._schema.name.split("::")[-1]
            qual = name if op._overloadname == "default" else f"{name}.{op._overloadname}"
            _LIB.impl(qual, factory_kernel(op))
    identity_sets = _identity_sets()
    wrappers = {
        _TORCH_TO: _as_torch_function(_tensor_to, _TORCH_TO),
        _TORCH_NEW_TENSOR: _as_torch_function(_new_tensor, _TORCH_NEW_TENSOR),
    }
    # Deliberate patches of torch's methods (they route "xla" targets here and
    # leave every other call to torch's own method): mypy forbids assigning to a method.
    torch.Tensor.to = wrappers[_TORCH_TO]  # type: ignore[method-assign]
    torch.Tensor.new_tensor = wrappers[_TORCH_NEW_TENSOR]  # type: ignore[method-assign]
    for name, func in _TORCH_FROM_DATA.items():
        wrapper = wrappers[func] = _from_data_wrapper(func)
        setattr(torch, name, wrapper)
        _register_torchscript_builtin(wrapper, func)
    for functions in identity_sets:
        functions.update(w for f, w in wrappers.items() if f in functions)
