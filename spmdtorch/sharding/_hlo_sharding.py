"""HLO sharding strings in PyTorch/XLA's explicit-device-list form.

PyTorch/XLA users read shardings as XLA ``HloSharding`` strings
(``torch_xla._XLAC._get_xla_sharding_spec(t)``)::

    {devices=[4,1]0,1,2,3}                              4-way tiled on dim 0
    {devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}    2-way tiled, 2-way replicated
    {replicated}                                        every device has it all
    {maximal device=0}                                  one device has it all

JAX builds the same ``HloSharding`` but prints the compact *iota* form
(``{devices=[4,2]<=[8]}``, ``{devices=[4,1,2]<=[2,4]T(1,0) ...}``), and its device
numbers are positions in the sharding's own device assignment rather than
global device numbers. :func:`hlo_sharding_string` rewrites a JAX sharding into
the explicit form with *logical ordinals*: the position of each device in
:func:`logical_device_order` (``sorted(devices, key=(process_index, id))``, the
order ``spmdtorch.mesh`` numbers devices in). On one CPU process the ordinals
are the JAX ids ``0..N-1``; with several processes they stay dense (process 1's
CPU devices, JAX ids 2048.., become ordinals 4.. on a 2 x 4 setup).

:func:`parse_hlo_sharding_string` is the reverse, used by
:func:`spmdtorch.sharding.visualize_sharding`; it accepts the explicit form and JAX's
iota form.

Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    >>> hlo_sharding_string(NamedSharding(mesh, P("x", None)), ndim=2)
    '{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}'
    >>> parse_hlo_sharding_string("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}")
    ParsedHloSharding(tile_dims=(2, 1, 2), devices=(0, 1, 2, 3), last_tile_dim_replicate=True)
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from spmdtorch._checks import ArgumentTypeError

__all__ = [
    "HloShardingError",
    "ParsedHloSharding",
    "logical_device_order",
    "hlo_sharding_string",
    "parse_hlo_sharding_string",
]


class HloShardingError(ValueError):
    """A sharding cannot be turned into, or read back from, an HLO string."""


class HloShardingTypeError(HloShardingError, ArgumentTypeError):
    """An argument of the wrong type (a ``TypeError`` too, as before it was named)."""


# --------------------------------------------------------------------------
# Device ordinals
# --------------------------------------------------------------------------


def logical_device_order(devices: Sequence[Any] | None = None) -> list[Any]:
    """Returns devices in logical-ordinal order: sorted by ``(process_index, id)``.

    Ordinal ``i`` in a sharding string is the ``i``-th device of this list. Raw
    ``Device.id`` values are not dense across processes (process 1's CPU devices
    start at 2048) and ``jax.devices()`` promises no order, so sorting by
    ``(process_index, id)`` gives every process the same dense numbering.

    Args:
        devices: Any objects with ``process_index`` and ``id`` attributes;
            defaults to ``jax.devices()``.

    Returns:
        A new list, sorted.

    Example:
        >>> from types import SimpleNamespace as D
        >>> devs = [D(id=2048, process_index=1), D(id=1, process_index=0),
        ...         D(id=0, process_index=0), D(id=2049, process_index=1)]
        >>> [d.id for d in logical_device_order(devs)]
        [0, 1, 2048, 2049]
    """
    if devices is None:
        devices = jax.devices()
    return sorted(_check_devices(devices, "devices"), key=lambda d: (d.process_index, d.id))


def _check_devices(devices: Any, param: str) -> list[Any]:
    """``list(devices)`` if it is a sequence of device-like objects (``process_index`` and ``id``)."""
    if isinstance(devices, (str, bytes)) or not isinstance(devices, (Sequence, np.ndarray)):
        raise HloShardingTypeError(
            f"{param} must be a sequence of jax devices, got {type(devices).__name__} {devices!r}"
        )
    out = list(devices)
    for i, d in enumerate(out):
        if not (hasattr(d, "process_index") and hasattr(d, "id")):
            raise HloShardingTypeError(
                f"{param}[{i}] must be a jax device (with process_index and id), got {type(d).__name__} {d!r}"
            )
    return out


def _default_device_order(assignment: Sequence[Any]) -> list[Any]:
    """All devices of the assignment's platform, in logical-ordinal order."""
    # Ordinals count every device of the platform the sharding lives on, not
    # only the sharding's own devices: a mesh over devices 4..7 must print
    # 4..7, as PyTorch/XLA does for a sub-mesh.
    platform = assignment[0].platform
    try:
        devices = jax.devices(platform)
    except RuntimeError:  # platform name JAX does not accept as a backend
        devices = jax.devices()
    return logical_device_order(devices)


