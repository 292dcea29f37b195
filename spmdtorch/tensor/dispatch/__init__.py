"""The dispatcher: what happens to one ATen call on xla tensors.

``XlaTensor.__torch_dispatch__`` hands every call to the router
(``spmdtorch.tensor._router``, whose docstring gives the resolution order);
this package holds the handlers it routes to, one concern per module:

* ``_args``: one walk over the arguments (template, dynamic inputs, cache key);
* ``_meta``: output metadata from torch's meta kernels, cached (``MetaSpec``);
* ``_paths``: the general paths: lowering, view, mutation, decomposition;
* ``_special``: ops with a handler of their own, registered with ``@special``;
* ``_foreach``: ``_foreach_*`` ops as one call per element;
* ``_fallback``: data-dependent ops on CPU copies;
* ``_functions``: torch functions run as one fused ATen op (attention);
* ``_factories``: factories on the XLA key and inside C++ composite ops.

Importing this package registers the handlers (``spmdtorch.tensor`` does).
The names below are its internal API for the rest of spmdtorch.
"""

from spmdtorch.lazy import record
from spmdtorch.tensor._facts import OpFacts, functional_twin, op_facts
from spmdtorch.tensor._router import dispatch, facts_of, reset_op_facts, special_op
from spmdtorch.tensor._values import (
    assign_value,
    base_value,
    concrete_value,
    constrained_chain,
    read_value,
    to_cpu,
)
from spmdtorch.tensor.dispatch._errors import DeviceMismatchError, ForeachError, MetaFactoryLeak
from spmdtorch.tensor.dispatch._factories import CAPTURE_FUNCS, capture_meta_factories, factory_kernel
from spmdtorch.tensor.dispatch._fallback import cpu_fallback
from spmdtorch.tensor.dispatch._foreach import foreach
from spmdtorch.tensor.dispatch._functions import FUNCTION_OVERRIDES, under_saved_tensor_hooks
from spmdtorch.tensor.dispatch._fused_adam import fused_adam
from spmdtorch.tensor.dispatch._meta import META_CACHE, MetaSpec, TensorSpec, meta_outputs
from spmdtorch.tensor.dispatch._paths import write
from spmdtorch.tensor.dispatch._special import copy_, local_scalar_dense
from spmdtorch.tensor.xla_tensor import wrap_jax_array

__all__ = [
    "CAPTURE_FUNCS",
    "FUNCTION_OVERRIDES",
    "under_saved_tensor_hooks",
    "META_CACHE",
    "DeviceMismatchError",
    "ForeachError",
    "MetaFactoryLeak",
    "MetaSpec",
    "OpFacts",
    "TensorSpec",
    "assign_value",
    "base_value",
    "capture_meta_factories",
    "concrete_value",
    "constrained_chain",
    "copy_",
    "cpu_fallback",
    "dispatch",
    "facts_of",
    "factory_kernel",
    "foreach",
    "fused_adam",
    "functional_twin",
    "local_scalar_dense",
    "meta_outputs",
    "op_facts",
    "read_value",
    "record",
    "reset_op_facts",
    "special_op",
    "to_cpu",
    "wrap_jax_array",
    "write",
]
