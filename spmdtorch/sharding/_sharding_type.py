"""PyTorch/XLA's ``ShardingType``, computed from a JAX sharding.

PyTorch/XLA reports a sharded tensor's kind as ``xs.ShardingType`` (from
``XLAShardedTensor.sharding_type``), an ``IntEnum`` whose values follow XLA's
``OpSharding.Type``. XLA has one ``OTHER`` type for every tiled sharding;
PyTorch/XLA splits it into PARTIAL (the last tile dimension holds replicas,
``last_tile_dim_replicate``) and TILED. :func:`sharding_type_of` does the same
from the ``HloSharding`` JAX builds for a sharding.

Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))
    >>> sharding_type_of(NamedSharding(mesh, P("x", "y")), ndim=2)
    <ShardingType.TILED: 3>
    >>> sharding_type_of(NamedSharding(mesh, P("x")), ndim=2)
    <ShardingType.PARTIAL: 5>
"""

from __future__ import annotations

import enum

import jax

from spmdtorch.sharding._hlo_sharding import _hlo_and_assignment, _is_single_device

__all__ = ["ShardingType", "sharding_type_of"]


class ShardingType(enum.IntEnum):
    """The kind of a sharding, with PyTorch/XLA's numeric values.

    An ``IntEnum`` (as in PyTorch/XLA) so code comparing against the integers
    ``torch_xla._XLAC._get_xla_sharding_type`` returns keeps working.

    Attributes:
        REPLICATED: Every device holds the whole tensor.
        MAXIMAL: One device holds the whole tensor.
        TUPLE: A sharding of a tuple of values (never returned for one array).
        TILED: Split over all devices, one tile each.
        MANUAL: Manually partitioned (inside ``shard_map`` / manual mesh axes).
        PARTIAL: Split, with each tile replicated over a group of devices
            (``last_tile_dim_replicate``).
        UNKNOWN: Not decided yet, or a layout PyTorch/XLA has no type for
            (JAX's unreduced axes).
    """

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


def sharding_type_of(sharding: jax.sharding.Sharding, ndim: int) -> ShardingType:
    """Returns the :class:`ShardingType` of ``sharding`` for an array of rank ``ndim``.

    The type comes from the ``HloSharding`` that XLA will see, not from the
    PartitionSpec, so a spec over mesh axes of size 1 is REPLICATED and a
    sharding over exactly one device is MAXIMAL (as for PyTorch/XLA's one-device
    meshes), whatever the spec says.

    Args:
        sharding: Any ``jax.sharding.Sharding``.
        ndim: Rank of the array the sharding is for.

    Returns:
        REPLICATED, MAXIMAL, TILED, PARTIAL, MANUAL (fully manual, or tiled with
        a manual subgroup), or UNKNOWN (``{unknown}`` or any unreduced axes).

    Raises:
        TypeError: ``sharding`` is not a JAX sharding or ``ndim`` not an int.
        HloShardingError: The sharding does not fit an array of rank ``ndim``.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        >>> sharding_type_of(NamedSharding(mesh, P()), ndim=1).name
        'REPLICATED'
    """
    hlo, assignment = _hlo_and_assignment(sharding, ndim)
    if hlo.is_unknown():
        return ShardingType.UNKNOWN
    if hlo.is_manual():
        return ShardingType.MANUAL
    if _is_single_device(hlo, assignment):
        return ShardingType.MAXIMAL
    if hlo.is_unreduced():
        return ShardingType.UNKNOWN
    # Replicated before maximal: XLA's is_maximal() (IsTileMaximal) is also
    # true for a replicated sharding.
    if hlo.is_replicated():
        return ShardingType.REPLICATED
    if hlo.is_maximal():
        return ShardingType.MAXIMAL
    if hlo.is_tiled():
        # By name: OpSharding.Type lives in a private jaxlib module.
        subgroups = {t.name for t in hlo.subgroup_types()}
        if "MANUAL" in subgroups:
            return ShardingType.MANUAL
        if "UNREDUCED" in subgroups:
            return ShardingType.UNKNOWN
        # ``last_tile_dims={replicated}`` alone is normalised by XLA to
        # ``last_tile_dim_replicate``; check both anyway.
        if hlo.replicate_on_last_tile_dim() or "REPLICATED" in subgroups:
            return ShardingType.PARTIAL
        return ShardingType.TILED
    return ShardingType.UNKNOWN