def _device_key(d: Any) -> tuple[Any, int, int]:
    # Identify devices by value, not object identity: a device is its
    # platform, process and id (ids are unique within a platform).
    return (getattr(d, "platform", None), d.process_index, d.id)


def _ordinal_map(assignment: Sequence[Any], device_order: Sequence[Any] | None) -> list[int]:
    """Maps each position of ``assignment`` to its logical ordinal.

    Raises:
        HloShardingError: A device of the assignment is not in ``device_order``.
    """
    order = _default_device_order(assignment) if device_order is None else _check_devices(device_order, "device_order")
    index = {_device_key(d): i for i, d in enumerate(order)}
    if len(index) != len(order):
        raise HloShardingError(f"device_order lists a device twice: {order}")
    ordinals = []
    for d in assignment:
        key = _device_key(d)
        if key not in index:
            raise HloShardingError(
                f"device {d} of the sharding is not in device_order {order}; "
                "device_order must list every device the sharding uses"
            )
        ordinals.append(index[key])
    return ordinals


# --------------------------------------------------------------------------
# Sharding -> HloSharding
# --------------------------------------------------------------------------


def _check_ndim(ndim: Any) -> int:
    if isinstance(ndim, bool) or not isinstance(ndim, (int, np.integer)):
        raise HloShardingTypeError(f"ndim must be an int, got {type(ndim).__name__}: {ndim!r}")
    if ndim < 0:
        raise HloShardingError(f"ndim must be >= 0, got {ndim}")
    return int(ndim)


def _hlo_and_assignment(sharding: Any, ndim: Any) -> tuple[Any, tuple[Any, ...]]:
    """Returns ``(xla HloSharding, device assignment)`` for a JAX sharding.

    HloSharding device numbers index into the device assignment (for a
    NamedSharding, ``mesh.devices.flat``), not into ``jax.devices()``.

    Raises:
        TypeError: ``sharding`` is not a ``jax.sharding.Sharding``.
        HloShardingError: The sharding does not fit an array of rank ``ndim``.
    """
    if not isinstance(sharding, jax.sharding.Sharding):
        raise HloShardingTypeError(
            f"sharding: expected a jax.sharding.Sharding, got {type(sharding).__name__}: {sharding!r}"
        )
    ndim = _check_ndim(ndim)
    try:
        hlo = sharding._to_xla_hlo_sharding(ndim)
    except Exception as e:  # JAX raises IndexError/ValueError for a too-long spec
        raise HloShardingError(f"sharding {sharding} does not fit an array of rank {ndim}: {e}") from e
    assignment = tuple(sharding._device_assignment)
    if hlo.is_tiled():
        extra = int(hlo.replicate_on_last_tile_dim()) + len(hlo.subgroup_types())
        dims = hlo.tile_assignment_dimensions()
        if len(dims) != ndim + extra:
            raise HloShardingError(
                f"sharding {sharding} gives {len(dims)} tile dimensions {dims} for an "
                f"array of rank {ndim} (expected {ndim + extra})"
            )
    return hlo, assignment


def _is_single_device(hlo: Any, assignment: tuple[Any, ...]) -> bool:
    # PyTorch/XLA gives a tensor on a one-device mesh MAXIMAL sharding
    # (``{maximal device=N}``); JAX says ``{replicated}`` for the same thing.
    return len(assignment) == 1 and not hlo.is_manual() and not hlo.is_unknown()


def _format_tiled(
    tile_dims: Sequence[int],
    devices: Sequence[int],
    last_tile_dim_replicate: bool = False,
    subgroups: Sequence[str] = (),
) -> str:
    """Formats the explicit tiled form the way XLA's ``HloSharding::ToString`` does."""
    s = "{devices=[" + ",".join(str(int(d)) for d in tile_dims) + "]"
    s += ",".join(str(int(d)) for d in devices)
    if last_tile_dim_replicate:
        s += " last_tile_dim_replicate"
    if subgroups:
        s += " last_tile_dims={" + ", ".join(subgroups) + "}"
    return s + "}"


