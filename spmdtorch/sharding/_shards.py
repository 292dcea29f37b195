"""Per-device shards of a sharded xla tensor: read them, and load them back."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

import jax
import torch

from spmdtorch.lazy import executor
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.sharding._marking import ShardingError, ShardingTypeError, _check_tensor
from spmdtorch.tensor import storage_of, transfer, view_chain
from spmdtorch.tensor.dispatch import concrete_value
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["XLAShard", "local_shards", "load_local_shards_"]


@dataclasses.dataclass(frozen=True)
class XLAShard:
    """One shard held by a device of this process.

    Attributes:
        data: the shard's values as a CPU tensor (the tensor's dtype).
        indices: the slices of the global tensor this shard covers.
        device: the device, as ``"xla:<logical ordinal>"``... see ``device_id``.
        device_id: the logical device ordinal (position in the global device order).
        replica_id: which copy this is when the shard is replicated.
    """

    data: torch.Tensor
    indices: tuple[slice, ...]
    device: str
    device_id: int
    replica_id: int


def _logical_ids() -> dict[int, int]:
    order = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return {d.id: i for i, d in enumerate(order)}


def _concrete(t: XlaTensor) -> jax.Array:
    if view_chain(t):
        # A view holds no data of its own: its value computed (annotation applied).
        return concrete_value(t)
    st = storage_of(t)
    if isinstance(st.value, LazyRef):
        executor.sync()
    return cast(jax.Array, st.value)  # a sync computes every pending storage


def _trim(index: Sequence[slice], padded_shape: Sequence[int], logical_shape: Sequence[int]) -> tuple[slice, ...]:
    """Clip a shard's slices of the padded array to the tensor's real extent."""
    out = []
    for sl, p, n in zip(index, padded_shape, logical_shape):
        start, stop = sl.start or 0, p if sl.stop is None else sl.stop
        out.append(slice(min(start, n), min(stop, n)))
    return tuple(out)


def local_shards(t: torch.Tensor) -> list[XLAShard]:
    """The shards of ``t`` that this process's devices hold, as CPU tensors.

    For a view: the shards of its computed value (laid out by its annotation, if any).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding, local_shards
        >>> w = mark_sharding(torch.arange(8.0, device="xla"), get_1d_mesh("d"), ("d",))
        >>> [s.data.tolist() for s in local_shards(w)][:2]
        [[0.0], [1.0]]
    """
    xt = _check_tensor(t, "local_shards")
    arr = _concrete(xt)
    ids = _logical_ids()
    out = []
    for shard in arr.addressable_shards:
        index = _trim(shard.index, arr.shape, tuple(t.shape))
        data = transfer.array_to_torch(shard.data, t.dtype)
        # Padding (uneven shardings) is storage detail: users see real data only.
        data = data[tuple(slice(0, sl.stop - sl.start) for sl in index)]
        lid = ids[shard.device.id]
        out.append(XLAShard(data, index, f"xla:{lid}", lid, shard.replica_id))
    return out


def load_local_shards_(t: torch.Tensor, shards: Sequence[torch.Tensor | XLAShard]) -> torch.Tensor:
    """Replace ``t``'s data with ``shards`` (one per local device, in ``local_shards`` order).

    Each shard is a CPU tensor (or an ``XLAShard``) with the shape that ``t``'s
    sharding gives that device.
    """
    xt = _check_tensor(t, "load_local_shards_")
    if isinstance(shards, (str, bytes, torch.Tensor)) or not isinstance(shards, Sequence):
        raise ShardingTypeError(
            f"load_local_shards_: shards must be a list of CPU tensors or XLAShards (one per local device), "
            f"got {type(shards).__name__}"
        )
    for i, shard in enumerate(shards):
        if not isinstance(shard, (torch.Tensor, XLAShard)):
            raise ShardingTypeError(
                f"load_local_shards_: shards[{i}] must be a tensor or an XLAShard, got {type(shard).__name__}"
            )
    if view_chain(xt):
        raise ShardingError(
            f"load_local_shards_ writes a tensor's own data, but this one (shape {tuple(t.shape)}) is a "
            "view of another tensor's; load the shards of the base tensor, or into t.clone()"
        )
    arr = _concrete(xt)
    local = arr.addressable_shards
    if len(shards) != len(local):
        raise ShardingError(
            f"load_local_shards_ got {len(shards)} shards but this process holds {len(local)} "
            f"shards of the tensor (shape {tuple(t.shape)})"
        )
    pieces: list[Any] = []  # jax.Array per local device
    for i, (shard, dst) in enumerate(zip(shards, local)):
        data = shard.data if isinstance(shard, XLAShard) else shard
        index = _trim(dst.index, arr.shape, tuple(t.shape))
        expected = tuple(sl.stop - sl.start for sl in index)
        if tuple(data.shape) != expected:
            raise ShardingError(
                f"shards[{i}] has shape {tuple(data.shape)}, expected {expected} for device {dst.device}"
            )
        block = torch.zeros(dst.data.shape, dtype=t.dtype)
        block[tuple(slice(0, n) for n in expected)] = data.to(t.dtype)
        pieces.append(jax.device_put(transfer.host_numpy(block).copy(), dst.device))
    new = jax.make_array_from_single_device_arrays(arr.shape, arr.sharding, pieces)
    storage_of(xt).set(new)  # same (padded) shape and logical shape as before (set drops cached view values)
    return xt
