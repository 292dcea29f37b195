"""Sharding annotations, HLO sharding strings, sharding types and visualisation.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.partition import mark_sharding, get_sharding_spec
    >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    >>> w = mark_sharding(torch.zeros(8, 4, device="xla"), mesh, ("data", "model"))
    >>> get_sharding_spec(w)
    '{devices=[4,2]0,1,2,3,4,5,6,7}'
"""

from spmdtorch.partition.activation_checkpoint import (
    CPU_REMAT_XLA_FLAG,
    checkpoint_module,
    cpu_keeps_barriers,
    optimization_barrier,
)
from spmdtorch.partition.fsdp import (
    FSDPv2,
    FSDPv2Error,
    FSDPv2MeshError,
    FSDPv2OutputError,
    FSDPv2WrapError,
    SpmdFullyShardedDataParallel,
    load_plain_state_dict,
    plain_state_dict,
)
from spmdtorch.partition.hlo_sharding import hlo_sharding_string, parse_hlo_sharding_string
from spmdtorch.partition.inspect import get_sharding_spec, sharding_type, visualize_tensor_sharding
from spmdtorch.partition.manual import (
    ManualRegionError,
    all_gather,
    all_reduce,
    axis_index,
    disable_manual_sharding,
    enable_manual_sharding,
    ppermute,
    reduce_scatter,
    shard_map,
)
from spmdtorch.partition.marking import (
    ShardingError,
    ShardingSpec,
    clear_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    tensor_sharding,
)
from spmdtorch.partition.materialize import MaterializeError, materialize
from spmdtorch.partition.memory import (
    CompiledMemory,
    MemoryBudgetError,
    MemoryPlan,
    MemoryPlanError,
    TensorMemory,
    compiled_memory,
    memory_plan,
)
from spmdtorch.partition.mixed_precision import MixedPrecision, MixedPrecisionError
from spmdtorch.partition.planner import PlanError, ShardingPlan, plan_sharding
from spmdtorch.partition.sharding_enum import ShardingType
from spmdtorch.partition.shards import XLAShard, load_local_shards_, local_shards
from spmdtorch.partition.visualize import visualize_array_sharding, visualize_sharding
from spmdtorch.partition.wrap import (
    lambda_auto_wrap_policy,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    "FSDPv2",
    "FSDPv2Error",
    "FSDPv2MeshError",
    "FSDPv2OutputError",
    "FSDPv2WrapError",
    "SpmdFullyShardedDataParallel",
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
