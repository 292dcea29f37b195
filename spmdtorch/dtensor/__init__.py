"""torch.distributed's own sharding API (``DeviceMesh``, ``DTensor``) on GSPMD, from one process.

Code written against ``torch.distributed.tensor`` runs here by changing the
imports of the functions that build meshes and DTensors; torch's own classes
(``DeviceMesh``, ``DTensor``, ``Shard``, ``Replicate``, ``Partial``) are used as
they are. A placement is a partition spec over the mesh (docs/dtensor.md has
the table and what differs from multi-controller DTensor): there is no
process group, every DTensor holds the global xla tensor, and XLA's GSPMD
partitioner inserts the collectives.

* meshes: :func:`init_device_mesh` (an :class:`XlaDeviceMesh`, slicing and
  ``_flatten`` as in torch), :func:`spmd_mesh` (the spmdtorch ``Mesh``),
  :func:`mesh_groups`, :func:`root_axes`;
* tensors: :func:`distribute_tensor`, :func:`from_local`, :class:`XlaDTensor`
  (``.placements``, ``.redistribute``, ``.full_tensor``, ``.to_local``),
  :func:`partition_spec` / :func:`placements_of_spec`;
* modules: :func:`distribute_module`, :func:`parallelize_module` (torch's
  ``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``,
  ``PrepareModuleInput``, ``PrepareModuleOutput`` styles), :func:`fully_shard`
  (FSDP2's, parameters as ``Shard(0)`` DTensors; modules become
  :class:`XlaFSDPModule`, a torch ``FSDPModule``); gradient accumulation with
  one reduction per step is :func:`spmdtorch.fsdp.accumulate_gradients`;
* recipes: :func:`parallelize_llama` (torchtitan's FSDP + TP + loss-parallel
  + activation-checkpointing plan for spmdtorch's and transformers' Llama);
* checkpoints: :func:`get_model_state_dict`, :func:`get_optimizer_state_dict`,
  :func:`set_model_state_dict`, :func:`set_optimizer_state_dict` (torch's,
  with DTensors as their global xla tensors) for
  ``torch.distributed.checkpoint`` with spmdtorch's ``SPMDSavePlanner`` /
  ``SPMDLoadPlanner``;
* errors: :mod:`spmdtorch.dtensor.errors`.

Declared internal API (for ``spmdtorch.compat``; not in ``__all__``, imported as ``X as X``):
:func:`register_mesh_hooks`, ``distribute_module``'s input/output hooks.

Example:
    >>> import torch
    >>> from torch.distributed.tensor import Replicate, Shard
    >>> from spmdtorch.dtensor import distribute_tensor, init_device_mesh
    >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    >>> w = distribute_tensor(torch.randn(16, 8), mesh["tp"], [Shard(0)])
    >>> w.placements, w.device_mesh
    ((Shard(dim=0),), DeviceMesh((tp=4), 'xla', stride=(1,)))
"""

from spmdtorch.dtensor._checkpoint import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from spmdtorch.dtensor._fsdp import XlaFSDPModule, fully_shard
from spmdtorch.dtensor._mesh import XlaDeviceMesh, init_device_mesh, mesh_groups, root_axes, spmd_mesh
from spmdtorch.dtensor._module import distribute_module, parallelize_module
from spmdtorch.dtensor._module import register_mesh_hooks as register_mesh_hooks
from spmdtorch.dtensor._placements import partition_spec, placements_of_spec
from spmdtorch.dtensor._tensor import XlaDTensor, distribute_tensor, from_local
from spmdtorch.dtensor._titan import UnknownModelFamilyError, parallelize_llama
from spmdtorch.dtensor.errors import (
    DeviceMeshError,
    DTensorError,
    InplaceGradError,
    LocalTensorError,
    NoRankError,
    PlacementError,
    StateDictError,
    UnsupportedFSDPError,
    UnsupportedPlacementError,
    UnsupportedStyleError,
)

__all__ = [
    "DTensorError",
    "DeviceMeshError",
    "InplaceGradError",
    "LocalTensorError",
    "NoRankError",
    "PlacementError",
    "StateDictError",
    "UnsupportedFSDPError",
    "UnsupportedPlacementError",
    "UnknownModelFamilyError",
    "UnsupportedStyleError",
    "XlaDTensor",
    "XlaFSDPModule",
    "XlaDeviceMesh",
    "distribute_module",
    "distribute_tensor",
    "from_local",
    "fully_shard",
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "init_device_mesh",
    "mesh_groups",
    "parallelize_llama",
    "parallelize_module",
    "partition_spec",
    "placements_of_spec",
    "root_axes",
    "set_model_state_dict",
    "set_optimizer_state_dict",
    "spmd_mesh",
]
