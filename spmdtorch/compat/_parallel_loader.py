"""``torch_xla.distributed.parallel_loader`` (``pl``): :mod:`spmdtorch.data`'s loaders."""

from __future__ import annotations

from spmdtorch.data import MpDeviceLoader, ParallelLoader, PerDeviceLoader

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]
