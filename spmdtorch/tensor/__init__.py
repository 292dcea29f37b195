"""The xla tensor: subclass, dispatch, device routing and transfers."""

from spmdtorch.tensor.xla_tensor import XlaTensor, is_xla_tensor

__all__ = ["XlaTensor", "is_xla_tensor"]
