"""FSDPv2: fully sharded data parallelism as SPMD annotations, and its companions.

* :class:`FSDPv2` (alias :class:`SpmdFullyShardedDataParallel`) annotates
  each parameter over the mesh axis ``"fsdp"`` and the forward output over the
  batch; XLA's partitioner inserts the all-gathers and reduce-scatters.
  :func:`plain_state_dict` / :func:`load_plain_state_dict` read and write the
  unwrapped model's keys.
* :func:`accumulate_gradients`: gradient accumulation over micro-batches
  with one gradient reduction per step (not one per micro-batch).
* Wrap policies (:func:`transformer_auto_wrap_policy`,
  :func:`size_based_auto_wrap_policy`, :func:`lambda_auto_wrap_policy`,
  :func:`recursive_wrap`) pick the submodules to wrap, with torch's contract.
* :class:`MixedPrecision`: low-precision compute on float32 master weights.
* Activation checkpointing (rematerialisation): :func:`checkpoint_module`,
  :func:`optimization_barrier`, :func:`cpu_keeps_barriers` and
  :data:`CPU_REMAT_XLA_FLAG` (not to be confused with ``spmdtorch.checkpoint``,
  which saves and restores state).

Annotations go through :mod:`spmdtorch.sharding`; ``spmdtorch.partition``
re-exports this API under PyTorch/XLA's names.

Declared internal API (for ``spmdtorch.plan``; not in ``__all__``, imported as ``X as X``):
:data:`FSDP_AXIS` and :func:`param_spec`, the rule FSDPv2 applies to an
unsharded parameter, so memory plans and ``materialize`` shard as wrapping does;
:func:`in_local_step`, true while :func:`accumulate_gradients` records its
per-device body, where ``spmdtorch.dtensor`` leaves its annotations out.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.fsdp import FSDPv2, param_spec
    >>> model = FSDPv2(torch.nn.Linear(16, 32), mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
    >>> param_spec(model.module.weight.shape)
    ('fsdp', None)
"""

from spmdtorch.fsdp._accumulate import AccumulateGradientsError, accumulate_gradients
from spmdtorch.fsdp._fsdpv2 import FSDP_AXIS as FSDP_AXIS
from spmdtorch.fsdp._fsdpv2 import (
    FSDPv2,
    FSDPv2Error,
    FSDPv2MeshError,
    FSDPv2OutputError,
    FSDPv2WrapError,
    SpmdFullyShardedDataParallel,
    load_plain_state_dict,
    plain_state_dict,
)
from spmdtorch.fsdp._fsdpv2 import in_local_step as in_local_step
from spmdtorch.fsdp._fsdpv2 import param_spec as param_spec
from spmdtorch.fsdp._mixed_precision import MixedPrecision, MixedPrecisionError
from spmdtorch.fsdp._remat import (
    CPU_REMAT_XLA_FLAG,
    checkpoint_module,
    cpu_keeps_barriers,
    optimization_barrier,
)
from spmdtorch.fsdp._wrap import (
    lambda_auto_wrap_policy,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    # the wrapper
    "FSDPv2",
    "FSDPv2Error",
    "FSDPv2MeshError",
    "FSDPv2OutputError",
    "FSDPv2WrapError",
    "SpmdFullyShardedDataParallel",
    "load_plain_state_dict",
    "plain_state_dict",
    # gradient accumulation with one reduction per step
    "AccumulateGradientsError",
    "accumulate_gradients",
    # wrap policies
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    # mixed precision
    "MixedPrecision",
    "MixedPrecisionError",
    # activation checkpointing
    "CPU_REMAT_XLA_FLAG",
    "checkpoint_module",
    "cpu_keeps_barriers",
    "optimization_barrier",
]
