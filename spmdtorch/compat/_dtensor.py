"""``torch_xla.distributed.spmd.api``: the DTensor bridge (``xla_distribute_tensor``, ``xla_distribute_module``, ``convert_to_xla_mesh``, ``auto_policy``).

``torch.distributed.tensor.distribute_tensor`` / ``distribute_module`` hand a
``DeviceMesh("xla", ...)`` to these functions (they import them from
``torch_xla.distributed.spmd``). The mesh becomes an spmdtorch
:class:`~spmdtorch.mesh.Mesh` with the same device order, the placements a
partition spec (:mod:`spmdtorch.compat._placements`), and the tensor is
annotated with ``mark_sharding``. An ``xla`` ``DeviceMesh`` needs no process
group: ``torch.distributed`` skips that setup for the ``xla`` device type.

Example:
    >>> import spmdtorch.compat; spmdtorch.compat.install()
    >>> import torch
    >>> from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor
    >>> mesh = DeviceMesh("xla", list(range(8)))
    >>> t = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [Shard(0)])
    >>> t.partition_spec
    (0, None)
    >>> spmdtorch.compat.uninstall()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement, Replicate

from spmdtorch import runtime, sharding
from spmdtorch.compat import _runtime
from spmdtorch.compat._placements import (
    DeviceMeshMismatchError,
    PlacementsLengthError,
    placements_to_partition_spec,
)
from spmdtorch.compat._sharded_tensor import XLAShardedTensor
from spmdtorch.compat.errors import CompatError
from spmdtorch.dtensor import register_mesh_hooks
from spmdtorch.mesh import Mesh

__all__ = [
    "DistributeModuleError",
    "auto_policy",
    "convert_to_xla_mesh",
    "convert_to_xla_partition_spec",
    "xla_distribute_module",
    "xla_distribute_tensor",
]


class DistributeModuleError(CompatError, ValueError):
    """``xla_distribute_module``'s ``input_fn``/``output_fn`` has neither 2 nor 3 parameters (a ``ValueError``)."""


def auto_policy(mod_name: str, mod: nn.Module, mesh: DeviceMesh) -> None:
    """PyTorch/XLA's marker ``partition_fn`` asking ``xla_distribute_module`` for XLA auto-sharding.

    Calling it does nothing (as in PyTorch/XLA); passing it to
    ``distribute_module``/``xla_distribute_module`` turns on spmdtorch's
    auto-sharding (``use_spmd(auto=True)``, a heuristic rule, not XLA's
    solver: see the migration guide) and moves the module to the xla device.
    """


def _check_device_mesh(dt_mesh: Any, func: str) -> DeviceMesh:
    if not isinstance(dt_mesh, DeviceMesh):
        raise TypeError(
            f"{func}: device_mesh must be a torch.distributed DeviceMesh, got {type(dt_mesh).__name__}; build one "
            "with DeviceMesh('xla', device_ids) or init_device_mesh('xla', mesh_shape)"
        )
    if dt_mesh.device_type != "xla":
        raise DeviceMeshMismatchError(
            f"{func}: device_mesh has device_type {dt_mesh.device_type!r}, expected 'xla'; create it as "
            "DeviceMesh('xla', ...) or init_device_mesh('xla', ...)"
        )
    return dt_mesh


def convert_to_xla_mesh(dt_mesh: DeviceMesh) -> Mesh:
    """The spmdtorch (``xs``) ``Mesh`` of an ``xla`` ``DeviceMesh``: same device order, shape and dim names.

    Raises:
        DeviceMeshMismatchError: (an ``AssertionError``, as PyTorch/XLA's
            assert) the mesh does not cover every device, or is not an ``xla`` mesh.
        TypeError: ``dt_mesh`` is not a ``DeviceMesh``.
    """
    _runtime.use_spmd()
    dt_mesh = _check_device_mesh(dt_mesh, "convert_to_xla_mesh")
    count = _runtime.global_runtime_device_count()
    if dt_mesh.size() != count:
        raise DeviceMeshMismatchError(
            f"convert_to_xla_mesh: the DeviceMesh has {dt_mesh.size()} devices but the runtime has {count}; an "
            f"SPMD mesh spans every device: build it over all {count} (e.g. DeviceMesh('xla', list(range({count}))))"
        )
    ids = [int(i) for i in dt_mesh.mesh.flatten().tolist()]
    return Mesh(ids, tuple(dt_mesh.mesh.shape), dt_mesh.mesh_dim_names)


def convert_to_xla_partition_spec(tensor: torch.Tensor, placements: Sequence[Placement]) -> tuple[Any, ...]:
    """PyTorch/XLA's partition spec for DTensor ``placements`` of ``tensor`` (one entry per tensor dim).

    Example: on a 2-D mesh ``[Replicate(), Shard(0)]`` of a 3-D tensor is ``(1, None, None)``.

    Raises:
        ShardDimError: a ``Shard`` dim the tensor does not have.
        UnsupportedPlacementError: ``Partial`` (a ``ValueError``).
    """
    _runtime.use_spmd()
    return placements_to_partition_spec(placements, tensor.dim())


def _wrap(t: torch.Tensor, mesh: Mesh, partition_spec: tuple[Any, ...]) -> XLAShardedTensor:
    # What PyTorch/XLA's mark_sharding returns: the tensor wrapped with its mesh shape and spec.
    return XLAShardedTensor(t, mesh_shape=mesh.mesh_shape, partition_spec=partition_spec)


def _sharding_type(t: torch.Tensor) -> sharding.ShardingType:
    return sharding.sharding_type(t) if t.device.type == "xla" else sharding.ShardingType.REPLICATED


