"""PyTorch/XLA's SPMD API under one name: sharding, FSDPv2 and planning, re-exported.

PyTorch/XLA spreads this API over ``torch_xla.distributed.spmd``,
``torch_xla.experimental.spmd_fully_sharded_data_parallel`` and
``torch_xla.distributed.fsdp.wrap``; spmdtorch users import it from here
(``from spmdtorch.partition import mark_sharding, FSDPv2``). The code lives in
three packages, one concept each, and this module only re-exports them:

* :mod:`spmdtorch.sharding`: annotations (``mark_sharding``, ``ShardingSpec``...),
  inspection (HLO sharding strings, sharding types, pictures), local shards and
  manual regions (``shard_map`` and its collectives);
* :mod:`spmdtorch.fsdp`: ``FSDPv2``, ``accumulate_gradients``, wrap policies, ``MixedPrecision`` and
  activation checkpointing (``checkpoint_module``, ``CPU_REMAT_XLA_FLAG``);
* :mod:`spmdtorch.plan`: ``plan_sharding``, ``memory_plan``, ``materialize``.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.partition import mark_sharding, get_sharding_spec
    >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    >>> w = mark_sharding(torch.zeros(8, 4, device="xla"), mesh, ("data", "model"))
    >>> get_sharding_spec(w)
    '{devices=[4,2]0,1,2,3,4,5,6,7}'
"""

from spmdtorch.fsdp import (
    CPU_REMAT_XLA_FLAG,
    AccumulateGradientsError,
    FSDPv2,
    FSDPv2Error,
    FSDPv2MeshError,
    FSDPv2OutputError,
    FSDPv2WrapError,
    MixedPrecision,
    MixedPrecisionError,
    SpmdFullyShardedDataParallel,
    accumulate_gradients,
    checkpoint_module,
    cpu_keeps_barriers,
    lambda_auto_wrap_policy,
    load_plain_state_dict,
    optimization_barrier,
    plain_state_dict,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from spmdtorch.plan import (
    CompiledMemory,
    MaterializeError,
    MemoryBudgetError,
    MemoryPlan,
    MemoryPlanError,
    PlanError,
    ShardingPlan,
    TensorMemory,
    compiled_memory,
    materialize,
    memory_plan,
    plan_sharding,
)
from spmdtorch.sharding import (
    ManualRegionError,
    ShardingError,
    ShardingSpec,
    ShardingType,
    XLAShard,
    all_gather,
    all_reduce,
    axis_index,
    clear_sharding,
    disable_manual_sharding,
    enable_manual_sharding,
    get_sharding_spec,
    hlo_sharding_string,
    load_local_shards_,
    local_shards,
    mark_sharding,
    mark_sharding_with_gradients,
    parse_hlo_sharding_string,
    ppermute,
    reduce_scatter,
    shard_map,
    sharding_type,
    tensor_sharding,
    visualize_array_sharding,
    visualize_sharding,
    visualize_tensor_sharding,
)

__all__ = [
    "FSDPv2",
    "FSDPv2Error",
    "FSDPv2MeshError",
    "FSDPv2OutputError",
    "FSDPv2WrapError",
    "SpmdFullyShardedDataParallel",
    "AccumulateGradientsError",
    "accumulate_gradients",
    "lambda_auto_wrap_policy",
    "load_plain_state_dict",
    "plain_state_dict",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
    "ManualRegionError",
    "all_gather",
    "all_reduce",
    "axis_index",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "ppermute",
    "reduce_scatter",
    "shard_map",
    "checkpoint_module",
    "optimization_barrier",
    "CPU_REMAT_XLA_FLAG",
    "cpu_keeps_barriers",
    "MixedPrecision",
    "MixedPrecisionError",
    "ShardingError",
    "ShardingSpec",
    "ShardingType",
    "XLAShard",
    "clear_sharding",
    "get_sharding_spec",
    "hlo_sharding_string",
    "load_local_shards_",
    "local_shards",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "parse_hlo_sharding_string",
    "sharding_type",
    "tensor_sharding",
    "visualize_array_sharding",
    "visualize_sharding",
    "visualize_tensor_sharding",
    "CompiledMemory",
    "MaterializeError",
    "MemoryBudgetError",
    "MemoryPlan",
    "MemoryPlanError",
    "PlanError",
    "ShardingPlan",
    "TensorMemory",
    "compiled_memory",
    "materialize",
    "memory_plan",
    "plan_sharding",
]