def hlo_sharding_string(
    sharding: jax.sharding.Sharding,
    ndim: int,
    device_order: Sequence[Any] | None = None,
) -> str:
    """Returns the HLO sharding string PyTorch/XLA would print for ``sharding``.

    The string has an explicit device list of logical ordinals (see
    :func:`logical_device_order`) instead of JAX's iota form, so it matches
    ``torch_xla._XLAC._get_xla_sharding_spec``. Forms produced:

    * ``{devices=[4,1]0,1,2,3}``: tiled (``ShardingType.TILED``).
    * ``{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}``: tiled, each tile
      replicated over the devices of the last tile dimension
      (``ShardingType.PARTIAL``).
    * ``{replicated}``: on every device of the sharding.
    * ``{maximal device=3}``: a sharding over exactly one device (JAX itself
      calls this ``{replicated}``; PyTorch/XLA gives one-device meshes MAXIMAL).
    * ``{manual}`` or ``... last_tile_dims={manual}}``: manual axes
      (``shard_map``); JAX's unreduced axes print as ``{unreduced}`` /
      ``last_tile_dims={unreduced, ...}``, as XLA prints them.

    Args:
        sharding: Any ``jax.sharding.Sharding`` (usually a ``NamedSharding``).
        ndim: Rank of the array the sharding is for; a PartitionSpec shorter
            than ``ndim`` leaves the remaining dimensions unsharded.
        device_order: The devices in ordinal order; device ``device_order[i]``
            prints as ``i``. Defaults to :func:`logical_device_order` of all
            devices of the sharding's platform.

    Returns:
        The sharding string.

    Raises:
        TypeError: ``sharding`` is not a JAX sharding or ``ndim`` not an int.
        HloShardingError: The sharding does not fit rank ``ndim``, is a tuple
            sharding, or uses a device missing from ``device_order``.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:4]).reshape(4), ("data",))
        >>> hlo_sharding_string(NamedSharding(mesh, P("data")), ndim=2)
        '{devices=[4,1]0,1,2,3}'
        >>> hlo_sharding_string(NamedSharding(mesh, P()), ndim=2)
        '{replicated}'
    """
    hlo, assignment = _hlo_and_assignment(sharding, ndim)
    ordinals = _ordinal_map(assignment, device_order)
    if _is_single_device(hlo, assignment):
        return f"{{maximal device={ordinals[0]}}}"
    if hlo.is_manual():
        return "{manual}"
    if hlo.is_unknown():
        return "{unknown}"
    if hlo.is_unreduced():
        return "{unreduced}"
    if hlo.is_replicated():
        return "{replicated}"
    if hlo.is_maximal():
        return f"{{maximal device={ordinals[hlo.tile_assignment_devices()[0]]}}}"
    if hlo.is_tiled():
        return _format_tiled(
            hlo.tile_assignment_dimensions(),
            [ordinals[i] for i in hlo.tile_assignment_devices()],
            hlo.replicate_on_last_tile_dim(),
            [t.name.lower() for t in hlo.subgroup_types()],
        )
    raise HloShardingError(f"sharding {sharding} has an HLO sharding {hlo} with no array form")


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------


class ParsedHloSharding(NamedTuple):
    """An HLO sharding string taken apart; unpacks as a 3-tuple.

    Attributes:
        tile_dims: Tiles per tensor dimension, plus the replication factor last
            when ``last_tile_dim_replicate``. Empty for ``{replicated}`` and
            ``{maximal ...}``.
        devices: Device ordinals in tile order (row-major over ``tile_dims``).
            Empty for ``{replicated}`` (meaning every device); one ordinal for
            ``{maximal device=N}``.
        last_tile_dim_replicate: Whether the last entry of ``tile_dims`` counts
            replicas rather than tiles.
    """

    tile_dims: tuple[int, ...]
    devices: tuple[int, ...]
    last_tile_dim_replicate: bool

    @property
    def is_replicated(self) -> bool:
        """True for ``{replicated}``."""
        return not self.tile_dims and not self.devices

    @property
    def is_maximal(self) -> bool:
        """True for ``{maximal device=N}``."""
        return not self.tile_dims and len(self.devices) == 1

    @property
    def tensor_rank(self) -> int | None:
        """Rank of the tensor a tiled sharding is for; None when not tiled."""
        if not self.tile_dims:
            return None
        return len(self.tile_dims) - int(self.last_tile_dim_replicate)

    def device_grid(self) -> np.ndarray:
        """The tile assignment as an array of shape ``tile_dims``.

        Example:
            >>> parse_hlo_sharding_string("{devices=[2,2]0,2,1,3}").device_grid()
            array([[0, 2],
                   [1, 3]])
        """
        if not self.tile_dims:
            raise HloShardingError("a replicated or maximal sharding has no tile grid")
        return np.array(self.devices, dtype=np.int64).reshape(self.tile_dims)


