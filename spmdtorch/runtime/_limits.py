"""Reading tensors that span other hosts: the gather limit (``SPMDTORCH_MAX_GATHER_BYTES``)."""

from __future__ import annotations

from spmdtorch import config
from spmdtorch._checks import ArgumentError

# --------------------------------------------------------------------------
# Reading tensors that span other hosts
# --------------------------------------------------------------------------

#: Environment variable with the default gather limit in bytes.
ENV_MAX_GATHER_BYTES = "SPMDTORCH_MAX_GATHER_BYTES"
_MAX_GATHER: list[int | None] = [None]


class GatherTooLargeError(RuntimeError):
    """Reading a tensor that spans other hosts would copy too much to every host."""


def max_gather_bytes() -> int:
    """The largest tensor (bytes) that ``.cpu()``/``.item()``/``print`` gathers from other processes.

    In a multi-process job, reading a tensor sharded over other hosts' devices
    all-gathers it (every process must do the same read). Larger tensors raise
    :class:`GatherTooLargeError`. ``SPMDTORCH_MAX_GATHER_BYTES`` sets the
    default (1 GiB); :func:`set_max_gather_bytes` overrides it.

    Raises:
        spmdtorch.config.ConfigError: ``SPMDTORCH_MAX_GATHER_BYTES`` is not a whole number >= 0
            (a ``ValueError``).

    Example:
        >>> max_gather_bytes() > 0
        True
    """
    if _MAX_GATHER[0] is not None:
        return _MAX_GATHER[0]
    # At the call (the documented contract: the environment, then the override).
    limit: int = config.read_one("max_gather_bytes")
    return limit


def set_max_gather_bytes(limit: int | None) -> None:
    """Sets the cross-host gather limit in bytes (None: back to the environment/default).

    Raises:
        ArgumentError: ``limit`` is not an int >= 0 or None (a ``ValueError``).

    Example:
        >>> set_max_gather_bytes(2 ** 20); max_gather_bytes()
        1048576
        >>> set_max_gather_bytes(None)
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ArgumentError(
            f"set_max_gather_bytes: limit (max gather bytes) must be an int >= 0 or None, got {limit!r}"
        )
    _MAX_GATHER[0] = limit
