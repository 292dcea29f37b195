"""Host <-> device copies of arrays: CPU tensors to JAX arrays and back.

Array-level only (no xla tensor here): ``spmdtorch.tensor.transfer`` is the
public face, which adds ``to_cpu`` for xla tensors. Unannotated data is placed
with ``spmdtorch.lazy.replicated_sharding`` (replicated over every device).
"""

from __future__ import annotations

import jax
import ml_dtypes
import numpy as np
import torch

from spmdtorch import _dtypes
from spmdtorch.lazy import metrics, replicated_sharding
from spmdtorch.tensor import multihost

__all__ = [
    "HostCopy",
    "array_to_torch",
    "host_copy",
    "host_numpy",
    "numpy_to_torch",
    "plain_cpu",
    "put_host_copy",
    "to_device_array",
]


def plain_cpu(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached, with lazy conjugate/negative bits applied (numpy cannot see them)."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return t


def host_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (no copy) of a CPU tensor, narrowed to the storage dtype."""
    t = plain_cpu(t)
    storage = _dtypes.to_torch_dtype(_dtypes.to_jax_dtype(t.dtype))
    if storage != t.dtype:
        if t.dtype == torch.int64 and t.numel():
            lo, hi = int(t.min()), int(t.max())
            if lo < -(2**31) or hi >= 2**31:
                raise OverflowError(
                    f"int64 tensor with values in [{lo}, {hi}] does not fit the int32 device "
                    "storage spmdtorch uses (jax x64 is off); keep it on the CPU or reduce it"
                )
        t = t.to(storage)
    if t.dtype == torch.bfloat16:
        return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.contiguous().numpy()


def to_device_array(t: torch.Tensor, sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """Copy a CPU tensor to the devices (replicated unless ``sharding`` given).

    The copy is what keeps device data immutable when the user later writes
    into the CPU tensor.
    """
    return put_host_copy(host_copy(t), sharding or replicated_sharding(), t.nbytes)


def host_copy(t: torch.Tensor) -> np.ndarray:
    """A private numpy copy of the CPU tensor ``t``'s data, in its device storage dtype.

    On CPU, JAX may alias host memory instead of copying (even with
    may_alias=False for replicated shardings), and torch users may write into
    their tensor right after ``.to("xla")``. JAX gets this copy: it is the one
    copy a transfer makes, JAX may then alias it freely.
    """
    if t.device.type != "cpu":
        raise RuntimeError(f"expected a CPU tensor to transfer, got one on {t.device}")
    return np.array(host_numpy(t), copy=True)


def put_host_copy(host: np.ndarray, sharding: jax.sharding.Sharding, nbytes: int) -> jax.Array:
    """Places ``host`` (a private copy: JAX may alias it) with ``sharding``, counted as one transfer.

    ``nbytes`` is what the transfer counts in ``OutboundBytes`` (the torch
    tensor's size, as PyTorch/XLA's OutboundData).
    """
    metrics.inc("TransferToDevice")
    metrics.inc("OutboundBytes", nbytes)  # PyTorch/XLA's OutboundData metric (spmdtorch.compat)
    with metrics.timed("TransferToDeviceTime"):
        # Multi-process: each process puts only its own shards (tensor/multihost.py).
        return multihost.put_global(host, sharding)


def array_to_torch(arr: jax.Array, dtype: torch.dtype) -> torch.Tensor:
    """Copy a concrete JAX array into a fresh CPU tensor of torch ``dtype``.

    Single-device and replicated arrays on CPU devices go through DLPack
    (zero-copy view of one shard) followed by the one copy that makes the
    result writable without touching device data; on an accelerator, and for
    sharded arrays, numpy copies to the host (DLPack would hand a CUDA build
    of torch a ``cuda`` tensor, not a CPU one).
    """
    metrics.inc("TransferFromDevice")
    metrics.inc("InboundBytes", arr.nbytes)  # PyTorch/XLA's InboundData metric (spmdtorch.compat)
    with metrics.timed("TransferFromDeviceTime"):
        if len(arr.sharding.device_set) > 1:
            # Data spread over several devices, replicated or sharded: what PyTorch/XLA
            # calls sharded data (PjRtShardedData), read back through ReplicateShardedData.
            metrics.inc("TransferFromDeviceMultiDevice")
        if arr.is_fully_replicated or len(arr.sharding.device_set) == 1:
            shard = arr.addressable_data(0)
            out = None
            if all(d.platform == "cpu" for d in shard.devices()):
                try:
                    out = torch.from_dlpack(shard).clone()
                except (RuntimeError, TypeError, BufferError):
                    pass
            if out is None:
                out = numpy_to_torch(np.asarray(shard))
        else:  # sharded; across processes this is a collective (tensor/multihost.py)
            metrics.inc("TransferFromDeviceSharded")  # PyTorch/XLA's ReplicateShardedData (spmdtorch.compat)
            out = numpy_to_torch(multihost.gather(arr))
    if out.dtype != dtype:
        out = out.to(dtype)
    return out


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """A CPU tensor owning a copy of ``a`` (bfloat16 through its int16 bits: torch cannot read ml_dtypes)."""
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.array(a.view(np.int16))).view(torch.bfloat16)
    return torch.from_numpy(np.array(a))


class HostCopy:
    """A private host copy of a CPU tensor's data: an xla tensor's value before its upload.

    Implements ``spmdtorch.lazy._storage.HostValue``; made by ``.to("xla")``
    (``spmdtorch.tensor.transfer``: deferred upload).

    Attributes:
        array: the data in its device storage dtype (int64 as int32, as on the
            devices); JAX may alias it once placed.
        nbytes: the torch tensor's size, which the upload counts as transferred.
    """

    __slots__ = ("array", "nbytes")

    def __init__(self, t: torch.Tensor) -> None:
        self.array = host_copy(t)
        self.nbytes = t.nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    def place(self, sharding: jax.sharding.Sharding, padded_shape: tuple[int, ...] | None) -> jax.Array:
        """The data on the devices with ``sharding`` (padded on the host when the mesh does not divide it)."""
        host = self.array
        if padded_shape is not None:
            # Uneven: each device gets only its padded block (lazy/padding.py).
            padded = np.zeros(padded_shape, dtype=host.dtype)
            padded[tuple(slice(0, n) for n in host.shape)] = host
            host = padded
        return put_host_copy(host, sharding, self.nbytes)
