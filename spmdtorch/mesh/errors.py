"""Exceptions raised by :mod:`spmdtorch.mesh`.

Every error is a :class:`MeshError`, itself a :class:`ValueError`, so code
written for PyTorch/XLA (which raises ``ValueError``/``AssertionError``) can
catch the broad class while tests and callers can catch the precise one.
Messages always name the offending parameter, say what was expected and what
was given, and suggest a fix.
"""

from __future__ import annotations

from spmdtorch._checks import ArgumentTypeError

__all__ = [
    "AxisNamesError",
    "DeviceIdsError",
    "HybridMeshError",
    "MeshError",
    "MeshShapeError",
    "MeshTypeError",
    "PartitionSpecError",
    "UnknownAxisError",
]


class MeshError(ValueError):
    """Base class of every error raised while building or using a mesh."""


class DeviceIdsError(MeshError):
    """``device_ids`` is not a permutation of ``0..N-1`` (N = global device count)."""


class MeshShapeError(MeshError):
    """``mesh_shape`` is malformed or does not cover the devices."""


class AxisNamesError(MeshError):
    """``axis_names`` has the wrong length, a duplicate, or a non-string name."""


class UnknownAxisError(MeshError):
    """An axis name or index that the mesh does not have."""


class PartitionSpecError(MeshError):
    """A partition spec entry that does not fit the mesh (unknown axis, reuse...)."""


class HybridMeshError(MeshError):
    """ICI/DCN shapes that cannot be placed on the available slices/processes."""


class MeshTypeError(MeshError, ArgumentTypeError):
    """An argument of the wrong type (a ``TypeError`` too, as before it was named)."""
