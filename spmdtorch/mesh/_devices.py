"""The logical device ordering shared by every mesh.

PyTorch/XLA identifies devices in a mesh by *logical ordinals* ``0..N-1``.
spmdtorch maps ordinal ``i`` to the ``i``-th device of::

    sorted(jax.devices(), key=lambda d: (d.process_index, d.id))

Why this order: ``jax.devices()`` makes no ordering promise across processes,
and raw ``Device.id`` values are not dense (process 1's CPU devices start at
id 2048). Sorting by ``(process_index, id)`` gives every process the same
dense numbering, keeps each process's devices contiguous (so ``range(N)``
reshaped with the outer axes over processes is host-friendly), and on one
process is simply the device-id order (``cpu:0`` is ordinal 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax

from spmdtorch.mesh.errors import MeshTypeError

__all__ = ["DeviceRecord", "device_records", "global_devices"]


class DeviceRecord(NamedTuple):
    """What mesh placement needs to know about one device.

    Attributes:
        device_id: The device's logical ordinal (its index in
            :func:`global_devices`).
        process_index: The process (host) that owns the device.
        slice_index: The multislice slice the device belongs to, or None when
            the platform does not report slices (CPU, GPU, single-slice TPU).
    """

    device_id: int
    process_index: int
    slice_index: int | None = None


def global_devices() -> list[jax.Device]:
    """Returns all JAX devices in logical-ordinal order.

    Example:
        >>> devs = global_devices()
        >>> [d.id for d in devs] == sorted(d.id for d in devs)   # one process
        True
    """
    return sorted(jax.devices(), key=lambda d: (d.process_index, d.id))


def device_records(devices: Sequence[jax.Device] | None = None) -> list[DeviceRecord]:
    """Returns one :class:`DeviceRecord` per device, in logical-ordinal order.

    Args:
        devices: Devices already in logical order; defaults to
            :func:`global_devices`.

    Example:
        >>> device_records()[0]
        DeviceRecord(device_id=0, process_index=0, slice_index=None)
    """
    if devices is None:
        devices = global_devices()
    elif isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise MeshTypeError(
            f"device_records: devices must be a sequence of jax devices (or None for all), got "
            f"{type(devices).__name__} {devices!r}"
        )
    for i, d in enumerate(devices):
        if not isinstance(d, jax.Device):
            raise MeshTypeError(f"device_records: devices[{i}] must be a jax.Device, got {type(d).__name__} {d!r}")
    return [DeviceRecord(i, int(d.process_index), getattr(d, "slice_index", None)) for i, d in enumerate(devices)]
