"""Runtime queries and configuration: devices, process counts, compile cache.

This module is spmdtorch's counterpart of ``torch_xla.runtime``. It is a thin,
honest layer over JAX's runtime: every count and index comes straight from
``jax``, and the ``torch.device`` objects it hands out are the ``xla:N``
devices that spmdtorch tensors report.

Example:
    >>> import spmdtorch.runtime as xr
    >>> xr.device()
    device(type='xla', index=0)
    >>> xr.device_type()          # doctest: +SKIP
    'CPU'
    >>> xr.global_runtime_device_count()   # doctest: +SKIP
    8

Environment:
    ``PJRT_DEVICE`` is honoured the way PyTorch/XLA honours it: ``CPU``,
    ``CUDA`` (or its alias ``GPU``) or ``TPU``. When it is set before any JAX
    backend starts, :func:`_apply_pjrt_device_env` (called when ``spmdtorch``
    is imported) points JAX at that platform via ``JAX_PLATFORMS``.
"""

from __future__ import annotations

import os
import warnings
from typing import Optional

import jax
import torch

__all__ = [
    "RuntimeConfigError",
    "InvalidPjrtDeviceError",
    "device",
    "devices",
    "device_count",
    "global_runtime_device_count",
    "addressable_runtime_device_count",
    "process_index",
    "process_count",
    "device_type",
    "jax_devices",
    "local_jax_devices",
    "initialize_cache",
]

#: The torch device type that spmdtorch tensors report.
DEVICE_TYPE = "xla"

#: Accepted ``PJRT_DEVICE`` values and the device type each one means.
_PJRT_DEVICE_ALIASES = {"CPU": "CPU", "CUDA": "CUDA", "GPU": "CUDA", "TPU": "TPU"}

#: Device type -> the platform name ``JAX_PLATFORMS`` expects.
_JAX_PLATFORM_FOR_TYPE = {"CPU": "cpu", "CUDA": "cuda", "TPU": "tpu"}

#: ``jax.Device.platform`` / ``JAX_PLATFORMS`` entry -> device type.
_TYPE_FOR_JAX_PLATFORM = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "tpu": "TPU"}


class RuntimeConfigError(RuntimeError):
    """The runtime configuration (environment, JAX config) is inconsistent."""


class InvalidPjrtDeviceError(RuntimeConfigError, ValueError):
    """``PJRT_DEVICE`` names a device type spmdtorch does not support."""


# --------------------------------------------------------------------------
# Environment handling
# --------------------------------------------------------------------------


def _pjrt_device_from_env() -> Optional[str]:
    """Returns the device type named by ``PJRT_DEVICE``, normalised, or None.

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` is set to an unknown value.
    """
    raw = os.environ.get("PJRT_DEVICE")
    if raw is None or raw.strip() == "":
        return None
    key = raw.strip().upper()
    if key not in _PJRT_DEVICE_ALIASES:
        raise InvalidPjrtDeviceError(
            f"PJRT_DEVICE={raw!r} is not supported; expected one of "
            f"{', '.join(sorted(_PJRT_DEVICE_ALIASES))} (GPU is an alias of CUDA)."
        )
    return _PJRT_DEVICE_ALIASES[key]


