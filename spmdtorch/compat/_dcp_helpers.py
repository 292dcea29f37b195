"""``torch_xla.experimental.distributed_checkpoint._helpers``: the state-dict helpers PyTorch/XLA's checkpoint code imports.

* ``_sharded_cpu_state_dict(state_dict)``: a host copy without gathering, each
  sharded tensor as a ``_CpuShards`` (this process's shards), every other
  tensor on the CPU (:func:`spmdtorch.checkpoint.distributed_checkpoint.sharded_cpu_state_dict`);
  ``SPMDSavePlanner`` saves it like the live state dict.
* ``_CpuShards``: :class:`spmdtorch.checkpoint.distributed_checkpoint.CpuShards`
  (``shards``, ``global_shape``).
* ``_is_sharded_tensor(x)``: an ``XLAShardedTensor`` (or xla tensor) whose data
  is split over devices.
* ``_unwrap_xla_sharded_tensor``, ``_cpu_shards_from_tensors``, and the
  ``torch.distributed.checkpoint`` utilities PyTorch/XLA copied into this module
  (``flatten_state_dict``, ``set_element``, ``narrow_tensor_by_index``), here
  torch's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element

from spmdtorch import sharding
from spmdtorch.checkpoint.distributed_checkpoint import CpuShards, is_sharded, sharded_cpu_state_dict

__all__ = [
    "_CpuShards",
    "_cpu_shards_from_tensors",
    "_is_sharded_tensor",
    "_sharded_cpu_state_dict",
    "_unwrap_xla_sharded_tensor",
    "flatten_state_dict",
    "narrow_tensor_by_index",
    "set_element",
]

_CpuShards = CpuShards


def _unwrap_xla_sharded_tensor(x: Any) -> Any:
    """An ``XLAShardedTensor``'s ``global_tensor``; anything else as it is."""
    inner = getattr(x, "global_tensor", None)
    return inner if isinstance(x, torch.Tensor) and isinstance(inner, torch.Tensor) else x


def _is_sharded_tensor(x: Any) -> bool:
    """Whether ``x`` is an xla tensor (or ``XLAShardedTensor``) whose data is split over devices.

    PyTorch/XLA asks ``sharding_type != REPLICATED`` of an ``XLAShardedTensor``;
    here every xla tensor carries its sharding, so a plain one is asked too. A
    ``_CpuShards`` is not a tensor: False, as in PyTorch/XLA.
    """
    if not isinstance(x, torch.Tensor):
        return False
    return is_sharded(_unwrap_xla_sharded_tensor(x))


def _cpu_shards_from_tensors(tensors: Sequence[torch.Tensor]) -> list[CpuShards]:
    """A ``_CpuShards`` (this process's shards on the host) per xla tensor."""
    out = []
    for t in tensors:
        inner = _unwrap_xla_sharded_tensor(t)
        out.append(CpuShards(shards=sharding.local_shards(inner), global_shape=inner.shape))
    return out


def _sharded_cpu_state_dict(state_dict: Any) -> Any:
    """``state_dict`` on the host: sharded tensors as ``_CpuShards``, other tensors as CPU tensors.

    ``XLAShardedTensor`` values are unwrapped first; the structure (nested
    dicts, lists) and non-tensor values are kept.
    """
    unwrapped = torch.utils._pytree.tree_map(_unwrap_xla_sharded_tensor, state_dict)
    return sharded_cpu_state_dict(unwrapped)
