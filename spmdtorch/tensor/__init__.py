"""The xla tensor: subclass, dispatch, device routing and transfers.

Layer: above ``spmdtorch.lazy``. Inside, bottom to top: ``_host``/``multihost``
(array copies), ``_facts`` < ``_router`` < ``_values`` (op facts, routing,
reading and writing values), ``xla_tensor`` (the class), ``dispatch`` (the op
handlers, which register with the router), ``transfer``, then
``autocast``/``device_mode``/``optim_hooks``/``random_state``.
"""

from spmdtorch.tensor import device_mode as device_mode  # registers the torch-function handler
from spmdtorch.tensor import dispatch as dispatch  # registers the op handlers with the router
from spmdtorch.tensor.xla_tensor import XlaTensor, is_xla_tensor

__all__ = ["XlaTensor", "device_mode", "dispatch", "is_xla_tensor"]
