"""``torch_xla.runtime`` (``xr``): :mod:`spmdtorch.runtime`, whose names follow PyTorch/XLA's SPMD mode."""

from __future__ import annotations

import os
from typing import Any

from spmdtorch import ArgumentError, runtime
from spmdtorch.runtime import (
    addressable_device_count,
    addressable_runtime_device_count,
    device_type,
    global_device_count,
    global_ordinal,
    global_runtime_device_count,
    initialize_cache,
    local_device_count,
    local_ordinal,
    local_process_count,
    process_count,
    process_index,
    world_size,
)

__all__ = [
    "addressable_device_count",
    "addressable_runtime_device_count",
    "device_type",
    "global_runtime_device_attributes",
    "global_device_count",
    "global_ordinal",
    "global_runtime_device_count",
    "host_index",
    "initialize_cache",
    "is_bf16_supported",
    "is_spmd",
    "local_device_count",
    "local_ordinal",
    "local_process_count",
    "process_count",
    "process_index",
    "runtime_device_attributes",
    "use_spmd",
    "world_size",
]


def host_index() -> int:
    """This host's index: the process index (spmdtorch runs one process per host)."""
    return process_index()


def is_bf16_supported() -> bool:
    """Always True: XLA computes bfloat16 on every platform spmdtorch runs on."""
    return True


def use_spmd(auto: bool | None = False) -> None:
    """PyTorch/XLA's switch into SPMD mode (spmdtorch is always in it); sets ``XLA_USE_SPMD=1`` as PyTorch/XLA does.

    PyTorch/XLA's code reads the variable back (its test base class deletes it
    in ``tearDownClass``; ``is_spmd()`` checks it there), so it is set here.

    ``auto=True`` turns on spmdtorch's auto-sharding (``spmdtorch.runtime.use_spmd``:
    a rule that shards large unannotated inputs, not XLA's solver).

    Raises:
        spmdtorch.ArgumentTypeError: ``auto`` is not a bool or None.
    """
    runtime.use_spmd(auto)
    os.environ["XLA_USE_SPMD"] = "1"
    _USE_SPMD_CALLED[0] = True


#: Whether :func:`use_spmd` ran in this process (then ``is_spmd`` follows ``XLA_USE_SPMD``).
_USE_SPMD_CALLED = [False]


def is_spmd() -> bool:
    """Whether the program runs in SPMD mode: True, unless ``XLA_USE_SPMD`` says otherwise after :func:`use_spmd`.

    spmdtorch always runs SPMD programs, so a program that never called
    ``use_spmd()`` gets True. Once it has, the answer follows ``XLA_USE_SPMD``
    as in PyTorch/XLA, whose code deletes the variable to leave SPMD mode
    (its test base class does in ``tearDownClass``) and reads ``is_spmd()``
    back; the programs still run as SPMD programs.
    """
    if not _USE_SPMD_CALLED[0]:
        return runtime.is_spmd()
    return os.environ.get("XLA_USE_SPMD", "0").lower() in ("1", "true")


def _attributes(index: int, device: Any) -> dict[str, object]:
    """One device's attributes under PyTorch/XLA's keys (``name``; TPU: ``coords``, ``core_on_chip``, ``slice_index``)."""
    attrs: dict[str, object] = {"name": f"{device_type()}:{index}"}
    for key in ("coords", "core_on_chip", "slice_index"):
        value = getattr(device, key, None)
        if value is not None:
            attrs[key] = list(value) if key == "coords" else int(value)
    return attrs


def global_runtime_device_attributes() -> list[dict[str, object]]:
    """The attributes of every runtime device of the job, in global device order."""
    return [_attributes(i, d) for i, d in enumerate(runtime.jax_devices())]


def runtime_device_attributes(device: str) -> dict[str, object]:
    """The attributes of runtime device ``device`` (``'CPU:3'``, ``'TPU:0'``).

    Raises:
        ArgumentError: ``device`` names no runtime device of the job.
    """
    for attrs in global_runtime_device_attributes():
        if attrs["name"] == device:
            return attrs
    raise ArgumentError(
        f"xr.runtime_device_attributes: device must name a runtime device such as "
        f"'{device_type()}:0' (0..{global_runtime_device_count() - 1}), got {device!r}"
    )
