"""DTensor placements <-> spmdtorch partition specs over the root mesh.

A DTensor layout is one placement per *mesh* dim (``[Shard(0), Replicate()]``);
a partition spec is one entry per *tensor* dim over the root mesh's axes
(``("dp", None)``). ``Shard(d)`` on mesh dim ``i`` puts the root axes that dim
spans at tensor dim ``d`` (two mesh dims sharding one tensor dim give it both,
in mesh-dim order, which is DTensor's default shard order). ``Replicate()`` adds
nothing, and so does ``Partial()``: under one controller the global tensor
already holds the reduced value (see docs/dtensor.md), so every copy is whole.
Root axes no placement names are replicated: a placement on ``mesh["tp"]``
shards over tp and replicates over dp.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from spmdtorch import _checks
from spmdtorch.dtensor._mesh import check_device_mesh, root_axes
from spmdtorch.dtensor.errors import PlacementError, UnsupportedPlacementError

__all__ = ["normalize_placements", "partition_spec", "placements_of_spec", "spec_of"]


def normalize_placements(
    placements: Sequence[Placement] | None, mesh: DeviceMesh, ndim: int, what: str
) -> tuple[Placement, ...]:
    """``placements`` checked against ``mesh`` and a tensor of rank ``ndim``, with ``Shard`` dims made non-negative.

    ``None`` means replicated on every mesh dim.

    Raises:
        PlacementError: not one placement per mesh dim, or a ``Shard`` dim out of range.
        UnsupportedPlacementError: a placement other than ``Shard``/``Replicate``/``Partial``.
    """
    if placements is None:
        return tuple(Replicate() for _ in range(mesh.ndim))
    if isinstance(placements, Placement) or not isinstance(placements, Sequence):
        raise PlacementError(f"{what}: placements must be a list of placements, one per mesh dim, got {placements!r}")
    if len(placements) != mesh.ndim:
        raise PlacementError(
            f"{what}: got {len(placements)} placements for a {mesh.ndim}-dim mesh {mesh}; give one "
            "Shard/Replicate per mesh dim"
        )
    out: list[Placement] = []
    for i, p in enumerate(placements):
        if type(p) is Shard:  # exactly Shard: _StridedShard subclasses it and has another meaning
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise PlacementError(
                    f"{what}: placements[{i}] is Shard({p.dim}) but the tensor has {ndim} dims; use a dim in "
                    f"[{-ndim}, {ndim})"
                )
            out.append(Shard(d))
        elif isinstance(p, (Replicate, Partial)):
            out.append(p)
        else:
            raise UnsupportedPlacementError(
                f"{what}: placements[{i}] is {p!r}, which has no GSPMD partition spec; use Shard(dim), Replicate() "
                "or Partial() (a _StridedShard's interleaved order has no single-controller layout: shard the "
                "tensor dim over both mesh dims with two Shard placements instead)"
            )
    return tuple(out)


def spec_of(mesh: DeviceMesh, placements: Sequence[Placement], ndim: int) -> tuple[Any, ...]:
    """:func:`partition_spec` without the argument checks (for placements already normalized)."""
    axes = root_axes(mesh)
    per_dim: list[list[int]] = [[] for _ in range(ndim)]
    for i, p in enumerate(placements):
        if isinstance(p, Shard):
            per_dim[p.dim].extend(axes[i])
    return tuple(None if not a else a[0] if len(a) == 1 else tuple(a) for a in per_dim)


def partition_spec(mesh: DeviceMesh, placements: Sequence[Placement], ndim: int) -> tuple[Any, ...]:
    """The partition spec over ``mesh``'s root mesh that ``placements`` mean for a tensor of rank ``ndim``.

    Entries are root axis indices (an int, or a tuple when a tensor dim is
    split over several), or None.

    Raises:
        DeviceMeshError: ``mesh`` is not an xla ``DeviceMesh``.
        PlacementError, UnsupportedPlacementError: placements that do not fit
            ``mesh`` and ``ndim`` (as :func:`~spmdtorch.dtensor.distribute_tensor`).

    Example:
        >>> from torch.distributed.tensor import Replicate, Shard
        >>> from spmdtorch.dtensor import init_device_mesh
        >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> partition_spec(mesh, (Shard(1), Shard(0)), 2), partition_spec(mesh["tp"], (Shard(0),), 2)
        ((1, 0), (1, None))
    """
    check_device_mesh(mesh, "partition_spec", "mesh")
    rank = _checks.check_int(ndim, "partition_spec", "ndim", PlacementError, minimum=0)
    if placements is None:
        _checks.fail(PlacementError, "partition_spec", "placements", "one placement per mesh dim", placements)
    return spec_of(mesh, normalize_placements(placements, mesh, rank, "partition_spec"), rank)


def placements_of_spec(mesh: DeviceMesh, spec: Sequence[Any]) -> tuple[Placement, ...]:
    """The placements on ``mesh`` that a partition spec over its root mesh means (the inverse of :func:`partition_spec`).

    Root axes ``mesh`` does not span must not be used by ``spec``.

    Entries name root axes by index (what :func:`partition_spec` gives) or by name.

    Raises:
        DeviceMeshError: ``mesh`` is not an xla ``DeviceMesh``.
        PlacementError: ``spec`` is not a sequence, or shards over a root axis
            ``mesh`` lacks, or over part of a flattened dim of ``mesh``.
    """
    check_device_mesh(mesh, "placements_of_spec", "mesh")
    if isinstance(spec, (str, bytes)) or not isinstance(spec, Sequence):
        _checks.fail(PlacementError, "placements_of_spec", "spec", "a partition spec (one entry per tensor dim)", spec)
    axes = root_axes(mesh)
    names = tuple(mesh._get_root_mesh().mesh_dim_names or ())
    placements: list[Placement] = [Replicate() for _ in axes]
    for d, entry in enumerate(spec):
        # Entries name root axes by index or by name (what spmdtorch.sharding's partition specs take).
        if isinstance(entry, str) and entry in names:
            entry = names.index(entry)
        elif isinstance(entry, tuple):
            entry = tuple(names.index(a) if isinstance(a, str) and a in names else a for a in entry)
        used = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
        pos = 0
        while pos < len(used):
            match = [i for i, a in enumerate(axes) if tuple(used[pos : pos + len(a)]) == a]
            if not match:
                raise PlacementError(
                    f"partition spec {tuple(spec)} shards tensor dim {d} over root axes {used}, which are not dims "
                    f"of the mesh {mesh}"
                )
            placements[match[0]] = Shard(d)
            pos += len(axes[match[0]])
    return tuple(placements)
