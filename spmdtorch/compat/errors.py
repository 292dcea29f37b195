"""The errors ``spmdtorch.compat`` raises; each message names what to use instead."""

from __future__ import annotations

__all__ = [
    "CompatError",
    "MultiprocessNotSupportedError",
    "ReplicaGroupsError",
    "TorchXlaInstalledError",
    "TorchXlaNameError",
    "TorchXlaModuleNotProvidedError",
    "UnsupportedEnvironmentError",
]

#: Where the name table and the list of what is not supported live.
GUIDE = "docs/migrating-from-torch-xla.md"


class CompatError(RuntimeError):
    """Base class of the compatibility layer's own errors."""


class TorchXlaInstalledError(CompatError):
    """The real ``torch_xla`` is importable: the aliases would shadow it (or be shadowed)."""


class MultiprocessNotSupportedError(CompatError):
    """A multiprocess-only PyTorch/XLA API (``xmp.spawn``, the ``xla`` DDP backend, FSDPv1) was called.

    spmdtorch has only SPMD mode: one process per host drives all its devices.
    """


class ReplicaGroupsError(CompatError, ValueError):
    """``groups=`` of an ``xm`` collective names replicas that do not exist.

    In SPMD mode a process is one replica (ordinal 0); groups over device
    ordinals mean a per-device collective, which only a ``shard_map`` region
    can express. Returning the input unchanged would be a silently wrong value.
    """


class UnsupportedEnvironmentError(CompatError):
    """A PyTorch/XLA environment variable is set that means nothing in spmdtorch (its message says why)."""


class TorchXlaModuleNotProvidedError(ModuleNotFoundError):
    """``import torch_xla.X`` for a module the compatibility layer does not provide.

    A ``ModuleNotFoundError``, so ``try: import torch_xla.X except ImportError`` still works.
    """


class TorchXlaNameError(AttributeError):
    """A ``torch_xla`` module attribute the compatibility layer does not provide.

    An ``AttributeError``, so ``hasattr``/``getattr(..., default)`` still work.
    """
