"""Host <-> device transfers and the default placement of unannotated tensors.

In SPMD mode an unannotated xla tensor is *replicated* over every device (as
in PyTorch/XLA), so every array the library creates lives on the same device
set and any two of them can meet in one program. The array-level copies are in
``spmdtorch.tensor._host``; ``to_cpu`` (an xla tensor's value, computed) in
``spmdtorch.tensor._values``.
"""

from spmdtorch.lazy import replicated_sharding
from spmdtorch.tensor._host import array_to_torch, host_numpy, numpy_to_torch, plain_cpu, to_device_array
from spmdtorch.tensor._values import to_cpu

__all__ = [
    "array_to_torch",
    "host_numpy",
    "numpy_to_torch",
    "plain_cpu",
    "replicated_sharding",
    "to_cpu",
    "to_device_array",
]
