"""Sharded input loading: PyTorch/XLA's ``MpDeviceLoader`` and ``ParallelLoader``.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.data import MpDeviceLoader
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.partition import ShardingSpec, get_sharding_spec
    >>> mesh = Mesh(np.arange(8), (8,), ("data",))
    >>> loader = MpDeviceLoader([torch.zeros(16, 4)], "xla", input_sharding=ShardingSpec(mesh, ("data", None)))
    >>> [get_sharding_spec(b) for b in loader]
    ['{devices=[8,1]0,1,2,3,4,5,6,7}']
"""

from spmdtorch.data.errors import (
    InputShardingError,
    LoaderArgumentError,
    LoaderArgumentTypeError,
    LoaderStateError,
    LoaderWorkerError,
)
from spmdtorch.data.loader import MpDeviceLoader, ParallelLoader, PerDeviceLoader
from spmdtorch.data.transfer import send_cpu_data_to_device

__all__ = [
    "InputShardingError",
    "LoaderStateError",
    "LoaderArgumentError",
    "LoaderArgumentTypeError",
    "LoaderWorkerError",
    "MpDeviceLoader",
    "ParallelLoader",
    "PerDeviceLoader",
    "send_cpu_data_to_device",
]