def _backends_initialized() -> bool:
    """Whether JAX has already created its backends (platform is then fixed)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - private module moved
        return False
    check = getattr(xla_bridge, "backends_are_initialized", None)
    if check is None:  # pragma: no cover - private API changed
        return False
    return bool(check())


def _type_of_platform(platform: str) -> str:
    """Maps a JAX platform name ("cpu", "gpu", ...) to a device type name."""
    return _TYPE_FOR_JAX_PLATFORM.get(platform.lower(), platform.upper())


def _apply_pjrt_device_env() -> Optional[str]:
    """Points JAX at the platform named by ``PJRT_DEVICE``, if it is set.

    ``spmdtorch/__init__.py`` calls this at import. It only acts while no JAX
    backend has started: it then sets ``JAX_PLATFORMS`` in the environment
    (inherited by child processes) and the ``jax_platforms`` config option
    (which JAX read from the environment when it was imported).

    Returns:
        The JAX platform name it configured (``"cpu"``, ``"cuda"`` or
        ``"tpu"``), or None when it changed nothing.

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` has an unsupported value.
        RuntimeConfigError: ``JAX_PLATFORMS`` (or ``jax_platforms``) is already
            set to a different platform than ``PJRT_DEVICE`` asks for.

    Example:
        >>> import os
        >>> os.environ["PJRT_DEVICE"] = "CPU"   # before any JAX computation
        >>> _apply_pjrt_device_env()            # doctest: +SKIP
        'cpu'
    """
    wanted = _pjrt_device_from_env()
    if wanted is None:
        return None
    platform = _JAX_PLATFORM_FOR_TYPE[wanted]

    if _backends_initialized():
        actual = _type_of_platform(jax.default_backend())
        if actual != wanted:
            warnings.warn(
                f"PJRT_DEVICE={os.environ['PJRT_DEVICE']!r} is ignored: JAX has "
                f"already started on {actual}. Set PJRT_DEVICE before the first "
                "JAX computation (e.g. before importing spmdtorch).",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    existing = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms
    if existing:
        first = existing.split(",")[0].strip()
        if _type_of_platform(first) != wanted:
            raise RuntimeConfigError(
                f"PJRT_DEVICE={os.environ['PJRT_DEVICE']!r} conflicts with "
                f"JAX_PLATFORMS={existing!r}; unset one of them."
            )
        # Already consistent: keep the user's (possibly longer) list.
        if jax.config.jax_platforms != existing:
            jax.config.update("jax_platforms", existing)
        return None

    os.environ["JAX_PLATFORMS"] = platform
    jax.config.update("jax_platforms", platform)
    return platform


# --------------------------------------------------------------------------
# Devices and counts
# --------------------------------------------------------------------------


def jax_devices() -> list:
    """Returns every JAX device of the job (all processes), ``jax.devices()``.

    Example:
        >>> len(jax_devices()) == global_runtime_device_count()
        True
    """
    return list(jax.devices())


def local_jax_devices() -> list:
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
    return jax.process_count()


def device(index: Optional[int] = None) -> torch.device:
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
        raise TypeError(f"device index must be an int, got {type(index).__name__}")
    count = addressable_runtime_device_count()
    if index < 0 or index >= count:
        raise ValueError(
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
                    f"PJRT_DEVICE={os.environ['PJRT_DEVICE']!r} but JAX is running "
                    f"on {actual}; set PJRT_DEVICE before the first JAX computation."
                )
        return wanted
    return _type_of_platform(jax.devices()[0].platform)


# --------------------------------------------------------------------------
# Persistent compilation cache
# --------------------------------------------------------------------------


def initialize_cache(path: str | os.PathLike, readonly: bool = False) -> None:
    """Turns on JAX's persistent compilation cache in directory ``path``.

    Compiled XLA executables are stored in ``path`` and looked up there before
    compiling, so a restarted training job skips recompilation. Every program
    is cached, however small or fast to compile (JAX's default skips programs
    that compile in under a second).

    ``readonly=True`` reads existing entries but never adds one: JAX has no
    read-only switch, so this sets the minimum compile time for writing to
    infinity and keeps size-based eviction off (it would write access-time
    files). Use it on every worker but one when several share a cache
    directory. Two limits remain, both JAX's: JAX creates ``path`` if it does
    not exist, and on GPU, XLA's per-fusion autotuning cache (a subdirectory
    of ``path``) is still updated by process 0 (turning that cache off would
    change the cache keys, so no entry written by a writer would ever match).

    The cache applies to programs compiled after this call; programs already
    compiled in this process stay in memory and are not written. Calling it
    again switches to the new settings for later compilations.

    Args:
        path: Cache directory (local path, or a URL that JAX's ``etils.epath``
            support understands, e.g. ``gs://...``).
        readonly: Read entries but never write them.

    Raises:
        ValueError: ``path`` is empty.

    Example:
        >>> import spmdtorch.runtime as xr
        >>> xr.initialize_cache("/tmp/spmdtorch_cache")          # doctest: +SKIP
        >>> xr.initialize_cache("/shared/cache", readonly=True)  # doctest: +SKIP
    """
    path = os.fspath(path)
    if not path:
        raise ValueError("initialize_cache: path must be a non-empty directory path")

    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    # -1 means "no size threshold, and let no backend override it".
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if readonly:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
        jax.config.update("jax_compilation_cache_max_size", -1)
    else:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX opens its cache once per process; drop it so the settings above
    # (notably a new path) take effect at the next compilation.
    cc.reset_cache()
