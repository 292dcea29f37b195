"""DTensor placements <-> PyTorch/XLA partition specs, shared by the DTensor bridge and ``XLAShardedTensor``.

``torch.distributed``'s DTensor describes a layout per *mesh* dimension
(``[Replicate(), Shard(0)]``: mesh dim 1 splits tensor dim 0); PyTorch/XLA's
partition spec describes it per *tensor* dimension (``(1, None)``). This
module converts between the two and builds the ``DTensorSpec`` that
``XLAShardedTensor._spec`` / ``.placements`` report, and the re-annotation
behind ``XLAShardedTensor.redistribute``.

It imports no other compat module, so both ``spmdtorch.compat._dtensor``
(``torch_xla.distributed.spmd.api``) and ``spmdtorch.compat._sharded_tensor``
can use it without an import cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from spmdtorch import runtime, sharding
from spmdtorch.compat.errors import CompatError
from spmdtorch.mesh import Mesh

__all__ = [
    "DeviceMeshMismatchError",
    "MissingShardingInfoError",
    "PlacementsLengthError",
    "Redistributed",
    "ShardDimError",
    "UnsupportedPlacementError",
    "device_mesh_of",
    "dtensor_spec",
    "partition_spec_to_placements",
    "placements_to_partition_spec",
    "redistribute",
]

PartitionSpec = tuple[Any, ...]


class PlacementsLengthError(CompatError, ValueError):
    """``placements`` does not have one entry per mesh dimension (a ``ValueError``, as in PyTorch/XLA)."""


class ShardDimError(CompatError, IndexError):
    """A ``Shard(dim)`` names a tensor dimension the tensor does not have (an ``IndexError``, as in PyTorch/XLA)."""


class UnsupportedPlacementError(CompatError, NotImplementedError, ValueError):
    """A placement other than ``Shard``/``Replicate`` (``Partial``: a pending reduction has no XLA annotation).

    Both a ``NotImplementedError`` (what ``XLAShardedTensor.redistribute`` raises
    in PyTorch/XLA) and a ``ValueError`` (what ``xla_distribute_tensor`` raises).
    """


class MissingShardingInfoError(CompatError, ValueError):
    """An ``XLAShardedTensor`` without ``mesh_shape``/``partition_spec`` was asked for its DTensor spec."""


class DeviceMeshMismatchError(CompatError, AssertionError):
    """A ``torch.distributed`` ``DeviceMesh`` that cannot become an spmdtorch mesh.

    An ``AssertionError`` because PyTorch/XLA asserts these conditions and its
    tests (and users' ``except`` clauses) expect that type.
    """


def _mesh_ndim(device_mesh: Any, what: str) -> int:
    if isinstance(device_mesh, Mesh):
        return len(device_mesh.mesh_shape)
    if isinstance(device_mesh, DeviceMesh):
        return int(device_mesh.ndim)
    raise TypeError(
        f"{what}: device_mesh must be a torch_xla.distributed.spmd.Mesh (spmdtorch.mesh.Mesh) or a "
        f"torch.distributed DeviceMesh('xla', ...), got {type(device_mesh).__name__}"
    )


def placements_to_partition_spec(
    placements: Sequence[Placement], ndim: int, *, what: str = "placements"
) -> PartitionSpec:
    """PyTorch/XLA's partition spec (one entry per tensor dim) for DTensor ``placements`` (one per mesh dim).

    ``Shard(d)`` on mesh dim ``i`` puts ``i`` at tensor dim ``d``; ``Replicate()``
    adds nothing. Two mesh dims sharding the same tensor dim give that dim the
    tuple of both (``[Shard(0), Shard(0)]`` -> ``((0, 1), ...)``), which is
    DTensor's meaning (PyTorch/XLA keeps only the last).

    Args:
        placements: one ``Shard``/``Replicate`` per mesh dim.
        ndim: the tensor's rank.
        what: the caller's name, for messages.

    Returns:
        A tuple of ``ndim`` entries: None, a mesh dim index, or a tuple of them.

    Raises:
        ShardDimError: a ``Shard`` dim is outside ``[-ndim, ndim)``.
        UnsupportedPlacementError: a ``Partial`` or another placement type.
    """
    per_dim: list[list[int]] = [[] for _ in range(ndim)]
    for mesh_dim, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise ShardDimError(
                    f"{what}[{mesh_dim}] is Shard({p.dim}) but the tensor has {ndim} dims; "
                    f"use a dim in [{-ndim}, {ndim})"
                )
            per_dim[d].append(mesh_dim)
        elif isinstance(p, Replicate):
            continue
        elif isinstance(p, Partial):
            raise UnsupportedPlacementError(
                f"{what}[{mesh_dim}] is {p!r}: a pending reduction has no XLA sharding annotation; use Shard or "
                "Replicate placements (reduce the values first, e.g. with a sum, if they are partial sums)"
            )
        else:
            raise UnsupportedPlacementError(
                f"{what}[{mesh_dim}] has unsupported placement type {type(p).__name__}; use Shard or Replicate"
            )
    return tuple(None if not axes else axes[0] if len(axes) == 1 else tuple(axes) for axes in per_dim)


def partition_spec_to_placements(
    partition_spec: Sequence[Any], mesh_ndim: int, axis_names: Sequence[str] | None = None
) -> tuple[Placement, ...]:
    """DTensor placements (one per mesh dim) for a PyTorch/XLA partition spec (one entry per tensor dim).

    Args:
        partition_spec: entries None, a mesh axis index or name, or a tuple of those.
        mesh_ndim: the number of mesh dims.
        axis_names: the mesh's axis names, when the spec uses names.

    Returns:
        ``Shard(d)`` for each mesh dim that splits tensor dim ``d``, else ``Replicate()``.

    Raises:
        MissingShardingInfoError: an entry names an axis the mesh does not have.
    """
    names = list(axis_names or ())
    placements: list[Placement] = [Replicate() for _ in range(mesh_ndim)]
    for tensor_dim, entry in enumerate(partition_spec):
        axes = entry if isinstance(entry, tuple) else (entry,)
        for axis in axes:
            if axis is None:
                continue
            index = names.index(axis) if isinstance(axis, str) and axis in names else axis
            if not isinstance(index, int) or not 0 <= index < mesh_ndim:
                raise MissingShardingInfoError(
                    f"partition_spec {tuple(partition_spec)} entry {tensor_dim} names mesh axis {axis!r}, but the "
                    f"mesh has {mesh_ndim} axes (names {tuple(names) or None}); use an axis index below {mesh_ndim}"
                )
            if isinstance(placements[index], Replicate):  # the first tensor dim a mesh dim splits wins
                placements[index] = Shard(tensor_dim)
    return tuple(placements)


def device_mesh_of(mesh_shape: Sequence[int], device_ids: Sequence[int] | None = None) -> DeviceMesh:
    """A ``DeviceMesh("xla", ...)`` of ``mesh_shape`` over ``device_ids`` (default: all devices in order).

    Needs no process group: ``torch.distributed`` skips process-group setup for
    the ``xla`` device type (one SPMD program drives every device).
    """
    ids = list(range(runtime.global_runtime_device_count())) if device_ids is None else [int(i) for i in device_ids]
    return DeviceMesh("xla", torch.tensor(ids, dtype=torch.int64).reshape(tuple(mesh_shape)))


def dtensor_spec(
    global_tensor: torch.Tensor,
    mesh_shape: Sequence[int] | None,
    partition_spec: Sequence[Any] | None,
    *,
    device_ids: Sequence[int] | None = None,
    axis_names: Sequence[str] | None = None,
) -> DTensorSpec:
    """The ``DTensorSpec`` of a tensor sharded as ``partition_spec`` over a mesh of ``mesh_shape``.

    What ``XLAShardedTensor._spec`` reports: an ``xla`` ``DeviceMesh``, one
    placement per mesh dim, and the global tensor's shape, stride and dtype.

    Raises:
        MissingShardingInfoError: ``mesh_shape`` or ``partition_spec`` is None
            (a tensor wrapped without them, e.g. an op's output).
    """
    if mesh_shape is None:
        raise MissingShardingInfoError(
            "mesh_shape must be specified to create DTensorSpec. If this tensor was created through torch "
            "operations, it may be auto-wrapped. Use wrap_as_sharded_tensor() to set mesh_shape before accessing "
            "_spec."
        )
    if partition_spec is None:
        raise MissingShardingInfoError(
            "partition_spec must be specified to create DTensorSpec. If this tensor was created through torch "
            "operations, it may be auto-wrapped. Use wrap_as_sharded_tensor() to set partition_spec before "
            "accessing _spec."
        )
    mesh = device_mesh_of(mesh_shape, device_ids)
    placements = partition_spec_to_placements(partition_spec, len(tuple(mesh_shape)), axis_names)
    meta = TensorMeta(shape=global_tensor.shape, stride=global_tensor.stride(), dtype=global_tensor.dtype)
    return DTensorSpec(mesh=mesh, placements=placements, tensor_meta=meta)


class Redistributed(NamedTuple):
    """What :func:`redistribute` produced: the annotated tensor, its mesh and partition spec."""

    tensor: torch.Tensor
    mesh: Mesh
    partition_spec: PartitionSpec


def _as_mesh(device_mesh: Mesh | DeviceMesh) -> Mesh:
    if isinstance(device_mesh, Mesh):
        return device_mesh
    ids = [int(i) for i in device_mesh.mesh.flatten().tolist()]
    return Mesh(ids, tuple(device_mesh.mesh.shape), device_mesh.mesh_dim_names)


def redistribute(
    global_tensor: torch.Tensor,
    device_mesh: Mesh | DeviceMesh,
    placements: Sequence[Placement],
    *,
    async_op: bool = False,
) -> Redistributed:
    """Re-annotate ``global_tensor`` with DTensor ``placements`` over ``device_mesh`` (``XLAShardedTensor.redistribute``).

    The tensor's previous annotation is replaced (PyTorch/XLA's custom-sharding
    annotation). With ``async_op=True`` a copy is annotated instead, leaving the
    original's layout alone (PyTorch/XLA's form of an asynchronous redistribute:
    the reshard is part of the next program either way).

    Args:
        global_tensor: an xla tensor.
        device_mesh: an spmdtorch/``xs`` ``Mesh`` or an ``xla`` ``DeviceMesh``.
        placements: one ``Shard``/``Replicate`` per mesh dim.
        async_op: annotate a clone rather than the tensor itself.

    Raises:
        PlacementsLengthError: ``len(placements)`` differs from the mesh's rank.
        ShardDimError, UnsupportedPlacementError: as :func:`placements_to_partition_spec`.
    """
    mesh_ndim = _mesh_ndim(device_mesh, "redistribute")
    if len(placements) != mesh_ndim:
        raise PlacementsLengthError(
            f"Number of placements ({len(placements)}) must match mesh dimensions ({mesh_ndim}); "
            "give one Shard/Replicate per mesh dim"
        )
    spec = placements_to_partition_spec(placements, global_tensor.dim())
    mesh = _as_mesh(device_mesh)
    target = global_tensor.clone() if async_op else global_tensor
    # spmdtorch's mark_sharding refuses to overwrite a different annotation; redistribute is that overwrite.
    sharding.clear_sharding(target)
    sharding.mark_sharding(target, mesh, spec)
    return Redistributed(target, mesh, spec)
