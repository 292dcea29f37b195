"""``torch_xla.distributed.spmd`` (``xs``, also ``.xla_sharding``): meshes and sharding annotations.

``mark_sharding`` returns the annotated tensor itself (PyTorch/XLA wraps it in
an ``XLAShardedTensor``; here every xla tensor already carries its sharding,
``torch_xla._XLAC._get_xla_sharding_spec(t)`` reads it back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from spmdtorch import sharding
from spmdtorch.mesh import HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh
from spmdtorch.partition import (
    ShardingSpec,
    ShardingType,
    XLAShard,
    clear_sharding,
    mark_sharding,
    mark_sharding_with_gradients,
    visualize_sharding,
    visualize_tensor_sharding,
)

__all__ = [
    "HybridMesh",
    "Mesh",
    "ShardingSpec",
    "ShardingType",
    "XLAShard",
    "XLAShardedTensor",
    "clear_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "visualize_sharding",
    "visualize_tensor_sharding",
]

#: Every spmdtorch xla tensor carries its own sharding: PyTorch/XLA's wrapper type is the tensor type.
XLAShardedTensor = torch.Tensor


def _mesh(mesh: Mesh | None, what: str) -> Mesh:
    if mesh is not None:
        return mesh
    found = get_global_mesh()
    if found is None:
        raise sharding.ShardingError(
            f"{what}: no mesh given and no global mesh set; pass mesh=... or call xs.set_global_mesh(mesh) first"
        )
    return found


def enable_manual_sharding(t: torch.Tensor, partition_spec: Sequence[Any], *, mesh: Mesh | None = None) -> torch.Tensor:
    """Enter a manual region: ``t``'s local shard (mesh defaults to the global mesh)."""
    return sharding.enable_manual_sharding(t, partition_spec, mesh=_mesh(mesh, "enable_manual_sharding"))


def disable_manual_sharding(
    t: torch.Tensor, partition_spec: Sequence[Any], full_shape: Sequence[int], *, mesh: Mesh | None = None
) -> torch.Tensor:
    """Leave a manual region: the global tensor of shape ``full_shape`` (mesh defaults to the global mesh)."""
    return sharding.disable_manual_sharding(t, partition_spec, full_shape, mesh=_mesh(mesh, "disable_manual_sharding"))
