"""Host <-> device transfers and the default placement of unannotated tensors.

In SPMD mode an unannotated xla tensor is *replicated* over every device (as
in PyTorch/XLA), so every array the library creates lives on the same device
set and any two of them can meet in one program. The array-level copies are in
``spmdtorch.tensor._host``; ``to_cpu`` (an xla tensor's value, computed) in
``spmdtorch.tensor._values``.

Deferred upload (PyTorch/XLA's SPMD "virtual device"): :func:`from_host`, the
copy behind ``t.to("xla")``, keeps a private copy of the data on the host
(:class:`HostCopy`) in the new tensor's storage until the value is first
needed (``spmdtorch.lazy._storage``: ``Storage.on_host``). ``mark_sharding``
then sends each device only its shard, where an immediate upload would first
place the whole tensor on every device and reshard it; an op, a read or a
sync uploads it replicated. The copy is taken at once, so writing into the
CPU tensor afterwards never changes the xla tensor (``.to`` copies), and it is
dropped at the upload. ``SPMDTORCH_DEFER_UPLOAD=0`` uploads at once.
"""

from __future__ import annotations

import torch

from spmdtorch.lazy import replicated_sharding
from spmdtorch.tensor._host import (
    HostCopy,
    array_to_torch,
    host_numpy,
    numpy_to_torch,
    plain_cpu,
    to_device_array,
)
from spmdtorch.tensor._values import to_cpu
from spmdtorch.tensor.xla_tensor import XlaTensor, from_host

__all__ = [
    "HostCopy",
    "array_to_torch",
    "from_host",
    "host_numpy",
    "host_shape",
    "numpy_to_torch",
    "plain_cpu",
    "replicated_sharding",
    "to_cpu",
    "to_device_array",
]


def host_shape(t: torch.Tensor) -> tuple[int, ...] | None:
    """The shape of the data an xla tensor still keeps on the host (deferred upload), else None.

    Asking uploads nothing. A view has none of its own (its value is an op on
    its base's, as in PyTorch/XLA, where a view holds IR, not host data).
    """
    if not isinstance(t, XlaTensor) or t._chain:
        return None
    host = t._st.host
    return None if host is None else tuple(host.shape)
