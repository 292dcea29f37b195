"""``torch_xla.distributed.spmd.xla_sharded_tensor``: ``XLAShardedTensor`` and ``XLAShard``.

PyTorch/XLA's ``xs.mark_sharding`` returns an :class:`XLAShardedTensor`: a
``DTensor`` subclass wrapping the annotated xla tensor (``global_tensor``) with
its mesh shape and partition spec, whose ``local_shards`` are this process's
per-device blocks (with padding, as PyTorch/XLA reports them).

Here it is both a ``DTensor`` and an spmdtorch ``XlaTensor`` that shares the
wrapped tensor's storage (it is an alias, like a view without a view step).
So every spmdtorch function, optimizer and ``xm``/``xs`` call accepts it as
it is, and an in-place op on it (``p.add_``, an optimizer step on a wrapped
``nn.Parameter``) updates the wrapped tensor. An op on it runs on that
storage and, as in PyTorch/XLA, returns its result as an ``XLAShardedTensor``
(without mesh information: ``wrap_as_sharded_tensor`` adds it); autograd flows
through that wrapping. The wrapper itself is an autograd leaf, as in PyTorch/XLA.

Example:
    >>> import spmdtorch.compat; spmdtorch.compat.install()
    >>> import torch, torch_xla.distributed.spmd as xs
    >>> xt = xs.mark_sharding(torch.arange(8.0, device="xla"), xs.get_1d_mesh(), (0,))
    >>> xt.sharding_spec, xt.local_shards[1].data.tolist()
    ('{devices=[8]0,1,2,3,4,5,6,7}', [1.0])
    >>> spmdtorch.compat.uninstall()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import EllipsisType
from typing import Any, cast

import jax
import torch
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_leaves, tree_map

from spmdtorch import sharding
from spmdtorch.compat.errors import CompatError
from spmdtorch.tensor import XlaTensor, storage_of, view_chain

__all__ = [
    "PlacementsUnavailableError",
    "ShardLoadError",
    "ShardedTensorTypeError",
    "XLAShard",
    "XLAShardedTensor",
    "unwrap_sharded_tensor",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
]


class ShardLoadError(CompatError):
    """``load_local_shards_`` got shards that do not fit the tensor (a ``RuntimeError``, as in PyTorch/XLA)."""


class ShardedTensorTypeError(CompatError, TypeError):
    """``XLAShardedTensor(elem)`` of something that is not a tensor."""


class PlacementsUnavailableError(CompatError, ValueError):
    """``.placements`` of an ``XLAShardedTensor`` that has no mesh shape or partition spec (a ``ValueError``)."""


@dataclasses.dataclass
class XLAShard:
    """One device's block of a sharded tensor, copied to the host when it was read.

    Attributes:
        data: the block as a CPU tensor, padded with zeros to the block shape
            when the sharding does not divide the tensor evenly.
        indices: the slices of the global tensor it covers (padding excluded),
            one ``slice(start, stop, 1)`` per dim; ``...`` when every device
            holds the whole tensor (replicated).
        shard_device: the device it came from, as ``"<TYPE>:<ordinal>"``.
        replica_id: which copy of this block it is (0 for a tiled sharding,
            the device ordinal when replicated, the replication group's index
            for a partial one).
    """

    data: torch.Tensor
    indices: EllipsisType | list[slice]
    shard_device: str
    replica_id: int

    def _unpadded_index(self) -> Any:
        if isinstance(self.indices, EllipsisType):
            return ...
        return tuple(slice(0, s.stop - s.start) for s in self.indices)

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the padding (the values at ``indices``)."""
        return self.data[self._unpadded_index()]

    @unpadded_data.setter
    def unpadded_data(self, t: torch.Tensor) -> None:
        self.data[self._unpadded_index()] = t


def _device_label(ordinal: int) -> str:
    return f"{jax.devices()[0].platform.upper()}:{ordinal}"


def _local_shards(t: torch.Tensor) -> list[XLAShard]:
    """PyTorch/XLA's view of ``t``'s local shards, from spmdtorch's unpadded ones."""
    shards = sharding.local_shards(t)
    ndim = t.dim()
    # Every device holds a block of one shape; spmdtorch trims the padding off
    # uneven blocks, so the block shape is the largest extent seen per dim.
    block = tuple(max((s.indices[d].stop - s.indices[d].start) for s in shards) for d in range(ndim))
    whole = all(tuple((sl.start, sl.stop) for sl in s.indices) == tuple((0, n) for n in t.shape) for s in shards)
    out = []
    for s in shards:
        data = s.data
        if tuple(data.shape) != block:
            padded = torch.zeros(block, dtype=data.dtype)
            padded[tuple(slice(0, n) for n in data.shape)] = data
            data = padded
        indices: EllipsisType | list[slice] = ...
        if not whole:
            indices = [slice(sl.start, sl.stop, 1) for sl in s.indices]
        out.append(XLAShard(data, indices, _device_label(s.device_id), s.replica_id))
    return out


