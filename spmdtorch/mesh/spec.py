"""PyTorch/XLA partition specs → JAX ``PartitionSpec``.

A PyTorch/XLA partition spec has one entry per tensor dim. Each entry is

* ``None``: the dim is replicated;
* an ``int``: the index of the mesh axis that shards the dim;
* a ``str``: the name of that mesh axis (named meshes only);
* a ``tuple`` of ints/strs: the dim is sharded over several mesh axes, the
  first one outermost (``(("data", "model"),)`` splits dim 0 into
  ``size(data) * size(model)`` blocks, ``data`` major).

Mesh axes left out of the spec replicate the tensor (partial replication),
exactly as in PyTorch/XLA and as in JAX. The functions here are pure (they see
only the axis names and sizes), so the mesh and the tests share them.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, TypeAlias

from jax.sharding import PartitionSpec

from spmdtorch.mesh.errors import PartitionSpecError, UnknownAxisError

__all__ = ["NormalizedSpec", "normalize_partition_spec", "resolve_axis", "to_jax_partition_spec"]

#: A validated spec: one entry per tensor dim, None (replicated) or the
#: indices of the mesh axes that shard the dim (never empty), first one major.
NormalizedSpec: TypeAlias = tuple[tuple[int, ...] | None, ...]


def _is_int(x: Any) -> bool:
    # bool is an int subclass, but True/False as an axis index is always a bug.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _describe_axes(axis_names: tuple[str, ...] | None, mesh_shape: tuple[int, ...]) -> str:
    if axis_names is None:
        return f"the mesh is unnamed with {len(mesh_shape)} axes; use indices 0..{len(mesh_shape) - 1}"
    named = ", ".join(f"{i}={n!r}" for i, n in enumerate(axis_names))
    return f"the mesh axes are {named}"


def resolve_axis(ref: Any, axis_names: tuple[str, ...] | None, mesh_shape: tuple[int, ...]) -> int:
    """Returns the index of the mesh axis ``ref`` (an index or a name).

    Args:
        ref: An ``int`` axis index or a ``str`` axis name.
        axis_names: The mesh's axis names, or None for an unnamed mesh.
        mesh_shape: The mesh shape.

    Raises:
        UnknownAxisError: ``ref`` names no axis of the mesh (the message lists
            the valid ones), or is neither an int nor a str.

    Example:
        >>> resolve_axis("model", ("data", "model"), (4, 2))
        1
        >>> resolve_axis(0, None, (8,))
        0
    """
    ndim = len(mesh_shape)
    if _is_int(ref):
        idx = int(ref)
        if not 0 <= idx < ndim:
            raise UnknownAxisError(f"mesh axis index {idx} is out of range; {_describe_axes(axis_names, mesh_shape)}")
        return idx
    if isinstance(ref, str):
        if axis_names is None:
            raise UnknownAxisError(
                f"mesh axis name {ref!r} cannot be used: the mesh was built with "
                f"axis_names=None; {_describe_axes(axis_names, mesh_shape)}, or build the "
                "Mesh with axis_names"
            )
        try:
            return axis_names.index(ref)
        except ValueError:
            raise UnknownAxisError(
                f"unknown mesh axis name {ref!r}; {_describe_axes(axis_names, mesh_shape)}"
            ) from None
    raise UnknownAxisError(
        f"a mesh axis is referred to by an int index or a str name, got "
        f"{type(ref).__name__} {ref!r}; {_describe_axes(axis_names, mesh_shape)}"
    )


def normalize_partition_spec(
    partition_spec: Sequence[Any],
    axis_names: tuple[str, ...] | None,
    mesh_shape: tuple[int, ...],
    ndim: int | None = None,
) -> NormalizedSpec:
    """Validates a PyTorch/XLA partition spec and returns it as axis indices.

    Args:
        partition_spec: One entry per tensor dim (see the module docstring).
        axis_names: The mesh's axis names, or None for an unnamed mesh.
        mesh_shape: The mesh shape.
        ndim: The tensor rank; when given, the spec must have that many entries.

    Returns:
        A tuple with one entry per dim: None (replicated) or a tuple of mesh
        axis indices (empty tuples become None).

    Raises:
        PartitionSpecError: The spec is not a sequence, has the wrong length,
            has an entry of the wrong type, refers to an unknown axis, nests
            tuples, or uses one mesh axis twice. The message names the dim and
            the value.

    Example:
        >>> normalize_partition_spec(("data", None, (0, "model")), ("data", "model"), (4, 2))
        Traceback (most recent call last):
        ...
        spmdtorch.mesh.errors.PartitionSpecError: partition_spec[2] = (0, 'model') uses mesh axis 'data' (index 0), which partition_spec[0] already uses; each mesh axis can shard at most one tensor dim, once
        >>> normalize_partition_spec((("data", "model"), None), ("data", "model"), (4, 2))
        ((0, 1), None)
    """
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, Sequence):
        hint = f"; did you mean ({partition_spec!r},)?" if isinstance(partition_spec, (str, int)) else ""
        raise PartitionSpecError(
            "partition_spec must be a tuple with one entry per tensor dim (None, an axis "
            f"index, an axis name or a tuple of those), got {type(partition_spec).__name__} "
            f"{partition_spec!r}{hint}"
        )
    spec = tuple(partition_spec)
    if ndim is not None and len(spec) != ndim:
        raise PartitionSpecError(
            f"partition_spec {spec} has {len(spec)} entries but the tensor has {ndim} dims; "
            "give exactly one entry per dim (None = replicated)"
        )

    used: dict[int, int] = {}  # mesh axis index -> dim that uses it
    out: list[tuple[int, ...] | None] = []
    for dim, entry in enumerate(spec):
        if entry is None:
            out.append(None)
            continue
        if isinstance(entry, (tuple, list)):
            refs = tuple(entry)
            for ref in refs:
                if isinstance(ref, (tuple, list)):
                    raise PartitionSpecError(
                        f"partition_spec[{dim}] = {entry!r} nests a tuple; a dim's entry may be "
                        "a flat tuple of axis indices/names, e.g. ('data', 'model')"
                    )
                if ref is None:
                    raise PartitionSpecError(
                        f"partition_spec[{dim}] = {entry!r} contains None; inside a tuple list "
                        "only the mesh axes that shard the dim"
                    )
        else:
            refs = (entry,)
        indices: list[int] = []
        for ref in refs:
            if not (_is_int(ref) or isinstance(ref, str)):
                raise PartitionSpecError(
                    f"partition_spec[{dim}] = {entry!r}: expected None, an int axis index, a "
                    f"str axis name or a tuple of those, got {type(ref).__name__} {ref!r}"
                )
            try:
                idx = resolve_axis(ref, axis_names, mesh_shape)
            except UnknownAxisError as e:
                raise PartitionSpecError(f"partition_spec[{dim}] = {entry!r}: {e}") from None
            if idx in used:
                shown = f"{axis_names[idx]!r} (index {idx})" if axis_names else f"index {idx}"
                where = "the same entry" if used[idx] == dim else f"partition_spec[{used[idx]}]"
                raise PartitionSpecError(
                    f"partition_spec[{dim}] = {entry!r} uses mesh axis {shown}, which {where} "
                    "already uses; each mesh axis can shard at most one tensor dim, once"
                )
            used[idx] = dim
            indices.append(idx)
        out.append(tuple(indices) if indices else None)
    return tuple(out)


def to_jax_partition_spec(normalized: NormalizedSpec, jax_axis_names: tuple[str, ...]) -> PartitionSpec:
    """Turns a normalised spec (axis indices) into a ``jax.sharding.PartitionSpec``.

    Single-axis entries become the bare name (``P('data')``, not
    ``P(('data',))``) so specs print and compare the way JAX users expect.
    The result has exactly one entry per tensor dim.

    Example:
        >>> to_jax_partition_spec(((0, 1), None), ("x", "y"))
        P(('x', 'y'), None)
        >>> to_jax_partition_spec((None, (1,)), ("x", "y"))
        P(None, 'y')
    """
    entries: list[str | tuple[str, ...] | None] = []
    for entry in normalized:
        if entry is None:
            entries.append(None)
        elif len(entry) == 1:
            entries.append(jax_axis_names[entry[0]])
        else:
            entries.append(tuple(jax_axis_names[i] for i in entry))
    return PartitionSpec(*entries)