def xla_distribute_tensor(
    tensor: torch.Tensor, device_mesh: DeviceMesh, placements: Sequence[Placement] | None = None
) -> XLAShardedTensor:
    """Shard ``tensor`` over ``device_mesh`` as ``placements`` say; returns an ``XLAShardedTensor``.

    ``torch.distributed.tensor.distribute_tensor`` calls this for an ``xla``
    mesh. The tensor moves to the xla device if it is elsewhere; without
    ``placements`` it is replicated. The global view stays a normal tensor:
    ops on it run sharded, collectives inserted by the compiler.

    Args:
        tensor: the global tensor (not a ``DTensor``; an ``XLAShardedTensor``
            only if it is not sharded yet).
        device_mesh: a ``DeviceMesh("xla", ...)`` over every device.
        placements: one ``Shard(dim)``/``Replicate()`` per mesh dim.

    Raises:
        PlacementsLengthError: not one placement per mesh dim.
        ShardDimError, UnsupportedPlacementError: a bad placement.
        DeviceMeshMismatchError: the mesh is not an ``xla`` mesh over all devices.
        CompatError: ``tensor`` is a ``DTensor``, a meta tensor, or already sharded.

    Example:
        >>> import torch
        >>> from torch.distributed.tensor import DeviceMesh, Shard
        >>> t = xla_distribute_tensor(torch.zeros(16, 2), DeviceMesh("xla", list(range(8))), [Shard(0)])
        >>> t.sharding_spec
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
    """
    dt_mesh = _check_device_mesh(device_mesh, "xla_distribute_tensor")
    mesh = convert_to_xla_mesh(dt_mesh)
    if isinstance(tensor, DTensor) and not isinstance(tensor, XLAShardedTensor):
        raise CompatError(
            "xla_distribute_tensor: Cannot distribute a DTensor with local tensor on xla devices. The input tensor "
            "must be global: pass dtensor.full_tensor()"
        )
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"xla_distribute_tensor: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.is_meta:
        raise CompatError(
            f"xla_distribute_tensor: tensor (shape {tuple(tensor.shape)}) is a meta tensor and has no data to "
            "place; materialize it first (module.to_empty(device='xla') and initialize, or torch.empty(..., "
            "device='xla'))"
        )
    global_tensor = tensor.global_tensor if isinstance(tensor, XLAShardedTensor) else tensor
    if global_tensor is not tensor and _sharding_type(global_tensor) not in (
        sharding.ShardingType.REPLICATED,
        sharding.ShardingType.MAXIMAL,
    ):
        raise CompatError(
            f"xla_distribute_tensor: the XLAShardedTensor (shape {tuple(tensor.shape)}) is already annotated with "
            f"non-replicated sharding {sharding.get_sharding_spec(global_tensor)}; clear the existing annotation "
            "first with torch_xla.distributed.spmd.clear_sharding(t), then distribute it"
        )
    if global_tensor.device.type != "xla":
        global_tensor = global_tensor.to("xla")
    if placements is None:
        placements = [Replicate() for _ in range(dt_mesh.ndim)]
    if len(placements) != dt_mesh.ndim:
        raise PlacementsLengthError(
            f"xla_distribute_tensor: `placements` must have the same length as `device_mesh.ndim`! Found "
            f"placements length: {len(placements)}, and device_mesh.ndim: {dt_mesh.ndim}."
        )
    spec = convert_to_xla_partition_spec(global_tensor, placements)
    if _sharding_type(global_tensor) == sharding.ShardingType.REPLICATED and sharding.get_sharding_spec(global_tensor):
        # An explicit replicated annotation gives way (PyTorch/XLA distributes a replicated tensor).
        sharding.clear_sharding(global_tensor)
    # A tensor already split differently is refused by mark_sharding (ShardingError naming clear_sharding).
    sharding.mark_sharding(global_tensor, mesh, spec)
    return _wrap(global_tensor, mesh, spec)


def xla_distribute_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
    input_fn: Callable[..., Any] | None = None,
    output_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """Shard a module's parameters with ``partition_fn`` and hook its inputs/outputs (``distribute_module`` on xla).

    ``partition_fn(name, submodule, device_mesh)`` is called for every
    submodule (it calls ``distribute_tensor`` on the parameters to shard); the
    others stay replicated. ``input_fn(module, inputs, device_mesh)`` becomes
    a forward pre-hook, ``output_fn(module, outputs, device_mesh)`` a forward
    hook (the deprecated two-argument forms ``(inputs, device_mesh)`` still work,
    with a ``FutureWarning``).

    Returns:
        ``module`` itself.

    ``partition_fn=auto_policy`` instead turns on auto-sharding and moves
    ``module`` to the xla device, as PyTorch/XLA does.

    Raises:
        DistributeModuleError: ``input_fn``/``output_fn`` takes neither 2 nor 3 arguments.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"xla_distribute_module: module must be an nn.Module, got {type(module).__name__}")
    if partition_fn is not None:
        if getattr(partition_fn, "__name__", "") == "auto_policy":
            # PyTorch/XLA calls no partition_fn here: the parameters are placed when a program first reads them.
            _runtime.use_spmd(auto=True)
            module.to(runtime.device())
        else:
            for name, submod in module.named_modules():
                partition_fn(name, submod, device_mesh)  # type: ignore[arg-type]  # PyTorch/XLA passes it as given
    register_mesh_hooks(
        module, device_mesh, input_fn, output_fn, caller="xla_distribute_module", error=DistributeModuleError
    )
    return module