def _load_local_shards(t: torch.Tensor, shards: Sequence[XLAShard | torch.Tensor]) -> None:
    if isinstance(shards, (str, bytes, torch.Tensor)) or not isinstance(shards, Sequence):
        raise ShardLoadError(
            f"load_local_shards_ expects a list of XLAShard (one per local device, as .local_shards returns), "
            f"got {type(shards).__name__}"
        )
    kind = sharding.sharding_type(t)
    if kind in (sharding.ShardingType.REPLICATED, sharding.ShardingType.MAXIMAL):
        raise ShardLoadError(
            f"load_local_shards_ writes the blocks of a sharded tensor, but this tensor (shape {tuple(t.shape)}) is "
            f"{kind.name}; copy new values into it with t.copy_(...) instead"
        )
    current = _local_shards(t)
    if len(shards) != len(current):
        raise ShardLoadError(
            f"load_local_shards_ got {len(shards)} shards but this process's devices hold {len(current)} blocks of "
            f"the tensor (shape {tuple(t.shape)}); pass one per local device, in .local_shards order"
        )
    unpadded = []
    for i, (given, have) in enumerate(zip(shards, current)):
        data = given.data if isinstance(given, XLAShard) else given
        if not isinstance(data, torch.Tensor):
            raise ShardLoadError(
                f"load_local_shards_: shards[{i}].data must be a CPU tensor, got {type(data).__name__}"
            )
        if tuple(data.shape) != tuple(have.data.shape):
            raise ShardLoadError(
                f"load_local_shards_: shards[{i}] has shape {tuple(data.shape)}, but {have.shard_device} holds a block "
                f"of shape {tuple(have.data.shape)} (padding included); give each shard its device's block shape"
            )
        unpadded.append(dataclasses.replace(have, data=data).unpadded_data)
    try:
        sharding.load_local_shards_(t, unpadded)
    except sharding.ShardingError as e:
        raise ShardLoadError(f"load_local_shards_: {e}") from e


def _is_xla(t: object) -> bool:
    return isinstance(t, XlaTensor)


