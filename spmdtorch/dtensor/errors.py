"""Exceptions raised by :mod:`spmdtorch.dtensor`.

Every error is a :class:`DTensorError` (a ``ValueError``), so callers can catch
the broad class and tests the precise one. Each also derives from the builtin
type torch's own DTensor raises in the same situation, where there is one
(``NotImplementedError``, ``RuntimeError``), so code written for torch's
multi-controller DTensor keeps its ``except`` clauses. Messages name the
argument, say what was expected and what was given, and what to do instead.
"""

from __future__ import annotations

__all__ = [
    "DTensorError",
    "DeviceMeshError",
    "InplaceGradError",
    "LocalTensorError",
    "NoRankError",
    "PlacementError",
    "StateDictError",
    "UnsupportedFSDPError",
    "UnsupportedPlacementError",
    "UnsupportedStyleError",
]


class DTensorError(ValueError):
    """Base class of every error raised by :mod:`spmdtorch.dtensor`."""


class DeviceMeshError(DTensorError):
    """A ``DeviceMesh`` that has no spmdtorch meaning: not ``xla``, not over every device, bad shape or names."""


class NoRankError(DTensorError, RuntimeError):
    """A per-rank query (``get_rank``, ``get_coordinate``, ``get_group``...) on a single-controller mesh.

    One process drives every device of the mesh, so there is no "current
    rank", no coordinate of it and no process group per mesh dim.
    """


class PlacementError(DTensorError):
    """``placements`` does not fit the mesh or the tensor (wrong length, a ``Shard`` dim the tensor lacks)."""


class UnsupportedPlacementError(DTensorError, NotImplementedError):
    """A placement with no GSPMD partition spec (a custom ``Placement`` subclass, ``_StridedShard``)."""


class LocalTensorError(DTensorError):
    """``from_local`` asked for a per-rank meaning (another global shape, a ``Partial`` sum of per-rank values)."""


class InplaceGradError(DTensorError, RuntimeError):
    """An in-place op on a DTensor that requires grad, under grad mode (autograd would lose the op)."""


class UnsupportedStyleError(DTensorError, NotImplementedError):
    """A parallel style (or a module for a style) ``parallelize_module`` has no annotation plan for."""


class UnsupportedFSDPError(DTensorError, NotImplementedError):
    """An FSDP2 option or ``FSDPModule`` method with no single-controller meaning (CPU offload, custom collectives)."""


class StateDictError(DTensorError, RuntimeError):
    """A state dict that does not fit the model or optimizer it is loaded into (keys, shapes), naming the key."""
