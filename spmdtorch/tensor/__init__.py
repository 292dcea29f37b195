"""The xla tensor: subclass, dispatch, device routing and transfers.

Layer: above ``spmdtorch.lazy``. Inside, bottom to top: ``_host``/``multihost``
(array copies), ``_facts`` < ``_router`` < ``_values`` (op facts, routing,
reading and writing values), ``xla_tensor`` (the class), ``dispatch`` (the op
handlers, which register with the router), ``transfer``, then
``autocast``/``device_mode``/``optim_hooks``/``random_state``.
"""

from spmdtorch.tensor import device_mode as device_mode  # registers the torch-function handler
from spmdtorch.tensor import dispatch as dispatch  # registers the op handlers with the router
from spmdtorch.tensor.xla_tensor import XlaTensor, is_xla_tensor, set_view_chain, storage_of, view_chain

# storage_of / view_chain / set_view_chain: the declared way into a tensor's data
# model for the packages above; XlaTensor._st / ._chain stay this package's
# (tests/partition/test_packages.py checks that no other package reads them).
__all__ = ["XlaTensor", "device_mode", "dispatch", "is_xla_tensor", "set_view_chain", "storage_of", "view_chain"]
