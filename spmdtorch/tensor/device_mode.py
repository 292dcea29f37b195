"""Routing ``device="xla"`` to spmdtorch.

Two mechanisms, each used where it is cheapest:

* ATen factory ops (``torch.zeros(..., device="xla")``, ``randn``, ``empty``…)
  reach the dispatcher with the ``XLA`` backend key; spmdtorch registers a
  kernel for every factory it can lower on that key (``torch.library``), so they
  cost nothing to other code.
* Calls that never reach a kernel with an xla tensor — ``t.to("xla")`` on a CPU
  tensor, ``torch.tensor(data, device="xla")`` — are caught by a
  ``TorchFunctionMode`` entered at import (DESIGN.md decision 2). Its fast path
  is a dict lookup, so CPU code pays about a microsecond per torch call.
"""

from __future__ import annotations

import itertools

import torch
from torch.overrides import TorchFunctionMode

from spmdtorch.ops import registry
from spmdtorch.tensor import transfer
from spmdtorch.tensor.autocast import autocast_inputs
from spmdtorch.tensor.dispatch import CAPTURE_FUNCS, MetaFactoryLeak, capture_meta_factories, factory_kernel
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["XlaDeviceMode", "install", "to_xla"]


def _is_xla(device) -> bool:
    if device is None:
        return False
    if isinstance(device, torch.device):
        return device.type == "xla"
    if isinstance(device, str):
        return device.split(":")[0] == "xla"
    return False


class _ToXla(torch.autograd.Function):
    """CPU → xla transfer that autograd can differentiate (grad flows back to CPU)."""

    @staticmethod
    def forward(ctx, t):
        return new_base(transfer.to_device_array(t), t.dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.cpu()


def to_xla(t: torch.Tensor) -> torch.Tensor:
    """Copy a CPU tensor to the xla device (a no-op for xla tensors)."""
    if isinstance(t, XlaTensor):
        return t
    if t.requires_grad and torch.is_grad_enabled():
        return _ToXla.apply(t)
    return new_base(transfer.to_device_array(t), t.dtype)


def _tensor_to(args, kwargs):
    self = args[0]
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[1:], **kwargs)
    if not _is_xla(device):
        return None
    if isinstance(self, XlaTensor):
        out = self if dtype is None or dtype == self.dtype else self.to(dtype)
        return out.clone() if kwargs.get("copy") and out is self else out
    if dtype is not None and dtype != self.dtype:
        self = self.to(dtype)
    out = to_xla(self)
    if kwargs.get("copy") and out is self:
        out = out.clone()
    return out


def _from_data(func, args, kwargs):
    """torch.tensor / as_tensor / asarray / new_tensor with device="xla"."""
    kwargs = dict(kwargs)
    kwargs["device"] = "cpu"
    requires_grad = kwargs.pop("requires_grad", False)
    cpu = func(*args, **kwargs)
    out = to_xla(cpu)
    if requires_grad:
        out.requires_grad_(True)
    return out


_autocast_on = torch.is_autocast_enabled
# No device argument to parse: the common case (no autocast at all) is one C call.
_any_autocast = torch._C._is_any_autocast_enabled
_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor}
_INDEXING = {torch.Tensor.__getitem__, torch.Tensor.__setitem__}


def _host_list(seq):
    t = torch.tensor(seq)
    return t if t.dtype == torch.bool else t.to(torch.long)


def _host_index(index):
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


_BACKWARD = {torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad}
_NO_RETRY = _BACKWARD
# Functions with a branch of their own in XlaDeviceMode (CAPTURE_FUNCS grows at run time).
_SPECIAL_FUNCS = frozenset({torch.Tensor.to} | _FROM_DATA | _INDEXING | _BACKWARD)


def _any_xla(args, kwargs) -> bool:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, XlaTensor):
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, XlaTensor) for x in a):
            return True
    return False


class XlaDeviceMode(TorchFunctionMode):
    """Catches the calls that must create xla tensors from CPU data."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _any_autocast() and _autocast_on("xla"):  # torch's AutocastXLA key never sees xla tensors (autocast.py)
            args, kwargs = autocast_inputs(func, args, kwargs)
        # Every torch call of the program passes here: the common case (no
        # special handling) is one set lookup, then the call.
        if func not in _SPECIAL_FUNCS and func not in CAPTURE_FUNCS:
            pass
        elif func is torch.Tensor.to:
            out = _tensor_to(args, kwargs)
            if out is not None:
                return out
        elif func in _FROM_DATA and _is_xla(kwargs.get("device")):
            return _from_data(func, args, kwargs)
        elif func in _INDEXING and isinstance(args[0], XlaTensor) and len(args) > 1:
            # torch turns Python index lists into tensors on self's storage
            # device (meta, where the values are lost) with the dispatcher's
            # Python key masked; host tensors built here carry them instead.
            args = (args[0], _host_index(args[1])) + tuple(args[2:])
            return func(*args, **kwargs)
        elif func in CAPTURE_FUNCS:
            with capture_meta_factories():
                return func(*args, **kwargs)
        elif func in _BACKWARD and _any_xla(args, kwargs):
            # Backward formulas (C++, in the autograd engine, which carries
            # this thread's dispatch modes) build tensors from the gradient's
            # options (device meta); unlike a forward op, a backward pass
            # cannot be retried once it fails.
            with capture_meta_factories():
                return func(*args, **kwargs)
        try:
            out = func(*args, **kwargs)
            # A composite that returns its meta helper itself (linalg.norm of
            # an empty matrix returns at::zeros(..., self.options())).
            if type(out) is not torch.Tensor or not out.is_meta or not _any_xla(args, kwargs):
                return out
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
            if func in _NO_RETRY or not leaked or not _any_xla(args, kwargs):
                raise
        CAPTURE_FUNCS.add(func)
        with capture_meta_factories():
            return func(*args, **kwargs)


_LIB = None
_MODE = None


def install() -> None:
    """Register XLA-key factory kernels and enter the device mode (idempotent)."""
    global _LIB, _MODE
    if _LIB is None:
        _LIB = torch.library.Library("aten", "IMPL", "XLA")
        for op in list(registry.LOWERINGS):
            if any(a.name == "device" for a in op._schema.arguments):
                name = op._schema.name.split("::")[-1]
                qual = name if op._overloadname == "default" else f"{name}.{op._overloadname}"
                _LIB.impl(qual, factory_kernel(op))
    if _MODE is None:
        _MODE = XlaDeviceMode()
        _MODE.__enter__()
