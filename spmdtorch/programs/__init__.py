"""How torch code becomes XLA programs: barriers, and the fast paths that record a function once.

Lazy mode records every op and cuts a program at each barrier (``sync``,
``mark_step``, ``step``: ``_step``). The fast paths record Python once and
replay: ``compile`` traces a whole function until two traces agree, then
replays its executable (``_compile``, with its guards in ``_guards`` and the
float hyperparameters it lifts in ``_hparam_inputs``); ``scan`` and
``scan_layers`` record a loop body once into one ``jax.lax.scan``
(``_scan``); ``assume_pure`` records a module or function once and replays
the recording (``_pure``); ``call_jax`` inserts a JAX function
(``_call_jax``). ``scan``, ``assume_pure`` and ``call_jax`` share the
backward node that applies a recorded VJP (``_vjp_nodes``).

Layer: above ``spmdtorch.tensor``, below ``sharding``/``fsdp`` and the
user-facing packages. The names below are its API (``spmdtorch`` re-exports
the public ones); the scan helpers are for ``spmdtorch.models``'s scanned
decoders, ``BARRIER_HOOKS`` for compat's PyTorch/XLA environment and
``INTERNAL`` for the higher packages' own hooks and per-call wrapper modules,
which ``compile`` neither guards nor keys (``_guards``).
"""

from spmdtorch.programs._call_jax import CallJaxError, call_jax
from spmdtorch.programs._compile import CompiledArgumentTypeError, CompiledFunction, compile
from spmdtorch.programs._guards import INTERNAL
from spmdtorch.programs._pure import AssumePureError, AssumePureTypeError, PureFunction, assume_pure
from spmdtorch.programs._scan import (
    SCAN_LAYERS_HOOK,
    ScanError,
    ScanTypeError,
    check_same_structure,
    is_checkpointed,
    run_layers,
    scan,
    scan_layers,
    stack_layer_tensors,
    unstack_layer_tensor,
)
from spmdtorch.programs._step import BARRIER_HOOKS, add_step_closure, mark_step, step, sync, wait_device_ops

__all__ = [
    "BARRIER_HOOKS",
    "INTERNAL",
    "SCAN_LAYERS_HOOK",
    "AssumePureError",
    "AssumePureTypeError",
    "CallJaxError",
    "CompiledArgumentTypeError",
    "CompiledFunction",
    "PureFunction",
    "ScanError",
    "ScanTypeError",
    "add_step_closure",
    "assume_pure",
    "call_jax",
    "check_same_structure",
    "compile",
    "is_checkpointed",
    "mark_step",
    "run_layers",
    "scan",
    "scan_layers",
    "stack_layer_tensors",
    "step",
    "sync",
    "unstack_layer_tensor",
    "wait_device_ops",
]
