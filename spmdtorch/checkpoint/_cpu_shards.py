"""A state dict's sharded tensors as host copies of this process's shards (PyTorch/XLA's ``_CpuShards``).

:func:`sharded_cpu_state_dict` copies a state dict to the host without
gathering: a tensor split over devices becomes a :class:`CpuShards` (the
shards this process's devices hold, each with its slice of the global
tensor), any other tensor a CPU tensor. ``SPMDSavePlanner`` writes a
``CpuShards`` exactly as it writes the xla tensor it came from, so a
checkpoint can be taken from a host snapshot while training goes on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.utils import _pytree as pytree

from spmdtorch import sharding
from spmdtorch.sharding import ShardingType, XLAShard
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["CpuShards", "is_sharded", "sharded_cpu_state_dict"]

#: The sharding types whose data is split over devices (each device holds part of the tensor).
_SPLIT = (ShardingType.TILED, ShardingType.PARTIAL)


@dataclasses.dataclass(frozen=True)
class CpuShards:
    """Host copies of the shards of one sharded tensor that this process's devices hold.

    Attributes:
        shards: one :class:`~spmdtorch.sharding.XLAShard` per local device, in
            device order (each with its ``indices`` into the global tensor and
            its ``replica_id``).
        global_shape: the whole tensor's shape.
    """

    shards: list[XLAShard]
    global_shape: torch.Size


def is_sharded(value: Any) -> bool:
    """Whether ``value`` is split over devices: a :class:`CpuShards`, or an xla tensor with a tiled sharding.

    A replicated tensor (annotated so or not) and one on a single device are not.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding
        >>> is_sharded(mark_sharding(torch.zeros(8, 2, device="xla"), get_1d_mesh("d"), ("d", None)))
        True
        >>> is_sharded(torch.zeros(8, 2, device="xla")), is_sharded(torch.zeros(8, 2))
        (False, False)
    """
    if isinstance(value, CpuShards):
        return True
    return isinstance(value, XlaTensor) and sharding.sharding_type(value) in _SPLIT


def sharded_cpu_state_dict(state_dict: Any) -> Any:
    """``state_dict`` with each sharded xla tensor as a :class:`CpuShards` and every other tensor on the CPU.

    Nested dicts, lists and tuples keep their structure; values that are not
    tensors are returned as they are. Nothing is gathered across devices.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding
        >>> w = mark_sharding(torch.arange(16.0, device="xla").reshape(8, 2), get_1d_mesh("d"), ("d", None))
        >>> out = sharded_cpu_state_dict({"w": w, "b": torch.ones(2, device="xla"), "step": 3})
        >>> type(out["w"]).__name__, len(out["w"].shards), out["b"].device.type, out["step"]
        ('CpuShards', 8, 'cpu', 3)
    """

    def to_host(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if is_sharded(value):
                return CpuShards(shards=sharding.local_shards(value), global_shape=value.shape)
            return value.detach().cpu()
        return value

    return pytree.tree_map(to_host, state_dict)
