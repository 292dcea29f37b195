"""Where an xla tensor's data lives, and how a restored array takes its place.

Storages of uneven shardings hold *padded* data (``spmdtorch.lazy.padding``):
JAX cannot hold an array whose sharded dim the mesh axis does not divide. On
save such a tensor is written at its logical shape from a copy with an *even*
sharding (the uneven axes moved to dims they divide, or dropped), so no
device ever holds the whole array unless no dim divides. On restore Orbax
reads straight into the padded shape with the tensor's own sharding (it
zero-fills the tail), so each device reads only its block.
"""

from __future__ import annotations

import functools
import math
import typing
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import numpy.typing as npt
import torch
from jax.sharding import NamedSharding, PartitionSpec

from spmdtorch import _dtypes
from spmdtorch.checkpoint.errors import UnsupportedValueError
from spmdtorch.checkpoint.tree import KeyPath, keystr
from spmdtorch.lazy import caches, executor, padding
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor import storage_of, transfer, view_chain
from spmdtorch.tensor.dispatch import concrete_value
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["Layout", "even_sharding", "host_array", "install", "layout_of", "save_value", "to_torch"]


class Layout:
    """Where a target xla tensor's data lives.

    Attributes:
        sharding: the ``jax.sharding.Sharding`` of its storage.
        storage_shape: the storage's shape (padded when uneven).
        logical_shape: the tensor's shape.
        storage_dtype: the JAX dtype its storage holds.
    """

    __slots__ = ("logical_shape", "sharding", "storage_dtype", "storage_shape")
    sharding: jax.sharding.Sharding
    storage_shape: tuple[int, ...]
    logical_shape: tuple[int, ...]
    storage_dtype: np.dtype[Any]

    def __init__(
        self,
        sharding: jax.sharding.Sharding,
        storage_shape: Sequence[int],
        logical_shape: Sequence[int],
        storage_dtype: npt.DTypeLike,
    ) -> None:
        self.sharding = sharding
        self.storage_shape = tuple(storage_shape)
        self.logical_shape = tuple(logical_shape)
        self.storage_dtype = np.dtype(storage_dtype)

    @property
    def padded(self) -> bool:
        return self.storage_shape != self.logical_shape


def _concrete_storage_value(t: XlaTensor) -> jax.Array:
    st = storage_of(t)
    if isinstance(st.value, LazyRef):
        executor.sync()
    # After a sync every live storage holds a concrete jax.Array (Storage.value
    # is typed loosely, as a LazyRef or an array).
    return typing.cast(jax.Array, st.value)


def layout_of(t: XlaTensor, path: KeyPath) -> Layout:
    """The layout a restored value must take to replace ``t``'s data in place."""
    if view_chain(t):
        raise UnsupportedValueError(
            f"state{keystr(path)} is a view of another tensor (shape {tuple(t.shape)}); load into the "
            "base tensor, or t.clone() the view first"
        )
    value = _concrete_storage_value(t)
    sharding = storage_of(t).sharding or value.sharding
    return Layout(sharding, value.shape, tuple(t.shape), value.dtype)


def even_sharding(sharding: jax.sharding.Sharding, shape: Sequence[int]) -> jax.sharding.Sharding:
    """A sharding of ``shape`` close to ``sharding`` whose every sharded dim divides evenly.

    Example:
        >>> import numpy as np, jax
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
        >>> even_sharding(NamedSharding(mesh, P("x", None)), (10, 8)).spec
        P(None, 'x')
    """
    if not isinstance(sharding, NamedSharding):
        return sharding
    mesh = sharding.mesh
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    kept: list[list[str]] = []
    freed: list[str] = []
    for dim, entry in zip(shape, spec):
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        keep: list[str] = []
        n = 1
        for name in names:
            if dim % (n * mesh.shape[name]) == 0:
                keep.append(name)
                n *= mesh.shape[name]
            else:
                freed.append(name)
        kept.append(keep)
    # An axis freed from an uneven dim goes to the first dim it divides, so
    # the copy stays split as many ways as the original where it can.
    for name in freed:
        for d, dim in enumerate(shape):
            n = math.prod(mesh.shape[a] for a in kept[d])
            if dim % (n * mesh.shape[name]) == 0:
                kept[d].append(name)
                break
    entries = [None if not k else (k[0] if len(k) == 1 else tuple(k)) for k in kept]
    return NamedSharding(mesh, PartitionSpec(*entries))


@caches.memoize("checkpoint.placement.unpad_programs", maxsize=256)
def _unpad_program(
    logical_shape: tuple[int, ...], out_sharding: jax.sharding.Sharding
) -> Callable[[jax.Array], jax.Array]:
    return jax.jit(functools.partial(padding.unpad, shape=logical_shape), out_shardings=out_sharding)


def save_value(t: XlaTensor) -> tuple[jax.Array, jax.Array, tuple[int, ...] | None]:
    """``(array to save, array to fingerprint, logical shape or None)`` for an xla tensor.

    The array to save has the tensor's logical shape and an even sharding;
    the fingerprint reads the storage itself (padding excluded).
    """
    if view_chain(t):
        value = concrete_value(t)
        return value, value, None
    value = _concrete_storage_value(t)
    logical = tuple(t.shape)
    if tuple(value.shape) == logical:
        return value, value, None
    even = even_sharding(value.sharding, logical)
    return _unpad_program(logical, even)(value), value, logical


def install(t: XlaTensor, array: jax.Array) -> None:
    """Make ``array`` (the target's layout) the new data of xla tensor ``t``, in place."""
    st = storage_of(t)
    st.set(array)  # also drops the storage's cached view values (Storage.vcache)


@caches.memoize("checkpoint.placement.cast_programs", maxsize=256)
def _cast_program(dtype: np.dtype[Any], sharding: jax.sharding.Sharding) -> Callable[[jax.Array], jax.Array]:
    return jax.jit(lambda x: x.astype(dtype), out_shardings=sharding)


def cast(array: jax.Array, dtype: npt.DTypeLike, sharding: jax.sharding.Sharding) -> jax.Array:
    """``array`` converted to ``dtype`` on device, keeping ``sharding``."""
    return _cast_program(np.dtype(dtype), sharding)(array)


def host_array(t: torch.Tensor) -> npt.NDArray[Any]:
    """A CPU tensor's data as a numpy array of its own (full-width) dtype."""
    t = transfer.plain_cpu(t).contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype not in _dtypes._TORCH_TO_NUMPY:
        raise UnsupportedValueError(f"CPU tensors of dtype {t.dtype} cannot be checkpointed")
    return t.numpy()


def to_torch(a: npt.ArrayLike) -> torch.Tensor:
    """A numpy array (bfloat16 included) as a CPU tensor (sharing memory when possible)."""
    return transfer.numpy_to_torch(np.asarray(a))


def device_put(host: npt.NDArray[Any], layout: Layout) -> jax.Array:
    """Place a host array of the logical shape into ``layout`` (padding on the host if uneven)."""
    if layout.padded:
        host = np.pad(host, [(0, p - n) for n, p in zip(host.shape, layout.storage_shape)])
    placed: jax.Array = jax.device_put(np.ascontiguousarray(host), layout.sharding)  # typed Any by jax
    return placed
