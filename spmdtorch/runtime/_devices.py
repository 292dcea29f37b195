"""Devices and counts: every count and index comes straight from ``jax``; devices are ``xla:N``."""

from __future__ import annotations

import jax
import torch

from spmdtorch._checks import ArgumentError, ArgumentTypeError
from spmdtorch.config import RuntimeConfigError
from spmdtorch.runtime._platform import DEVICE_TYPE, _backends_initialized, _pjrt_device_from_env, _type_of_platform

# --------------------------------------------------------------------------
# Devices and counts
# --------------------------------------------------------------------------


def jax_devices() -> list[jax.Device]:
    """Returns every JAX device of the job (all processes), ``jax.devices()``.

    Example:
        >>> len(jax_devices()) == global_runtime_device_count()
        True
    """
    return list(jax.devices())


def local_jax_devices() -> list[jax.Device]:
    """Returns the JAX devices this process can address, ``jax.local_devices()``.

    Example:
        >>> len(local_jax_devices()) == addressable_runtime_device_count()
        True
    """
    return list(jax.local_devices())


def global_runtime_device_count() -> int:
    """Returns the number of devices across all processes of the job.

    Example:
        >>> global_runtime_device_count() >= 1
        True
    """
    return jax.device_count()


def addressable_runtime_device_count() -> int:
    """Returns the number of devices this process can address.

    Example:
        >>> addressable_runtime_device_count() >= 1
        True
    """
    return jax.local_device_count()


def device_count() -> int:
    """Returns the number of addressable (local) devices.

    Same as :func:`addressable_runtime_device_count`; kept for code that
    calls ``xr.device_count()`` / ``torch.cuda.device_count()``-style APIs.

    Example:
        >>> device_count() == addressable_runtime_device_count()
        True
    """
    return addressable_runtime_device_count()


def process_index() -> int:
    """Returns this process's index in a multi-process job (0 when alone).

    Example:
        >>> process_index()
        0
    """
    return jax.process_index()


def process_count() -> int:
    """Returns the number of processes in the job (1 when alone).

    Example:
        >>> process_count()
        1
    """
    count: int = jax.process_count()  # typed Any by jax
    return count


def device(index: int | None = None) -> torch.device:
    """Returns the ``torch.device`` for an addressable device, ``xla:<index>``.

    Args:
        index: Local device ordinal; defaults to 0.

    Returns:
        ``torch.device("xla", index)``.

    Raises:
        TypeError: ``index`` is not an int.
        ValueError: ``index`` is negative or not below the number of
            addressable devices.

    Example:
        >>> device()
        device(type='xla', index=0)
        >>> device(1)                # with at least 2 devices
        device(type='xla', index=1)
    """
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int):
        raise ArgumentTypeError(f"device index must be an int, got {type(index).__name__}")
    count = addressable_runtime_device_count()
    if index < 0 or index >= count:
        raise ArgumentError(
            f"device index {index} is out of range: this process has {count} "
            f"addressable device(s) (valid indices 0..{count - 1})"
        )
    return torch.device(DEVICE_TYPE, index)


def devices() -> list[torch.device]:
    """Returns one ``torch.device`` (``xla:i``) per addressable device.

    Example:
        >>> devices()[0]
        device(type='xla', index=0)
    """
    return [torch.device(DEVICE_TYPE, i) for i in range(addressable_runtime_device_count())]


def device_type() -> str:
    """Returns the accelerator type: ``"CPU"``, ``"CUDA"`` or ``"TPU"``.

    ``PJRT_DEVICE`` wins when set (``GPU`` is reported as ``"CUDA"``) and
    then no JAX backend is started. Otherwise the platform of the first JAX
    device decides. A platform spmdtorch has no name for is returned
    upper-cased (e.g. ``"METAL"``).

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` has an unsupported value.
        RuntimeConfigError: ``PJRT_DEVICE`` names one type but JAX is already
            running on another.

    Example:
        >>> device_type()            # doctest: +SKIP
        'CPU'
    """
    wanted = _pjrt_device_from_env()
    if wanted is not None:
        if _backends_initialized():
            actual = _type_of_platform(jax.default_backend())
            if actual != wanted:
                raise RuntimeConfigError(
                    f"PJRT_DEVICE={wanted!r} but JAX is running "
                    f"on {actual}; set PJRT_DEVICE before the first JAX computation."
                )
        return wanted
    return _type_of_platform(jax.devices()[0].platform)
