"""The PJRT platform: ``PJRT_DEVICE`` honoured as PyTorch/XLA honours it, before any JAX backend starts."""

from __future__ import annotations

import os
import warnings

import jax

from spmdtorch import _jax_private, config
from spmdtorch.config import RuntimeConfigError

#: The torch device type that spmdtorch tensors report.
DEVICE_TYPE = "xla"

#: Accepted ``PJRT_DEVICE`` values and the device type each one means (parsed by ``spmdtorch.config``).
_PJRT_DEVICE_ALIASES = config.PJRT_DEVICE_ALIASES

#: Device type -> the platform name ``JAX_PLATFORMS`` expects.
_JAX_PLATFORM_FOR_TYPE = {"CPU": "cpu", "CUDA": "cuda", "TPU": "tpu"}

#: ``jax.Device.platform`` / ``JAX_PLATFORMS`` entry -> device type.
_TYPE_FOR_JAX_PLATFORM = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "tpu": "TPU"}


# --------------------------------------------------------------------------
# Environment handling
# --------------------------------------------------------------------------


def _pjrt_device_from_env() -> str | None:
    """Returns the device type named by ``PJRT_DEVICE``, normalised, or None.

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` is set to an unknown value.
    """
    # Read at the call, not from the process snapshot: the user may set it
    # before the first device query (tests do), as with PyTorch/XLA.
    device: str | None = config.read_one("pjrt_device")
    return device


def _backends_initialized() -> bool:
    """Whether JAX has already created its backends (platform is then fixed)."""
    return _jax_private.backends_initialized()


def _type_of_platform(platform: str) -> str:
    """Maps a JAX platform name ("cpu", "gpu", ...) to a device type name."""
    return _TYPE_FOR_JAX_PLATFORM.get(platform.lower(), platform.upper())


def _apply_pjrt_device_env() -> str | None:
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
                f"PJRT_DEVICE={wanted!r} is ignored: JAX has "
                f"already started on {actual}. Set PJRT_DEVICE before the first "
                "JAX computation (e.g. before importing spmdtorch).",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    # jax.config's per-flag attributes are set at run time, so untyped (jax_platforms
    # has a context manager, so jax.config.read refuses it).
    existing = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms  # type: ignore[attr-defined]
    if existing:
        first = existing.split(",")[0].strip()
        if _type_of_platform(first) != wanted:
            raise RuntimeConfigError(
                f"PJRT_DEVICE={wanted!r} conflicts with JAX_PLATFORMS={existing!r}; unset one of them."
            )
        # Already consistent: keep the user's (possibly longer) list.
        if jax.config.jax_platforms != existing:  # type: ignore[attr-defined]  # see above
            jax.config.update("jax_platforms", existing)
        return None

    os.environ["JAX_PLATFORMS"] = platform
    jax.config.update("jax_platforms", platform)
    return platform
