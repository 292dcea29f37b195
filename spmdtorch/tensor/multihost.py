"""Transfers when a process addresses only part of the devices (multi-host jobs).

In a multi-process job a sharding usually spans devices of other processes.
JAX then needs each process to supply only the shards on its own devices:

* :func:`put_global` — every process holds the *whole* host array (the same
  data everywhere, as after ``t.to("xla")`` in PyTorch/XLA) and puts only its
  own shards (``jax.make_array_from_callback``). ``jax.device_put`` would do
  the same but first all-gathers the array to check that the processes agree,
  a collective per transfer.
* :func:`put_process_local` — each process holds only *its part* (a data
  loader's per-host slice of the batch); JAX places the parts
  (``jax.make_array_from_process_local_data``).
* :func:`gather` — the reverse for reads (``.cpu()``, ``.item()``, ``print``):
  an all-gather that *every process must call*, in the same order, as in
  PyTorch/XLA; arrays above :func:`max_gather_bytes` raise
  :class:`GatherTooLargeError` instead of being copied to every host.

Example:
    >>> import numpy as np, jax
    >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    >>> s = NamedSharding(Mesh(np.array(jax.devices()), ("d",)), P())
    >>> gather(put_global(np.arange(4.0), s)).tolist()
    [0.0, 1.0, 2.0, 3.0]
"""

from __future__ import annotations

import math
import weakref

import jax
import numpy as np

from spmdtorch import runtime
from spmdtorch.lazy import executor

__all__ = [
    "ENV_MAX_GATHER_BYTES",
    "GatherTooLargeError",
    "gather",
    "max_gather_bytes",
    "put_global",
    "placed_from_host",
    "put_process_local",
    "set_max_gather_bytes",
]

# The limit and its error live in spmdtorch.runtime (configuration); re-exported here.
ENV_MAX_GATHER_BYTES = runtime.ENV_MAX_GATHER_BYTES
GatherTooLargeError = runtime.GatherTooLargeError
max_gather_bytes = runtime.max_gather_bytes
set_max_gather_bytes = runtime.set_max_gather_bytes


# id() -> weak reference of each live array these functions placed from host
# data. PyTorch/XLA reports no sharding for data transferred from the host
# while it reports the output sharding of every program result ("{replicated}"
# included); ``spmdtorch.sharding.get_sharding_spec(t, computed=True)`` tells
# the two apart with this (the placements themselves are the same).
_HOST_PLACED: dict[int, weakref.ref[jax.Array]] = {}


def _note_host_placed(arr: jax.Array) -> jax.Array:
    key = id(arr)

    def forget(_ref: weakref.ref[jax.Array]) -> None:
        _HOST_PLACED.pop(key, None)

    _HOST_PLACED[key] = weakref.ref(arr, forget)
    return arr


def placed_from_host(arr: object) -> bool:
    """Whether ``arr`` is an array :func:`put_global`/:func:`put_process_local` placed from host data."""
    ref = _HOST_PLACED.get(id(arr))
    return ref is not None and ref() is arr


def _keep_host_mark(old: jax.Array, new: jax.Array) -> None:
    """The executor moved ``old`` to the user's mesh unchanged: still data from the host."""
    if placed_from_host(old):
        _note_host_placed(new)


executor.REHOME_HOOKS.append(_keep_host_mark)


def put_global(host: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """Places ``host`` (the whole array, identical in every process) with ``sharding``.

    Each process transfers only the shards of its own devices; nothing checks
    that the processes passed the same data (PyTorch/XLA does not either).
    """
    if sharding.is_fully_addressable:
        return _note_host_placed(jax.device_put(host, sharding))
    return _note_host_placed(jax.make_array_from_callback(host.shape, sharding, lambda index: host[index]))


def put_process_local(
    host: np.ndarray, sharding: jax.sharding.Sharding, global_shape: tuple[int, ...] | None = None
) -> jax.Array:
    """Builds a global array from each process's part ``host`` (see module docs).

    With one process the part is the whole array.
    """
    return _note_host_placed(jax.make_array_from_process_local_data(sharding, host, global_shape))


def gather(arr: jax.Array, what: str = "tensor") -> np.ndarray:
    """The whole value of ``arr`` on this host, gathered from every process.

    Every process must call this for the same array (it is a collective).

    Raises:
        GatherTooLargeError: ``arr`` is larger than :func:`max_gather_bytes`.
    """
    if arr.is_fully_addressable:
        return np.asarray(arr)
    size = math.prod(arr.shape) * arr.dtype.itemsize
    limit = max_gather_bytes()
    if size > limit:
        raise GatherTooLargeError(
            f"reading the {what} of shape {tuple(arr.shape)} ({arr.dtype}, {size:,} bytes) would copy it "
            f"from every process to every host, which is above the limit of {limit:,} bytes. Read only "
            "this process's shards (spmdtorch.partition.local_shards), reduce it on the device first, or "
            f"raise the limit with spmdtorch.runtime.set_max_gather_bytes / {ENV_MAX_GATHER_BYTES}"
        )
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(arr, tiled=True))
