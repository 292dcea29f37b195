"""``torch.distributed.checkpoint`` (DCP) planners for spmdtorch tensors: PyTorch/XLA's ``SPMDSavePlanner``/``SPMDLoadPlanner``.

With them, ``torch.distributed.checkpoint.save(state_dict, checkpoint_id=dir,
planner=SPMDSavePlanner())`` writes spmdtorch's sharded tensors in DCP's own
format, and ``load(..., planner=SPMDLoadPlanner())`` reads them back into any
sharding, in place:

* **Save**: each xla tensor (or :class:`~spmdtorch.checkpoint.distributed_checkpoint.CpuShards`,
  a host snapshot of one) is written as the shards this process holds, one
  DCP chunk per distinct shard (a replicated shard once in the whole job: the
  copy with JAX ``replica_id`` 0), at the tensor's logical shape (uneven
  shardings are saved unpadded). Everything else (CPU tensors, Python values)
  is DCP's default handling.
* **Load**: for each xla tensor, DCP reads exactly the regions this process's
  devices hold in the *target's* sharding (whatever the saved chunking: this
  is the resharding), into host buffers; once the last region of a tensor is
  read, the buffers become one device array in the target's sharding (padded
  if uneven) that replaces the tensor's data in place.

The classes extend DCP's ``DefaultSavePlanner``/``DefaultLoadPlanner``
(nested dicts are flattened to ``model.fc.weight``-style keys as usual).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from spmdtorch import _checks
from spmdtorch.checkpoint import placement
from spmdtorch.checkpoint._cpu_shards import CpuShards, is_sharded
from spmdtorch.checkpoint.errors import CheckpointArgumentTypeError, UnsafeEntryError, UnsupportedValueError
from spmdtorch.tensor import view_chain
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["SPMDLoadPlanner", "SPMDSavePlanner"]

Region = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) in the logical shape


def _region(index: tuple[slice, ...], shape: Sequence[int]) -> Region:
    """A shard's index (slices, maybe past the logical end when padded) clipped to ``shape``."""
    offsets, sizes = [], []
    for sl, n in zip(index, shape):
        start = 0 if sl.start is None else min(sl.start, n)
        stop = n if sl.stop is None else min(sl.stop, n)
        offsets.append(start)
        sizes.append(max(0, stop - start))
    return tuple(offsets), tuple(sizes)


def _flag(value: Any, func: str, param: str) -> bool:
    return _checks.check_bool(value, func, param, CheckpointArgumentTypeError)


def _chunk(region: Region) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(region[0]), sizes=torch.Size(region[1]))


@dataclasses.dataclass(frozen=True, slots=True)
class _SaveTensor:
    """A sharded value to save (an xla tensor or a :class:`CpuShards`): its size and the shards this process writes."""

    size: tuple[int, ...]
    dtype: torch.dtype
    # offsets -> (the shard's position among this process's shards, its data: a jax.Array or a CPU tensor)
    shards: dict[tuple[int, ...], tuple[int, Any]]


def _save_tensor(obj: XlaTensor | CpuShards) -> _SaveTensor:
    """The distinct shards of ``obj`` this process writes: each once in the whole job (JAX ``replica_id`` 0)."""
    shards: dict[tuple[int, ...], tuple[int, Any]] = {}
    if isinstance(obj, CpuShards):
        size = tuple(obj.global_shape)
        dtype = obj.shards[0].data.dtype if obj.shards else torch.float32
        for i, s in enumerate(obj.shards):
            if s.replica_id == 0:
                offsets, _ = _region(s.indices, size)
                shards[offsets] = (i, s.data)
        return _SaveTensor(size, dtype, shards)
    array, _, _ = placement.save_value(obj)
    for i, shard in enumerate(array.addressable_shards):
        if shard.replica_id == 0:
            offsets, _ = _region(shard.index, array.shape)
            shards[offsets] = (i, shard.data)
    return _SaveTensor(tuple(array.shape), obj.dtype, shards)