class _Wrap(torch.autograd.Function):
    """Identity whose output is an ``XLAShardedTensor``: the wrapper stays in the autograd graph of ``t``."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, mesh_shape: Any, partition_spec: Any) -> torch.Tensor:
        return XLAShardedTensor(t, mesh_shape, partition_spec)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


# torch's own list of functions whose results a subclass must not re-wrap
# (the ``.grad`` / ``._base`` getters: wrapping would make ``p.grad is p.grad`` false).
_NO_WRAP = torch.overrides.get_default_nowrap_functions()


class XLAShardedTensor(DTensor, XlaTensor):
    """An xla tensor with PyTorch/XLA's sharded-tensor interface (see the module docstring).

    ``XLAShardedTensor(elem, mesh_shape=None, partition_spec=None, requires_grad=False)``
    wraps the xla tensor ``elem`` (an ``XLAShardedTensor`` is unwrapped first).
    As in PyTorch/XLA the wrapper is an autograd leaf of its own (not
    requiring grad unless ``requires_grad=True``): ``xs.mark_sharding(p, ...)``
    annotates the parameter ``p``, whose gradients come from ops on ``p``.
    Results of ops on a wrapper stay in the autograd graph.

    Attributes:
        global_tensor: the wrapped xla tensor (detached when the wrapper is
            made with ``requires_grad=True``, as in PyTorch/XLA).
        mesh_shape: the mesh's shape, when known (``mark_sharding`` sets it).
        partition_spec: the partition spec, when known.

    A host (CPU) tensor is copied to the xla device first.

    Raises:
        ShardedTensorTypeError: ``elem`` is not a tensor.
    """

    global_tensor: torch.Tensor
    mesh_shape: tuple[int, ...] | None
    partition_spec: tuple[Any, ...] | None
    _cached_spec: Any

    @staticmethod
    def __new__(
        cls, elem: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None, *args: Any, **kwargs: Any
    ) -> XLAShardedTensor:
        if isinstance(elem, XLAShardedTensor):
            mesh_shape = mesh_shape if mesh_shape is not None else elem.mesh_shape
            partition_spec = partition_spec if partition_spec is not None else elem.partition_spec
            elem = elem.global_tensor
        if not isinstance(elem, torch.Tensor):
            raise ShardedTensorTypeError(
                f"XLAShardedTensor wraps a tensor, got {type(elem).__name__}; pass an xla tensor (t.to('xla'))"
            )
        if not isinstance(elem, XlaTensor):
            # PyTorch/XLA wraps host tensors too; here the wrapper is an xla
            # tensor, so the host tensor's values are copied to the device.
            elem = cast(XlaTensor, elem.to("xla"))
        requires_grad = bool(kwargs.get("requires_grad", False))
        r = XlaTensor.__new__(
            cls,
            storage_of(elem),
            view_chain(elem),
            tuple(elem.shape),
            elem.stride(),
            elem.storage_offset(),
            elem.dtype,
            requires_grad=requires_grad,
        )
        r.global_tensor = elem.detach() if requires_grad else elem
        r.mesh_shape = tuple(mesh_shape) if mesh_shape is not None else None
        r.partition_spec = tuple(partition_spec) if partition_spec is not None else None
        r._cached_spec = None
        return r

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """Everything is set by ``__new__`` (DTensor's ``__init__`` expects its own arguments)."""

    # -- PyTorch/XLA's interface -----------------------------------------------
    @property
    def local_shards(self) -> list[XLAShard]:
        """This process's blocks of the tensor, copied to the host (padding included)."""
        return _local_shards(self.global_tensor)

    def load_local_shards_(self, shards: Sequence[XLAShard | torch.Tensor]) -> None:
        """Replace the tensor's data on this process's devices with ``shards`` (as ``local_shards`` gives them).

        Raises:
            ShardLoadError: the tensor is not sharded, or the number or a
                shape of the shards does not match its blocks.
        """
        _load_local_shards(self.global_tensor, shards)
        self.invalidate_spec_cache()

    @property
    def sharding_spec(self) -> str:
        """PyTorch/XLA's HLO sharding string (``'{devices=[2,4]0,1,...}'``, ``'{replicated}'``; ``''`` if none).

        As in PyTorch/XLA, a replicated value a program computed reports ``'{replicated}'``
        while host data and pending values report ``''``.
        """
        return sharding.get_sharding_spec(self.global_tensor, computed=True)

    @property
    def sharding_type(self) -> sharding.ShardingType:
        """The kind of sharding (``xs.ShardingType``)."""
        return sharding.sharding_type(self.global_tensor)

    # -- DTensor's interface ---------------------------------------------------
    @property
    def _spec(self) -> Any:  # type: ignore[override]  # DTensor declares _spec as an attribute
        if self._cached_spec is None:
            from spmdtorch.compat import _placements

            self._cached_spec = _placements.dtensor_spec(self.global_tensor, self.mesh_shape, self.partition_spec)
        return self._cached_spec

    @property
    def placements(self) -> tuple[Any, ...]:
        """The DTensor placements of this sharding, one per mesh dim.

        Raises:
            PlacementsUnavailableError: the tensor has no ``mesh_shape`` or
                ``partition_spec`` (an op's result: use ``wrap_as_sharded_tensor``).
        """
        try:
            return tuple(self._spec.placements)
        except ValueError as e:
            raise PlacementsUnavailableError(
                "Placements not available: XLAShardedTensor requires mesh_shape and partition_spec to be set. "
                "Use mark_sharding() to properly initialize sharding information."
            ) from e

    def invalidate_spec_cache(self) -> None:
        """Forget the cached DTensor spec (after the sharding changed)."""
        self._cached_spec = None

    def redistribute(self, device_mesh: Any, placements: Sequence[Any], *, async_op: bool = False) -> XLAShardedTensor:  # type: ignore[override]
        """Re-annotate the tensor with DTensor ``placements`` over ``device_mesh`` (a copy with ``async_op``)."""
        from spmdtorch.compat import _placements

        done = _placements.redistribute(self.global_tensor, device_mesh, placements, async_op=async_op)
        return XLAShardedTensor(done.tensor, mesh_shape=done.mesh.mesh_shape, partition_spec=done.partition_spec)

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]
        return f"XLAShardedTensor({self.global_tensor})"

    __str__ = __repr__  # type: ignore[assignment]  # the same method, as XlaTensor does

    # -- dispatch: DTensor's would shard ops itself; these are xla tensor ops ------
    __torch_dispatch__ = XlaTensor.__dict__["__torch_dispatch__"]
    __tensor_flatten__ = XlaTensor.__tensor_flatten__
    __tensor_unflatten__ = XlaTensor.__dict__["__tensor_unflatten__"]

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = XlaTensor.__dict__["__torch_function__"].__func__(cls, func, types, args, kwargs)
        if func in _NO_WRAP or getattr(func, "__name__", "") in ("__get__", "__set__"):
            return out
        # As in PyTorch/XLA, an op's results are XLAShardedTensors too; a result
        # that is one of the inputs (an in-place op's) is returned as it is.
        inputs = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        return tree_map(lambda x: _wrap_result(x, inputs), out)


