"""The xla tensor: subclass, dispatch, device routing and transfers.

Layer: above ``spmdtorch.lazy``. Inside, bottom to top: ``_host``/``multihost``
(array copies), ``_facts`` < ``_router`` < ``_values`` (op facts, routing,
reading and writing values), ``xla_tensor`` (the class), ``dispatch`` (the op
handlers, which register with the router), ``transfer``, then
``autocast``/``device_mode``/``optim_hooks``/``random_state``.
"""

from spmdtorch.tensor import device_mode as device_mode  # registers the torch-function handler
from spmdtorch.tensor import dispatch as dispatch  # registers the op handlers with the router
from spmdtorch.tensor._backward import BACKWARD_FUNCS as BACKWARD_FUNCS
from spmdtorch.tensor._backward import BACKWARD_NOT_HANDLED as BACKWARD_NOT_HANDLED
from spmdtorch.tensor._backward import run_backward as run_backward
from spmdtorch.tensor.xla_tensor import XlaTensor, is_xla_tensor, set_view_chain, storage_of, view_chain

# run_backward (with BACKWARD_FUNCS, BACKWARD_NOT_HANDLED): the one way a tensor subclass's torch-function
# handler starts a backward pass from its tensors' gradient edges (spmdtorch.dtensor's XlaDTensor uses it).
# storage_of / view_chain / set_view_chain: the declared way into a tensor's data
# model for the packages above; XlaTensor._st / ._chain stay this package's
# (tests/partition/test_packages.py checks that no other package reads them).
__all__ = ["XlaTensor", "device_mode", "dispatch", "is_xla_tensor", "set_view_chain", "storage_of", "view_chain"]
