"""Sharding annotations and inspection for xla tensors.

What a tensor's sharding is and how to read it back:

* annotating: :func:`mark_sharding` (tensors and modules, by glob rules),
  :func:`clear_sharding`, :func:`mark_sharding_with_gradients`,
  :class:`ShardingSpec` (a reusable ``(mesh, spec)`` pair), :func:`tensor_sharding`;
* inspecting: :func:`get_sharding_spec` (PyTorch/XLA's HLO sharding string),
  :func:`sharding_type` / :class:`ShardingType`, :func:`hlo_sharding_string` /
  :func:`parse_hlo_sharding_string` for JAX shardings, the ``rich`` pictures
  :func:`visualize_tensor_sharding`, :func:`visualize_sharding`,
  :func:`visualize_array_sharding`;
* this process's shards: :func:`local_shards`, :func:`load_local_shards_`;
* manual regions: :func:`shard_map`, :func:`enable_manual_sharding` /
  :func:`disable_manual_sharding` and the collectives usable inside them;
* manual sharding one op at a time: :func:`full_to_shard_shape`,
  :func:`shard_to_full_shape`, :func:`mark_manual_sharding`.

``spmdtorch.partition`` re-exports the PyTorch/XLA-named part of this API.

Declared internal API (for ``spmdtorch.plan``; not in ``__all__``, imported as ``X as X``):
:func:`match_rules`, the glob matching ``mark_sharding`` applies to a module's
parameter names, so a plan reports the same errors as marking does.

Example:
    >>> import torch, spmdtorch
    >>> from spmdtorch.mesh import get_1d_mesh
    >>> from spmdtorch.sharding import mark_sharding, sharding_type
    >>> x = mark_sharding(torch.zeros(8, 4, device="xla"), get_1d_mesh("x"), ("x", None))
    >>> sharding_type(x)
    <ShardingType.TILED: 3>
"""

from spmdtorch.sharding._hlo_sharding import (
    HloShardingError,
    ParsedHloSharding,
    hlo_sharding_string,
    logical_device_order,
    parse_hlo_sharding_string,
)
from spmdtorch.sharding._inspect import get_sharding_spec, sharding_type, visualize_tensor_sharding
from spmdtorch.sharding._manual import (
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
from spmdtorch.sharding._manual_shapes import (
    ManualShardingError,
    full_to_shard_shape,
    mark_manual_sharding,
    shard_to_full_shape,
)
from spmdtorch.sharding._marking import (
    ShardingError,
    ShardingSpec,
    clear_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    tensor_sharding,
)
from spmdtorch.sharding._marking import match_rules as match_rules
from spmdtorch.sharding._sharding_type import ShardingType, sharding_type_of
from spmdtorch.sharding._shards import XLAShard, load_local_shards_, local_shards
from spmdtorch.sharding._visualize import VisualizationError, visualize_array_sharding, visualize_sharding

__all__ = [
    # annotating
    "ShardingError",
    "ShardingSpec",
    "clear_sharding",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "tensor_sharding",
    # inspecting
    "HloShardingError",
    "ParsedHloSharding",
    "ShardingType",
    "VisualizationError",
    "get_sharding_spec",
    "hlo_sharding_string",
    "logical_device_order",
    "parse_hlo_sharding_string",
    "sharding_type",
    "sharding_type_of",
    "visualize_array_sharding",
    "visualize_sharding",
    "visualize_tensor_sharding",
    # this process's shards
    "XLAShard",
    "load_local_shards_",
    "local_shards",
    # manual regions
    "ManualRegionError",
    "all_gather",
    "all_reduce",
    "axis_index",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "ppermute",
    "reduce_scatter",
    "shard_map",
    # manual sharding one op at a time (PyTorch/XLA's _spmd_full_to_shard_shape / _spmd_shard_to_full_shape)
    "ManualShardingError",
    "full_to_shard_shape",
    "mark_manual_sharding",
    "shard_to_full_shape",
]