def _wrap_result(x: Any, inputs: set[int]) -> Any:
    if not isinstance(x, torch.Tensor) or isinstance(x, (XLAShardedTensor, HostShardedTensor)) or id(x) in inputs:
        return x
    if not _is_xla(x):
        # A host result (``.cpu()``): PyTorch/XLA wraps it too, and its users
        # read ``.global_tensor`` of it. ``as_subclass`` keeps the autograd history.
        return x.as_subclass(HostShardedTensor)
    if x.requires_grad and torch.is_grad_enabled():
        # PyTorch/XLA wraps below autograd; here the wrapping is an autograd
        # identity, so backward still reaches what the op was computed from.
        wrapped: XLAShardedTensor = _Wrap.apply(x, None, None)
        return wrapped
    return XLAShardedTensor(x)


class HostShardedTensor(torch.Tensor):
    """A host (CPU) result of an op on an ``XLAShardedTensor``, such as ``xst.cpu()``.

    PyTorch/XLA wraps every tensor an op on an ``XLAShardedTensor`` returns,
    host tensors included, so its users write ``xst.cpu().global_tensor``.
    This is that tensor itself (same data, same autograd history), with
    ``global_tensor`` giving it as a plain ``torch.Tensor``; ops on it return
    host-sharded tensors too, as PyTorch/XLA's return wrappers. It has no
    sharding (it is host data), and it pickles (``torch.save``) as a plain tensor.
    """

    @property
    def global_tensor(self) -> torch.Tensor:
        """The same tensor as a plain ``torch.Tensor`` (sharing data and autograd history)."""
        return self.as_subclass(torch.Tensor)

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if any(isinstance(a, XlaTensor) for a in tree_leaves((args, kwargs))):
            return NotImplemented  # an op with xla tensors: theirs to run (a 0-d host operand is fine there)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        if func in _NO_WRAP:
            return out
        # Only plain host tensors are wrapped: torch's default would also turn
        # an xla result (``.to("xla")``) into this host class.
        return tree_map(lambda x: x.as_subclass(cls) if type(x) is torch.Tensor else x, out)

    def __reduce_ex__(self, proto: Any) -> Any:
        # Saved as a plain tensor: a checkpoint must not need this class to load
        # (torch.load's weights_only mode refuses unknown tensor subclasses).
        return self.global_tensor.__reduce_ex__(proto)

    def __repr__(self, *, tensor_contents: Any = None) -> Any:  # type: ignore[override]  # torch types it loosely
        return f"XLAShardedTensor({self.global_tensor})"


def wrap_as_sharded_tensor(
    t: torch.Tensor, mesh_shape: Sequence[int] | None = None, partition_spec: Sequence[Any] | None = None
) -> XLAShardedTensor:
    """``t`` as an ``XLAShardedTensor`` carrying ``mesh_shape``/``partition_spec`` (updated in place if it is one)."""
    if not isinstance(t, XLAShardedTensor):
        return XLAShardedTensor(t, mesh_shape=mesh_shape, partition_spec=partition_spec)
    if mesh_shape is not None:
        t.mesh_shape = tuple(mesh_shape)
    if partition_spec is not None:
        t.partition_spec = tuple(partition_spec)
    if mesh_shape is not None or partition_spec is not None:
        t.invalidate_spec_cache()
    return t


def unwrap_sharded_tensor(t: Any) -> Any:
    """The wrapped tensor of an ``XLAShardedTensor``; anything else as it is."""
    return t.global_tensor if isinstance(t, XLAShardedTensor) else t


def wrap_if_sharded(x: Any) -> Any:
    """An ``XLAShardedTensor`` wrapping ``x`` if ``x`` is an xla tensor with a sharding; else ``x``."""
    if _is_xla(x) and not isinstance(x, XLAShardedTensor) and sharding.get_sharding_spec(x):
        return XLAShardedTensor(x)
    return x