_INT_LIST = r"\d+(?:\s*,\s*\d+)*"
_TILED_RE = re.compile(
    r"\{\s*devices\s*=\s*\[(?P<dims>" + _INT_LIST + r")\]\s*"
    r"(?:(?P<list>" + _INT_LIST + r")"
    r"|<=\s*\[(?P<iota>" + _INT_LIST + r")\]\s*(?:T\((?P<perm>" + _INT_LIST + r")\))?)"
    r"\s*(?P<rep>last_tile_dim_replicate)?\s*\}"
)
_MAXIMAL_RE = re.compile(r"\{\s*maximal\s+device\s*=\s*(?P<dev>\d+)\s*\}")
_REPLICATED_RE = re.compile(r"\{\s*replicated\s*\}")

_EXPECTED = (
    "expected '{replicated}', '{maximal device=N}', "
    "'{devices=[d0,d1,...]i0,i1,...}' with an optional ' last_tile_dim_replicate' "
    "before the closing brace, or JAX's iota form '{devices=[...]<=[...]T(...)}'"
)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _iota_devices(reshape: list[int], perm: list[int] | None, s: str) -> list[int]:
    """Expands XLA's iota tile assignment ``<=[reshape]T(perm)``."""
    if perm is None:
        perm = list(range(len(reshape)))
    if sorted(perm) != list(range(len(reshape))):
        raise HloShardingError(
            f"bad HLO sharding string {s!r}: T{tuple(perm)} is not a permutation "
            f"of the {len(reshape)} iota dimensions {reshape}"
        )
    n = math.prod(reshape)
    return np.arange(n).reshape(reshape).transpose(perm).reshape(-1).tolist()


def parse_hlo_sharding_string(s: str) -> ParsedHloSharding:
    """Parses an HLO sharding string into tile dims, devices and replication.

    Accepts PyTorch/XLA's explicit form (any number of digits per device, so
    ordinals >= 10 work), JAX's iota form, ``{replicated}`` and
    ``{maximal device=N}``. Whitespace around tokens is ignored.

    Args:
        s: The sharding string.

    Returns:
        A :class:`ParsedHloSharding` ``(tile_dims, devices,
        last_tile_dim_replicate)``.

    Raises:
        TypeError: ``s`` is not a str.
        HloShardingError: ``s`` is not one of the forms above, the device count
            does not match the tile dims, a device repeats, or it carries
            manual/unreduced subgroups (``last_tile_dims={...}``), metadata,
            or another form this parser does not model.

    Example:
        >>> parse_hlo_sharding_string("{devices=[4,1]0,1,2,3}")
        ParsedHloSharding(tile_dims=(4, 1), devices=(0, 1, 2, 3), last_tile_dim_replicate=False)
        >>> parse_hlo_sharding_string("{devices=[2,2]<=[2,2]T(1,0)}").devices
        (0, 2, 1, 3)
        >>> parse_hlo_sharding_string("{replicated}")
        ParsedHloSharding(tile_dims=(), devices=(), last_tile_dim_replicate=False)
    """
    if not isinstance(s, str):
        raise HloShardingTypeError(f"s: expected an HLO sharding string, got {type(s).__name__}: {s!r}")
    text = s.strip()
    if _REPLICATED_RE.fullmatch(text):
        return ParsedHloSharding((), (), False)
    m = _MAXIMAL_RE.fullmatch(text)
    if m:
        return ParsedHloSharding((), (int(m.group("dev")),), False)
    m = _TILED_RE.fullmatch(text)
    if not m:
        if "last_tile_dims" in text or "manual" in text or "unreduced" in text:
            why = "manual/unreduced subgroup shardings (last_tile_dims={...}) cannot be parsed"
        else:
            why = _EXPECTED
        raise HloShardingError(f"bad HLO sharding string {s!r}: {why}")
    tile_dims = _ints(m.group("dims"))
    if any(d < 1 for d in tile_dims):
        raise HloShardingError(f"bad HLO sharding string {s!r}: tile dimensions {tile_dims} must all be >= 1")
    if m.group("list") is not None:
        devices = _ints(m.group("list"))
    else:
        perm = _ints(m.group("perm")) if m.group("perm") else None
        devices = _iota_devices(_ints(m.group("iota")), perm, s)
    expected = math.prod(tile_dims)
    if len(devices) != expected:
        raise HloShardingError(
            f"bad HLO sharding string {s!r}: tile dimensions {tile_dims} need {expected} devices, got {len(devices)}"
        )
    if len(set(devices)) != len(devices):
        raise HloShardingError(f"bad HLO sharding string {s!r}: a device is listed twice")
    return ParsedHloSharding(tuple(tile_dims), tuple(devices), m.group("rep") is not None)