def _split(state_dict: dict[str, Any], sharded: bool) -> dict[str, Any]:
    return {k: v for k, v in state_dict.items() if is_sharded(v) == sharded}


class SPMDSavePlanner(DefaultSavePlanner):
    """DCP save planner that writes each process's shards of spmdtorch tensors (``xc.SPMDSavePlanner``).

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> import torch.distributed.checkpoint as dist_cp
        >>> from spmdtorch.checkpoint.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
        >>> model = torch.nn.Linear(4, 2).to("xla")
        >>> d = tempfile.mkdtemp()
        >>> _ = dist_cp.save({"model": model.state_dict()}, checkpoint_id=d, planner=SPMDSavePlanner())
        >>> fresh = torch.nn.Linear(4, 2).to("xla")
        >>> dist_cp.load({"model": fresh.state_dict()}, checkpoint_id=d, planner=SPMDLoadPlanner())
        >>> torch.equal(fresh.weight.cpu(), model.weight.cpu())
        True

    Args:
        flatten_state_dict: ``DefaultSavePlanner``'s option (a bool).
        flatten_sharded_tensors: ``DefaultSavePlanner``'s option (a bool).
        dedup_replicated_tensors: ``DefaultSavePlanner``'s option (a bool or None).
        dedup_save_to_lowest_rank: ``DefaultSavePlanner``'s option (a bool).
        enable_plan_caching: ``DefaultSavePlanner``'s option (a bool).

    Raises:
        CheckpointArgumentTypeError: an option is not a bool.
    """

    def __init__(
        self,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        dedup_replicated_tensors: bool | None = None,
        dedup_save_to_lowest_rank: bool = False,
        enable_plan_caching: bool = False,
    ) -> None:
        func = "SPMDSavePlanner"
        super().__init__(
            flatten_state_dict=_flag(flatten_state_dict, func, "flatten_state_dict"),
            flatten_sharded_tensors=_flag(flatten_sharded_tensors, func, "flatten_sharded_tensors"),
            dedup_replicated_tensors=(
                None
                if dedup_replicated_tensors is None
                else _flag(dedup_replicated_tensors, func, "dedup_replicated_tensors")
            ),
            dedup_save_to_lowest_rank=_flag(dedup_save_to_lowest_rank, func, "dedup_save_to_lowest_rank"),
            enable_plan_caching=_flag(enable_plan_caching, func, "enable_plan_caching"),
        )

    def set_up_planner(
        self, state_dict: dict[str, Any], storage_meta: StorageMeta | None = None, is_coordinator: bool = False
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        self._xla: dict[str, _SaveTensor] = {}
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, (XlaTensor, CpuShards)):
                self._xla[fqn] = _save_tensor(obj)

    @property
    def sharded_state_dict(self) -> dict[str, Any]:
        """The flattened state dict's values split over devices (xla tensors, :class:`CpuShards`), by key.

        Set by ``set_up_planner``; as PyTorch/XLA's planner reports it.
        """
        return _split(self.state_dict, True)

    @property
    def unsharded_state_dict(self) -> dict[str, Any]:
        """The flattened state dict's other values (replicated or single-device tensors, CPU values), by key."""
        return _split(self.state_dict, False)

    def create_local_plan(self) -> SavePlan:
        xla = self._xla
        # DefaultSavePlanner plans the other values; xla tensors get one write item per shard.
        others = {k: v for k, v in self.state_dict.items() if k not in xla}
        full, self.state_dict = self.state_dict, others
        try:
            plan = super().create_local_plan()
        finally:
            self.state_dict = full
        items = list(plan.items)
        for fqn, t in xla.items():
            size = torch.Size(t.size)
            props = TensorProperties(dtype=t.dtype)
            for offsets, (position, data) in t.shards.items():
                chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(data.shape))
                items.append(
                    WriteItem(
                        # index: the shard's position in this process's shards (local_shards order), as in PyTorch/XLA
                        index=MetadataIndex(fqn, torch.Size(offsets), position),
                        type=WriteItemType.SHARD,
                        tensor_data=TensorWriteData(chunk=chunk, properties=props, size=size),
                    )
                )
        self.plan = dataclasses.replace(plan, items=items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        t = self._xla.get(write_item.index.fqn)
        if t is None:
            return super().resolve_data(write_item)
        offsets = tuple(write_item.index.offset or ())
        _, data = t.shards[offsets]
        if isinstance(data, torch.Tensor):  # a CpuShards' host copy
            return data.to(t.dtype).contiguous()
        return placement.to_torch(np.asarray(data)).to(t.dtype).contiguous()


@dataclasses.dataclass(slots=True)
class _LoadTensor:
    """An xla tensor to fill: the regions its process holds, their host buffers, reads still due."""

    tensor: XlaTensor
    layout: placement.Layout
    buffers: dict[tuple[int, ...], torch.Tensor]  # region offsets -> host buffer (the region's sizes)
    device_regions: list[tuple[Any, Region]]  # per addressable device, its region of the logical shape
    due: int = 0


class _ChunkList:
    """What DCP's default planning asks of a tensor to load: its size and the chunks to read."""

    def __init__(self, size: torch.Size, chunks: list[ChunkStorageMetadata]) -> None:
        self._size, self._chunks = size, chunks

    def size(self) -> torch.Size:
        return self._size

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return self._chunks


class SPMDLoadPlanner(DefaultLoadPlanner):
    """DCP load planner that fills spmdtorch tensors in place, in their own shardings (``xc.SPMDLoadPlanner``).

    Each process reads only the regions its devices hold in the target's
    sharding, whatever the checkpoint's chunking (resharding on load).

    Args:
        flatten_state_dict: ``DefaultLoadPlanner``'s option (a bool).
        flatten_sharded_tensors: ``DefaultLoadPlanner``'s option (a bool).
        allow_partial_load: ``DefaultLoadPlanner``'s option (a bool).

    Raises:
        CheckpointArgumentTypeError: an option is not a bool.
        UnsupportedValueError: (at load) a target is a view of another tensor.
    """

    def __init__(
        self,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        allow_partial_load: bool = False,
    ) -> None:
        func = "SPMDLoadPlanner"
        super().__init__(
            flatten_state_dict=_flag(flatten_state_dict, func, "flatten_state_dict"),
            flatten_sharded_tensors=_flag(flatten_sharded_tensors, func, "flatten_sharded_tensors"),
            allow_partial_load=_flag(allow_partial_load, func, "allow_partial_load"),
        )

    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Metadata | None = None, is_coordinator: bool = False
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        self._xla: dict[str, _LoadTensor] = {}
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, XlaTensor):
                if view_chain(obj):
                    raise UnsupportedValueError(
                        f"state_dict[{fqn!r}] is a view of another tensor (shape {tuple(obj.shape)}); load into "
                        "the base tensor, or t.clone() the view first"
                    )
                layout = placement.layout_of(obj, (fqn,))
                regions = []
                for device, index in layout.sharding.addressable_devices_indices_map(layout.storage_shape).items():
                    whole = (slice(None),) * len(layout.logical_shape)
                    regions.append((device, _region(whole if index is None else index, layout.logical_shape)))
                buffers = {r[0]: torch.empty(r[1], dtype=obj.dtype) for _, r in regions if all(n > 0 for n in r[1])}
                self._xla[fqn] = _LoadTensor(obj, layout, buffers, regions)

    @property
    def sharded_state_dict(self) -> dict[str, Any]:
        """The flattened state dict's xla tensors split over devices, by key (set by ``set_up_planner``)."""
        return _split(self.state_dict, True)

    @property
    def unsharded_state_dict(self) -> dict[str, Any]:
        """The flattened state dict's other values (replicated or single-device tensors, CPU values), by key."""
        return _split(self.state_dict, False)

    def create_local_plan(self) -> LoadPlan:
        xla = self._xla
        assert self.metadata is not None  # invariant: DCP passes the checkpoint's metadata
        # DefaultLoadPlanner plans every value (its key checks included); its reads of
        # xla tensors (whole-tensor chunks) are replaced by reads of this process's regions.
        plan = super().create_local_plan()
        items = [i for i in plan.items if i.dest_index.fqn not in xla]
        for fqn, t in list(xla.items()):
            md = self.metadata.state_dict_metadata.get(fqn)
            if md is None:
                if not self.allow_partial_load:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                del xla[fqn]
                continue
            if not isinstance(md, TensorStorageMetadata):
                raise ValueError(
                    f"{fqn!r} is saved as a Python object, but the target is a tensor; load it into a value"
                )
            saved = md.size
            if tuple(saved) != t.layout.logical_shape:
                raise ValueError(
                    f"Size mismatch between saved {saved} and current: {torch.Size(t.layout.logical_shape)} for {fqn}"
                )
            chunks = [_chunk((offsets, tuple(buf.shape))) for offsets, buf in t.buffers.items()]
            reads = create_read_items_for_chunk_list(fqn, md, chunks) if chunks else []
            t.due = len(reads)
            items += reads
            if not reads:
                self._install(t)  # nothing of it on this process's devices but padding
        return dataclasses.replace(plan, items=items)

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        """Unpickle a non-tensor entry with ``weights_only=True``, then place it as DCP does.

        ``DefaultLoadPlanner`` unpickles these with ``weights_only=False``,
        which runs whatever the file's pickle says.

        Raises:
            UnsafeEntryError: the entry's pickle needs more (an object of a
                class, a function): naming the key and what was refused.
        """
        fqn = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            reason = str(e).strip().splitlines()
            refused = next((line.strip() for line in reason if "GLOBAL" in line or "global" in line), reason[0])
            raise UnsafeEntryError(
                f"SPMDLoadPlanner: the checkpoint entry {fqn!r} is a pickle of more than tensors and plain data "
                f"({refused[:300]}); it is unpickled with weights_only=True because unpickling can run code. "
                "Save plain values (numbers, strings, lists, dicts, tensors) instead; for a checkpoint you "
                "trust completely, load this entry with torch's DefaultLoadPlanner"
            ) from e
        # DCP's own placement (flattened keys back into nested dicts), from a pickle
        # of what weights_only accepted: nothing in it can run code.
        safe = io.BytesIO()
        torch.save(obj, safe)
        safe.seek(0)
        super().load_bytes(read_item, safe)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        t = self._xla.get(read_item.dest_index.fqn)
        if t is None:
            default: torch.Tensor = super().resolve_tensor(read_item)
            return default
        buf = t.buffers[tuple(read_item.dest_index.offset or ())]
        # A view of the region DCP fills (it copies the saved bytes into it).
        region: torch.Tensor = buf[tuple(slice(o, o + n) for o, n in zip(read_item.dest_offsets, read_item.lengths))]
        return region

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        t = self._xla.get(read_item.dest_index.fqn)
        if t is None:
            super().commit_tensor(read_item, tensor)
            return
        t.due -= 1
        if t.due == 0:  # the last region of this tensor: put it on the devices
            self._install(t)

    @staticmethod
    def _install(t: _LoadTensor) -> None:
        layout = t.layout
        shard_shape = layout.sharding.shard_shape(layout.storage_shape)
        hosts: dict[tuple[int, ...], np.ndarray[Any, Any]] = {}
        arrays = []
        for device, (offsets, sizes) in t.device_regions:
            host = hosts.get(offsets)
            if host is None:
                if all(n > 0 for n in sizes):
                    host = placement.host_array(t.buffers[offsets]).astype(layout.storage_dtype, copy=False)
                else:
                    host = np.zeros(sizes, dtype=layout.storage_dtype)
                if tuple(host.shape) != tuple(shard_shape):  # uneven: the padded tail is zeros
                    host = np.pad(host, [(0, s - n) for n, s in zip(host.shape, shard_shape)])
                hosts[offsets] = host = np.ascontiguousarray(host)
            arrays.append(jax.device_put(host, device))
        array = jax.make_array_from_single_device_arrays(layout.storage_shape, layout.sharding, arrays)
        placement.install(t.tensor, array)
        t.buffers.clear()
