"""Planning a sharded model before it exists: sharding rules, memory, initialisation.

* :func:`plan_sharding` proposes ``mark_sharding`` rules for a model from its
  structure (FSDP, Megatron-style tensor parallelism, or both) and returns a
  :class:`ShardingPlan`.
* :func:`memory_plan` says what each device will hold (parameters, gradients,
  optimizer state, buffers and, given a compiled step, XLA's temporaries) as a
  :class:`MemoryPlan`; :func:`compiled_memory` reads XLA's analysis of a
  compiled step.
* :func:`auto_partition_spec` is the rule of spmdtorch's auto-sharding
  (``runtime.use_spmd(auto=True)``), whose input placement policy this
  package registers with the executor.
* :func:`materialize` turns a model built on ``meta`` into sharded xla tensors
  in one compiled program, so no device holds a full sharded parameter.

Built on :mod:`spmdtorch.sharding` (annotations, rule matching) and
:mod:`spmdtorch.fsdp` (FSDPv2's parameter rule). ``spmdtorch.partition``
re-exports this API; ``spmdtorch.materialize`` is :func:`materialize`.
See ``docs/planning.md``.
"""

from spmdtorch.plan import _auto  # noqa: F401  (registers auto-sharding's input placement policy)
from spmdtorch.plan._auto import auto_partition_spec
from spmdtorch.plan._materialize import MaterializeError, materialize
from spmdtorch.plan._memory import (
    CompiledMemory,
    MemoryBudgetError,
    MemoryPlan,
    MemoryPlanError,
    TensorMemory,
    compiled_memory,
    memory_plan,
)
from spmdtorch.plan._planner import PlanError, ShardingPlan, plan_sharding

__all__ = [
    "CompiledMemory",
    "MaterializeError",
    "MemoryBudgetError",
    "MemoryPlan",
    "MemoryPlanError",
    "PlanError",
    "ShardingPlan",
    "TensorMemory",
    "auto_partition_spec",
    "compiled_memory",
    "materialize",
    "memory_plan",
    "plan_sharding",
]
