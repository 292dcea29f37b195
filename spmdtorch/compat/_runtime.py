"""``torch_xla.runtime`` (``xr``): :mod:`spmdtorch.runtime`, whose names follow PyTorch/XLA's SPMD mode."""

from __future__ import annotations

from spmdtorch.runtime import (
    addressable_device_count,
    addressable_runtime_device_count,
    device_type,
    global_device_count,
    global_ordinal,
    global_runtime_device_count,
    initialize_cache,
    is_spmd,
    local_device_count,
    local_ordinal,
    local_process_count,
    process_count,
    process_index,
    use_spmd,
    world_size,
)

__all__ = [
    "addressable_device_count",
    "addressable_runtime_device_count",
    "device_type",
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
    "use_spmd",
    "world_size",
]


def host_index() -> int:
    """This host's index: the process index (spmdtorch runs one process per host)."""
    return process_index()


def is_bf16_supported() -> bool:
    """Always True: XLA computes bfloat16 on every platform spmdtorch runs on."""
    return True
