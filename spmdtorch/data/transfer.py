"""Moving one CPU batch to the devices, sharded as ``input_sharding`` says.

The work is split in two so that a background thread can do the expensive
part: :func:`place` copies every CPU tensor of a batch to the devices (pure
JAX, no spmdtorch state is touched, so it cannot disturb a trace running on
the main thread), and :func:`wrap` turns the placed arrays into xla tensors
on the consumer's thread.

How each tensor is placed:

* no spec applies: replicated; every process must load the same value;
* a spec with ``minibatch=False``: the tensor is the *global* value, the same
  in every process, and each process puts only its own shards;
* a spec with ``minibatch=True``: the tensor is *this process's part* of the
  batch along dim 0; the parts of all processes form the global tensor
  (``jax.make_array_from_process_local_data``). With one process the part is
  the whole batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import torch
import torch.utils._pytree as pytree

from spmdtorch.data.errors import InputShardingError
from spmdtorch.lazy import Storage, padding
from spmdtorch.sharding import ShardingSpec
from spmdtorch.tensor import multihost, transfer
from spmdtorch.tensor.xla_tensor import XlaTensor, contiguous_strides

__all__ = ["InputShardings", "Placed", "place", "send_cpu_data_to_device", "wrap"]


def _describe_spec(spec: ShardingSpec) -> str:
    return f"ShardingSpec(partition_spec={spec.partition_spec}, minibatch={spec.minibatch})"


class InputShardings:
    """A validated ``input_sharding``: None, one ShardingSpec, or a dict of them.

    Raises:
        InputShardingError: wrong type, or a ``minibatch=True`` spec that does
            not shard dim 0 (the batch dim each process loads part of).
        PartitionSpecError: a spec names an axis its mesh does not have.
    """

    def __init__(self, input_sharding: ShardingSpec | Mapping[Any, ShardingSpec] | None) -> None:
        if input_sharding is None or isinstance(input_sharding, ShardingSpec):
            specs: dict[Any, ShardingSpec] = {} if input_sharding is None else {None: input_sharding}
        elif isinstance(input_sharding, Mapping):
            specs = dict(input_sharding)
            for key, spec in specs.items():
                if not isinstance(spec, ShardingSpec):
                    raise InputShardingError(
                        f"input_sharding[{key!r}] must be a spmdtorch.partition.ShardingSpec, got {type(spec).__name__}"
                    )
        else:
            raise InputShardingError(
                "input_sharding must be None, a spmdtorch.partition.ShardingSpec or a dict of batch key -> "
                f"ShardingSpec, got {type(input_sharding).__name__}"
            )
        for key, spec in specs.items():
            where = "input_sharding" if key is None else f"input_sharding[{key!r}]"
            spec.mesh.named_sharding(spec.partition_spec)  # unknown axis names fail here, not mid-epoch
            if spec.minibatch and (not spec.partition_spec or spec.partition_spec[0] is None):
                raise InputShardingError(
                    f"{where} is {_describe_spec(spec)}: with minibatch=True each process loads only its "
                    "part of dim 0 (the batch), so dim 0 must be sharded, e.g. partition_spec=('data', None)"
                )
        self.by_key = specs
        self.is_dict = isinstance(input_sharding, Mapping)
        self.any_minibatch = any(s.minibatch for s in specs.values())

    def spec_for(self, path: pytree.KeyPath, leaf: torch.Tensor, batch_index: int) -> ShardingSpec | None:
        """The spec for the tensor at ``path`` of a batch, or None (replicated)."""
        where = f"batch {batch_index}, tensor {pytree.keystr(path) or '(the batch)'}"
        if self.is_dict:
            key = path[0].key if path and isinstance(path[0], pytree.MappingKey) else None
            spec = self.by_key.get(key)
        else:
            spec = self.by_key.get(None)
        if spec is not None and len(spec.partition_spec) != leaf.dim():
            if not spec.minibatch and not self.is_dict:
                return None  # as in PyTorch/XLA: one spec applies to the tensors of its rank only
            raise InputShardingError(
                f"{where} has shape {tuple(leaf.shape)} ({leaf.dim()} dims) but its input_sharding is "
                f"{_describe_spec(spec)} ({len(spec.partition_spec)} entries); give one partition_spec "
                "entry per dim"
            )
        if spec is None and self.any_minibatch:
            raise InputShardingError(
                f"{where} (shape {tuple(leaf.shape)}) has no input_sharding that applies, but the loader "
                "uses minibatch=True: each process holds only its part of the batch, so this tensor "
                "cannot be replicated. Give it a minibatch spec (use a dict input_sharding keyed by "
                "batch key)"
            )
        return spec

    def check_keys(self, batch: object, batch_index: int) -> None:
        """A dict ``input_sharding`` needs a dict batch holding every key it names."""
        if not self.is_dict:
            return
        if not isinstance(batch, Mapping):
            raise InputShardingError(
                f"input_sharding is a dict (keys {sorted(map(str, self.by_key))}) but batch {batch_index} is a "
                f"{type(batch).__name__}; a dict input_sharding needs dict batches, otherwise pass one "
                "ShardingSpec"
            )
        missing = [k for k in self.by_key if k not in batch]
        if missing:
            raise InputShardingError(
                f"input_sharding names key(s) {missing} that batch {batch_index} does not have (its keys: "
                f"{list(batch)}); fix the key names or drop those specs"
            )


@dataclasses.dataclass(frozen=True)
class Placed:
    """A batch tensor on the devices, not yet wrapped as an xla tensor."""

    array: jax.Array  # padded when logical_shape is set
    dtype: torch.dtype
    sharding: jax.sharding.NamedSharding | None  # from a spec; None: the replicated default
    logical_shape: tuple[int, ...] | None


def _place_tensor(t: torch.Tensor, spec: ShardingSpec | None, where: str) -> Placed:
    if t.device.type != "cpu":
        raise InputShardingError(f"{where} is on {t.device}; the loader moves CPU tensors to the devices")
    host = np.array(transfer.host_numpy(t), copy=True)  # the loader may reuse its buffers
    if spec is None:
        return Placed(multihost.put_global(host, transfer.replicated_sharding()), t.dtype, None, None)
    sharding = spec.mesh.named_sharding(spec.partition_spec, t.dim())
    if spec.minibatch:
        try:
            arr = multihost.put_process_local(host, sharding)
        except ValueError as e:
            raise InputShardingError(
                f"{where}: this process's part of the batch, shape {tuple(t.shape)}, does not split over "
                f"{_describe_spec(spec)}: {e}. Each process's part of dim 0 must divide evenly over its "
                "devices on the sharded axes (use drop_last=True or a batch size multiple of that)"
            ) from e
        return Placed(arr, t.dtype, sharding, None)
    target = padding.padded_shape(host.shape, sharding)
    if target is None:
        return Placed(multihost.put_global(host, sharding), t.dtype, sharding, None)
    # Uneven: pad on the host so each device holds only its block (lazy/padding.py).
    padded = np.zeros(target, dtype=host.dtype)
    padded[tuple(slice(0, n) for n in host.shape)] = host
    return Placed(multihost.put_global(padded, sharding), t.dtype, sharding, tuple(host.shape))


def place(batch: Any, shardings: InputShardings, batch_index: int = 0) -> tuple[list[Any], pytree.TreeSpec]:
    """Copies every CPU tensor of ``batch`` to the devices; other leaves stay as they are.

    Returns ``(leaves, treespec)`` where tensor leaves became :class:`Placed`.
    """
    shardings.check_keys(batch, batch_index)
    flat, treespec = pytree.tree_flatten_with_path(batch)
    leaves: list[Any] = []
    for path, leaf in flat:
        if isinstance(leaf, torch.Tensor) and not isinstance(leaf, XlaTensor):
            spec = shardings.spec_for(path, leaf, batch_index)
            where = f"batch {batch_index}, tensor {pytree.keystr(path) or '(the batch)'}"
            leaf = _place_tensor(leaf, spec, where)
        leaves.append(leaf)
    return leaves, treespec


def _wrap_one(p: Placed) -> XlaTensor:
    shape = p.logical_shape or tuple(p.array.shape)
    st = Storage(p.array, p.sharding)
    if p.sharding is not None:
        st.annotated = True  # as if mark_sharding(t, spec.mesh, spec.partition_spec) was called
        st.logical_shape = p.logical_shape
    return XlaTensor(st, (), shape, contiguous_strides(shape), 0, p.dtype)


def wrap(leaves: Sequence[Any], treespec: pytree.TreeSpec) -> Any:
    """The batch again, with every :class:`Placed` leaf as an xla tensor (main thread)."""
    return pytree.tree_unflatten([_wrap_one(x) if isinstance(x, Placed) else x for x in leaves], treespec)


def send_cpu_data_to_device(
    data: Any,
    device: torch.device | str | int | None = None,
    input_sharding: ShardingSpec | Mapping[Any, ShardingSpec] | None = None,
) -> Any:
    """Moves the CPU tensors of ``data`` (any nesting of dict/list/tuple) to ``"xla"``.

    The synchronous version of what the loaders do for each batch (PyTorch/XLA's
    ``xm.send_cpu_data_to_device``).

    Args:
        data: A tensor or a nested structure holding tensors.
        device: An xla device (kept for PyTorch/XLA compatibility; there is one
            virtual xla device per process in SPMD).
        input_sharding: None, a ``ShardingSpec`` or a dict of them (see
            :class:`~spmdtorch.data.MpDeviceLoader`).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.data import send_cpu_data_to_device
        >>> out = send_cpu_data_to_device({"x": torch.ones(2), "n": 3})
        >>> out["x"].device, out["n"]
        (device(type='xla', index=0), 3)
    """
    _check_device(device)
    leaves, treespec = place(data, InputShardings(input_sharding))
    return wrap(leaves, treespec)


def _check_device(device: torch.device | str | int | None) -> None:
    if device is None:
        return
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError):
        dev = None
    if dev is None or dev.type != "xla":
        raise InputShardingError(f"device must be an xla device such as spmdtorch.device() or 'xla', got {device!r}")
