"""``torch_xla``: the top-level names (``device``, ``sync``, ``step``, ``compile``...)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

import spmdtorch
from spmdtorch import runtime
from spmdtorch.compat import _dynamo
from spmdtorch.compat.errors import MultiprocessNotSupportedError

__all__ = [
    "__version__",
    "compile",
    "device",
    "device_count",
    "devices",
    "launch",
    "logger",
    "manual_seed",
    "real_devices",
    "step",
    "sync",
]

# ``import torch_xla`` defines torch.ops.xla.dynamo_mark_sharding, as PyTorch/XLA's import does.
_dynamo.register_ops()

#: PyTorch/XLA's package logger (libraries attach handlers to it).
logger = logging.getLogger("torch_xla")

#: The PyTorch/XLA release whose API this layer follows, marked as spmdtorch's.
__version__ = "2.9.0+spmdtorch"


def device(index: int | None = None) -> torch.device:
    """``torch_xla.device()``: ``xla:0``, the device every spmdtorch tensor reports (SPMD's virtual device)."""
    return runtime.device(index)


def devices() -> list[torch.device]:
    """``torch_xla.devices()``: in SPMD mode, the one virtual device ``[xla:0]``."""
    return [runtime.device(0)]


def real_devices() -> list[str]:
    """``torch_xla.real_devices()``: ``xm.xla_real_devices()`` (``["CPU:0"]``... for SPMD's virtual device)."""
    from spmdtorch.compat import _xla_model

    devices: list[str] = _xla_model.xla_real_devices()
    return devices


def device_count() -> int:
    """``torch_xla.device_count()``: in SPMD mode 1 (physical devices: ``xr.global_runtime_device_count()``)."""
    return runtime.addressable_device_count()


def sync(wait: bool = False, reset_scope: bool = True) -> None:
    """``torch_xla.sync()``: run everything recorded so far (``spmdtorch.sync``), then the step closures."""
    spmdtorch.sync(wait=wait)


step = spmdtorch.step


def manual_seed(seed: int, device: Any = None) -> None:
    """``torch_xla.manual_seed``: seeds torch's generator, which spmdtorch's random ops draw from."""
    spmdtorch.manual_seed(seed)


def compile(
    f: Callable[..., Any] | None = None,
    full_graph: bool | None = False,
    name: str | None = None,
    num_different_graphs_allowed: int | None = None,
) -> Any:
    """``torch_xla.compile(fn)``: :func:`spmdtorch.compile` (traced until it settles, then replayed).

    The contract is ``jax.jit``'s (no ``.item()``/``print`` of tensors inside);
    ``full_graph``, ``name`` and ``num_different_graphs_allowed`` are accepted
    and have no effect (spmdtorch always compiles the whole function as one program).
    """
    if f is None:
        return functools.partial(
            compile, full_graph=full_graph, name=name, num_different_graphs_allowed=num_different_graphs_allowed
        )
    return spmdtorch.compile(f)


def launch(fn: Callable[..., Any], args: tuple[Any, ...] = (), *_: Any, **__: Any) -> Any:
    """``torch_xla.launch`` starts one process per device: multiprocess mode, which spmdtorch does not have."""
    raise MultiprocessNotSupportedError(
        "torch_xla.launch(fn) starts one process per device (multiprocess mode); spmdtorch runs SPMD only: one "
        "process per host drives all its devices. Call fn(0, *args) directly, build a Mesh over "
        "xr.global_runtime_device_count() devices and shard the batch (xs.mark_sharding or "
        "pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ('data', None)))); for several "
        "hosts run the script once per host (python -m spmdtorch.launch simulates that locally)"
    )
