"""``torch_xla.distributed.spmd`` (``xs``, also ``.xla_sharding``): meshes and sharding annotations.

``mark_sharding`` returns an :class:`XLAShardedTensor` as PyTorch/XLA does
(``global_tensor``, ``local_shards``, ``sharding_spec``, ``sharding_type``,
``load_local_shards_``); the tensor passed in is annotated in place, so code
that ignores the return value keeps working. ``Mesh`` validates its
arguments as PyTorch/XLA does, raising ``AssertionError`` subclasses with its
messages. ``xla_distribute_tensor``, ``xla_distribute_module`` and
``auto_policy`` come from the DTensor bridge (``torch_xla.distributed.spmd.api``).
"""

from __future__ import annotations

import ast
import collections
import importlib
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from jax.experimental import mesh_utils
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from spmdtorch import fsdp, runtime, sharding
from spmdtorch.compat import _runtime
from spmdtorch.compat._sharded_tensor import (
    XLAShard,
    XLAShardedTensor,
    unwrap_sharded_tensor,
    wrap_as_sharded_tensor,
    wrap_if_sharded,
)
from spmdtorch.compat.errors import CompatError
from spmdtorch.lazy import caches, metrics
from spmdtorch.mesh import HybridMesh as _SpmdHybridMesh
from spmdtorch.mesh import HybridMeshError, MeshError, get_global_mesh, set_global_mesh
from spmdtorch.mesh import Mesh as _SpmdMesh
from spmdtorch.partition import ShardingType, visualize_sharding, visualize_tensor_sharding

__all__ = [
    "EinsumLinear",
    "HybridMesh",
    "MarkShardingError",
    "MarkShardingFunction",
    "Mesh",
    "MeshAssertionError",
    "OpSharding",
    "ShardingSpec",
    "ShardingType",
    "XLAPatchedLinear",
    "XLAShard",
    "XLAShardedTensor",
    "annotate_custom_sharding",
    "apply_backward_optimization_barrier",
    "apply_xla_patch_to_nn_linear",
    "clear_sharding",
    "disable_manual_sharding",
    "enable_manual_sharding",
    "get_1d_mesh",
    "get_global_mesh",
    "mark_sharding",
    "mark_sharding_with_gradients",
    "set_global_mesh",
    "shard_as",
    "unwrap_sharded_tensor",
    "visualize_sharding",
    "visualize_tensor_sharding",
    "wrap_as_sharded_tensor",
    "wrap_if_sharded",
    "xla_patched_nn_linear_forward",
    "_mark_manual_sharding",
]

#: Names of ``torch_xla.distributed.spmd`` that live in the DTensor bridge (``spmd.api``).
_BRIDGE = ("xla_distribute_tensor", "xla_distribute_module", "auto_policy", "convert_to_xla_mesh")


def __getattr__(name: str) -> Any:
    # The bridge imports this package's names; resolving its names on first use avoids the cycle.
    if name in _BRIDGE:
        return getattr(importlib.import_module("spmdtorch.compat._dtensor"), name)
    raise AttributeError(name)


class MeshAssertionError(MeshError, AssertionError):
    """A ``Mesh`` argument PyTorch/XLA's asserts refuse (an ``AssertionError`` and a ``MeshError``)."""


class MarkShardingError(CompatError, ValueError):
    """``mark_sharding`` refused the annotation (a ``RuntimeError`` as in PyTorch/XLA, and a ``ValueError``)."""


class _MeshType(type):
    """``isinstance(m, xs.Mesh)`` holds for every spmdtorch mesh (``get_global_mesh()``, ``HybridMesh``...)."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _SpmdMesh)


def _check_mesh_args(device_ids: Any, mesh_shape: Any, axis_names: Any) -> None:
    """PyTorch/XLA's checks, in its order and with its messages (its tests match them)."""
    ids = np.asarray(device_ids)
    count = runtime.global_runtime_device_count()
    if len(ids) != count:
        raise MeshAssertionError(f"Number of device IDs ({len(ids)}) must match the global number of devices ({count})")
    if axis_names is not None:
        if len(mesh_shape) != len(axis_names):
            raise MeshAssertionError(
                f"Number of axis names ({len(axis_names)}) must match mesh dimensions ({len(mesh_shape)})"
            )
        if len(set(axis_names)) != len(axis_names):
            raise MeshAssertionError(f"Axis names must be unique, got: {tuple(axis_names)}")
    size = int(np.prod(mesh_shape))
    if len(ids) != size:
        raise MeshAssertionError(f"Number of device IDs ({len(ids)}) must match mesh size ({size})")
    if len(np.unique(ids)) != len(ids):
        raise MeshAssertionError(f"Device IDs must be unique, got: {ids}")
    if any(int(d) >= size for d in ids):
        raise MeshAssertionError(f"Device IDs must be less than mesh size ({size}), got: {ids}")


class OpSharding:
    """``Mesh.get_op_sharding``'s result: a partition spec resolved on a mesh.

    Attributes:
        mesh: the mesh.
        partition_spec: the spec, one entry per tensor dim.
        sharding: the ``jax.sharding.NamedSharding`` it stands for.
    """

    def __init__(self, mesh: _SpmdMesh, partition_spec: tuple[Any, ...]) -> None:
        self.mesh = mesh
        self.partition_spec = partition_spec
        self.sharding = mesh.named_sharding(partition_spec)

    def __repr__(self) -> str:
        return f"OpSharding(mesh={self.mesh!r}, partition_spec={self.partition_spec!r})"


def _hashable_spec(partition_spec: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(tuple(p) if isinstance(p, list) else p for p in partition_spec)


#: id(mesh) -> (mesh, {spec: OpSharding}): PyTorch/XLA caches per mesh *object* (its Mesh hashes by
#: identity), so a new mesh builds its OpShardings again; the mesh is held so its id is not reused.
_OP_SHARDINGS: collections.OrderedDict[int, tuple[_SpmdMesh, dict[tuple[Any, ...], OpSharding]]] = (
    collections.OrderedDict()
)
_MAX_CACHED_MESHES = 256
caches.register("compat.spmd.op_shardings", _OP_SHARDINGS, maxsize=_MAX_CACHED_MESHES)


def _op_sharding(mesh: _SpmdMesh, partition_spec: Sequence[Any]) -> OpSharding:
    """``mesh``'s resolved sharding for ``partition_spec``, built (and counted, as ``CreateOpSharding``) once."""
    spec = _hashable_spec(partition_spec)
    entry = _OP_SHARDINGS.get(id(mesh))
    if entry is None:
        entry = _OP_SHARDINGS[id(mesh)] = (mesh, {})
        if len(_OP_SHARDINGS) > _MAX_CACHED_MESHES:
            _OP_SHARDINGS.popitem(last=False)
    try:
        found = entry[1].get(spec)
    except TypeError:  # an unhashable entry: resolved uncached (the mesh reports what is wrong with it)
        metrics.inc("CreateOpSharding")
        return OpSharding(mesh, spec)
    if found is None:
        found = OpSharding(mesh, spec)
        metrics.inc("CreateOpSharding")
        entry[1][spec] = found
    return found


class Mesh(_SpmdMesh, metaclass=_MeshType):
    """PyTorch/XLA's ``Mesh(device_ids, mesh_shape, axis_names=None)``: an spmdtorch mesh.

    Raises:
        MeshAssertionError: the device count, axis names or ids do not fit
            (PyTorch/XLA's assert messages).
    """

    __slots__ = ()

    def __init__(self, device_ids: Any, mesh_shape: Sequence[int], axis_names: Sequence[str] | None = None) -> None:
        _check_mesh_args(device_ids, tuple(mesh_shape), axis_names)
        super().__init__(device_ids, mesh_shape, axis_names)

    def get_op_sharding(self, partition_spec: Sequence[Any]) -> OpSharding:
        """The resolved sharding of ``partition_spec`` on this mesh (cached, as PyTorch/XLA caches it)."""
        return _op_sharding(self, partition_spec)

    def get_jax_mesh(self) -> Any:
        """The ``jax.sharding.Mesh`` with this mesh's devices and axis names."""
        return self.jax_mesh

    def __str__(self) -> str:
        return (
            f"{{'device_ids': {self.device_ids.tolist()}, 'mesh_shape': {tuple(self.mesh_shape)}, "
            f"'axis_names': {self.axis_names}}}"
        )

    @classmethod
    def from_str(cls, mesh_str: str) -> Mesh | None:
        """The mesh ``str(mesh)`` describes, or None if the text is not one."""
        try:
            d = ast.literal_eval(mesh_str.replace("Mesh", ""))
            return cls(np.array(d["device_ids"]), d["mesh_shape"], d["axis_names"])
        except (ValueError, SyntaxError, KeyError, TypeError):
            return None


class _TpuDevice(NamedTuple):
    """A device as ``xr.global_runtime_device_attributes()`` describes it, in the form jax's mesh_utils reads."""

    id: int
    coords: tuple[int, ...]
    core_on_chip: int
    slice_index: int
    platform: str = "tpu"
    device_kind: str = ""
    process_index: int = 0


def _device_attributes() -> list[dict[str, Any]]:
    """``xr.global_runtime_device_attributes()``, read through the ``torch_xla.runtime`` alias when installed."""
    xr = sys.modules.get("torch_xla.runtime")
    read = getattr(xr, "global_runtime_device_attributes", None) or _runtime.global_runtime_device_attributes
    return list(read())


def _ordinal(name: str) -> int:
    return int(str(name).rpartition(":")[2])


def _ids_from_coords(attributes: list[dict[str, Any]], ici: tuple[int, ...], dcn: tuple[int, ...]) -> np.ndarray | None:
    """PyTorch/XLA's TPU layout: devices placed by physical coordinates, one block per slice (DCN group).

    None when the attributes carry no TPU coordinates (then spmdtorch's placement applies).
    """
    if not attributes or any("coords" not in a for a in attributes):
        return None
    ordered = sorted(attributes, key=lambda a: _ordinal(a["name"]))
    devices = [
        _TpuDevice(i, tuple(a["coords"]), int(a.get("core_on_chip", 0)), int(a.get("slice_index", 0)))
        for i, a in enumerate(ordered)
    ]
    if int(np.prod(dcn)) > 1:
        if "slice_index" not in ordered[0]:
            raise HybridMeshError(f"Invalid dcn_mesh_shape {dcn} for single slice mesh: the devices report no slice")
        mesh = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, allow_split_physical_axes=True)
    else:
        mesh = mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    return np.vectorize(lambda d: d.id, otypes=[int])(mesh).ravel()


class HybridMesh(Mesh):
    """PyTorch/XLA's ``HybridMesh(ici_mesh_shape=, dcn_mesh_shape=None, axis_names=None)``.

    On TPU (devices with coordinates in ``xr.global_runtime_device_attributes()``)
    devices are laid out by their physical coordinates and slices, as PyTorch/XLA
    does; elsewhere as :class:`spmdtorch.mesh.HybridMesh` lays them out.

    Raises:
        HybridMeshError: the shapes do not fit the slices or processes.
    """

    __slots__ = ("_dcn", "_ici")
    # Set once in __init__ (the mesh is immutable).
    _ici: tuple[int, ...]
    _dcn: tuple[int, ...]

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ici = tuple(int(n) for n in ici_mesh_shape)
        dcn = (1,) * len(ici) if dcn_mesh_shape is None else tuple(int(n) for n in dcn_mesh_shape)
        if len(ici) != len(dcn):
            raise HybridMeshError(
                f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} must have one entry per mesh axis each"
            )
        ids = _ids_from_coords(_device_attributes(), ici, dcn)
        if ids is None:
            ids = _SpmdHybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=axis_names).device_ids
        super().__init__(ids, tuple(i * d for i, d in zip(ici, dcn)), axis_names)
        object.__setattr__(self, "_ici", ici)
        object.__setattr__(self, "_dcn", dcn)

    @property
    def ici_mesh_shape(self) -> tuple[int, ...]:
        """Per-axis sizes inside one slice."""
        return tuple(self._ici)

    @property
    def dcn_mesh_shape(self) -> tuple[int, ...]:
        """Per-axis numbers of slices."""
        return tuple(self._dcn)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_hybrid, (self.ici_mesh_shape, self.dcn_mesh_shape, self.axis_names))


def _rebuild_hybrid(ici: tuple[int, ...], dcn: tuple[int, ...], axis_names: Sequence[str] | None) -> HybridMesh:
    return HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=axis_names)


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """Every device on one axis (named ``axis_name``, or unnamed)."""
    n = runtime.global_runtime_device_count()
    return Mesh(np.arange(n), (n,), None if axis_name is None else (axis_name,))


def _mesh(mesh: _SpmdMesh | None, what: str) -> _SpmdMesh:
    if mesh is not None:
        return mesh
    found = get_global_mesh()
    if found is None:
        raise sharding.ShardingError(
            f"{what}: no mesh given and no global mesh set; pass mesh=... or call xs.set_global_mesh(mesh) first"
        )
    return found


def _check_rank(t: Any, partition_spec: Any, what: str) -> None:
    if isinstance(partition_spec, Sequence) and not isinstance(partition_spec, (str, bytes)):
        if hasattr(t, "shape") and len(t.shape) != len(partition_spec):
            raise MarkShardingError(
                f"{what}: Partition spec length ({len(partition_spec)}) should be equal to the input rank "
                f"({len(t.shape)}); give one entry per dim of the tensor of shape {tuple(t.shape)}"
            )


def mark_sharding(t: Any, mesh: _SpmdMesh, partition_spec: Any) -> Any:
    """Annotate ``t`` in place; returns it as an :class:`XLAShardedTensor` (a module is returned as it is).

    Raises:
        MarkShardingError: the spec does not fit the tensor, or ``t`` already
            carries a different annotation (``clear_sharding`` it first).
    """
    if isinstance(t, nn.Module):
        return sharding.mark_sharding(t, mesh, partition_spec)
    _check_rank(t, partition_spec, "mark_sharding")
    if isinstance(mesh, _SpmdMesh) and isinstance(partition_spec, Sequence):
        _op_sharding(mesh, partition_spec)  # PyTorch/XLA's CreateOpSharding count (and the spec's check)
    inner = unwrap_sharded_tensor(t)
    current = sharding.tensor_sharding(inner) if isinstance(inner, torch.Tensor) else None
    if current is not None and current.is_fully_replicated:
        # PyTorch/XLA lets a sharding replace a replicated annotation without
        # clear_sharding (spmdtorch asks for it; the result is the same reshard).
        sharding.clear_sharding(inner)
    try:
        sharding.mark_sharding(inner, mesh, partition_spec)
    except sharding.ShardingError as e:
        raise MarkShardingError(str(e)) from e
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=tuple(partition_spec))


def clear_sharding(t: Any) -> torch.Tensor:
    """Drop ``t``'s annotation; returns the (unwrapped) tensor."""
    inner = unwrap_sharded_tensor(t)
    sharding.clear_sharding(inner)
    if isinstance(t, XLAShardedTensor):
        t.invalidate_spec_cache()
    return inner


def annotate_custom_sharding(t: Any, mesh: _SpmdMesh, partition_spec: Sequence[Any]) -> XLAShardedTensor:
    """Give an already sharded tensor another sharding (its data is resharded at the next program)."""
    _check_rank(t, partition_spec, "annotate_custom_sharding")
    inner = unwrap_sharded_tensor(t)
    sharding.clear_sharding(inner)
    sharding.mark_sharding(inner, mesh, partition_spec)
    return wrap_as_sharded_tensor(t, mesh_shape=mesh.mesh_shape, partition_spec=tuple(partition_spec))


class MarkShardingFunction(torch.autograd.Function):
    """``MarkShardingFunction.apply(t, mesh, spec)``: a sharded copy of ``t`` whose gradient is sharded alike."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, mesh: _SpmdMesh, partition_spec: Sequence[Any]) -> torch.Tensor:
        ctx.mesh, ctx.partition_spec = mesh, tuple(partition_spec)
        out = unwrap_sharded_tensor(t).clone()
        sharding.mark_sharding(out, mesh, ctx.partition_spec)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        out = grad.clone()
        sharding.mark_sharding(out, ctx.mesh, ctx.partition_spec)
        return out, None, None


def mark_sharding_with_gradients(t: torch.Tensor, mesh: _SpmdMesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """A sharded copy of ``t`` (not annotated in place) whose gradient gets the same sharding."""
    _check_rank(t, partition_spec, "mark_sharding_with_gradients")
    out: torch.Tensor = MarkShardingFunction.apply(t, mesh, tuple(partition_spec))
    return out


def _mark_manual_sharding(t: Any) -> XLAShardedTensor:
    """Mark a pending tensor manually sharded in place (``spmdtorch.sharding.mark_manual_sharding``).

    Pair it with ``_XLAC._spmd_shard_to_full_shape``, as PyTorch/XLA's internal API is.

    Raises:
        spmdtorch.sharding.ManualShardingError: ``t`` holds data rather than a
            pending value (a ``RuntimeError``, as in PyTorch/XLA).
    """
    inner = unwrap_sharded_tensor(t)
    sharding.mark_manual_sharding(inner)
    return wrap_as_sharded_tensor(inner)


def enable_manual_sharding(t: Any, partition_spec: Sequence[Any], *, mesh: _SpmdMesh | None = None) -> XLAShardedTensor:
    """Enter a manual region: ``t``'s local shard (mesh defaults to the global mesh)."""
    m = _mesh(mesh, "enable_manual_sharding")
    local = sharding.enable_manual_sharding(unwrap_sharded_tensor(t), partition_spec, mesh=m)
    return wrap_as_sharded_tensor(local, mesh_shape=m.mesh_shape, partition_spec=tuple(partition_spec))


def disable_manual_sharding(
    t: Any, partition_spec: Sequence[Any], full_shape: Sequence[int], *, mesh: _SpmdMesh | None = None
) -> XLAShardedTensor:
    """Leave a manual region: the global tensor of shape ``full_shape`` (mesh defaults to the global mesh)."""
    m = _mesh(mesh, "disable_manual_sharding")
    full = sharding.disable_manual_sharding(unwrap_sharded_tensor(t), partition_spec, full_shape, mesh=m)
    return wrap_as_sharded_tensor(full, mesh_shape=m.mesh_shape, partition_spec=tuple(partition_spec))


def shard_as(a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` and ``b`` (pytrees of one structure) sharded alike: each unannotated leaf takes its partner's sharding.

    PyTorch/XLA leaves the choice to XLA (``shard_alike``); here a leaf with a
    sharding hands it to its partner, which is what ``shard_alike`` settles on
    when one side is annotated.

    Raises:
        MarkShardingError: the two trees differ in structure, or a leaf is None on one side only.
    """
    a_flat, a_spec = tree_flatten(a)
    b_flat, b_spec = tree_flatten(b)
    if a_spec != b_spec:
        raise MarkShardingError(f"shard_as: a and b must have the same structure, got {a_spec} and {b_spec}")
    a_out, b_out = [], []
    for x, y in zip(a_flat, b_flat):
        if (x is None) != (y is None):
            raise MarkShardingError("shard_as: a leaf is None in one tree but not in the other")
        if x is not None:
            x, y = _alike(unwrap_sharded_tensor(x), unwrap_sharded_tensor(y))
        a_out.append(x)
        b_out.append(y)
    return tree_unflatten(a_out, a_spec), tree_unflatten(b_out, b_spec)


def _alike(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sx, sy = sharding.get_sharding_spec(x), sharding.get_sharding_spec(y)
    if sx == sy:
        return x, y
    if sx and not sy:
        return x, _with_sharding_of(y, x)
    if sy and not sx:
        return _with_sharding_of(x, y), y
    raise MarkShardingError(
        f"shard_as: the two tensors are sharded differently ({sx} and {sy}); clear one with xs.clear_sharding"
    )


def _with_sharding_of(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` laid out as ``like`` is (``like`` must carry a mesh annotation)."""
    found = sharding.tensor_sharding(like)
    spec = getattr(found, "spec", None)
    mesh = getattr(found, "mesh", None)
    if spec is None or mesh is None:
        raise MarkShardingError("shard_as: the sharded tensor's layout is not a mesh sharding; annotate it first")
    # The jax mesh's devices, as logical ordinals of spmdtorch's global device order.
    order = {d.id: i for i, d in enumerate(runtime.jax_devices())}
    ids = [order[d.id] for d in np.asarray(mesh.devices).ravel()]
    spmd_mesh = _SpmdMesh(ids, tuple(mesh.devices.shape), tuple(mesh.axis_names))
    full = tuple(spec) + (None,) * (t.dim() - len(tuple(spec)))
    out: torch.Tensor = sharding.mark_sharding_with_gradients(t, spmd_mesh, full)
    return out


class XLAPatchedLinear(torch.autograd.Function):
    """``F.linear`` as einsums (forward and backward), which keeps a sharded batch dim visible to XLA."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        ctx.save_for_backward(input, weight, bias)
        out = torch.einsum("...n,mn->...m", input, weight)
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        input, weight, bias = ctx.saved_tensors
        grad_input = torch.einsum("...m,mn->...n", grad, weight) if ctx.needs_input_grad[0] else None
        grad_weight = torch.einsum("...m,...n->mn", grad, input) if ctx.needs_input_grad[1] else None
        grad_bias = None
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = torch.einsum("...m->m", grad)
        return grad_input, grad_weight, grad_bias


def xla_patched_nn_linear_forward(m: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """``m``'s forward (an ``nn.Linear``) through :class:`XLAPatchedLinear`."""
    out: torch.Tensor = XLAPatchedLinear.apply(input, m.weight, m.bias)
    return out


class EinsumLinear(nn.Linear):
    """An ``nn.Linear`` whose forward is :class:`XLAPatchedLinear`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return xla_patched_nn_linear_forward(self, input)


def apply_xla_patch_to_nn_linear(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` under ``module`` by an :class:`EinsumLinear` holding the same parameters."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear) and not isinstance(child, EinsumLinear):
            with torch.device("meta"):
                patched = EinsumLinear(child.in_features, child.out_features, bias=child.bias is not None)
            patched.load_state_dict(child.state_dict(), strict=True, assign=True)
            setattr(module, name, patched)
        else:
            apply_xla_patch_to_nn_linear(child)
    return module


def apply_backward_optimization_barrier(m: nn.Module) -> None:
    """Keep ``m``'s backward from being fused with the rest: its input gradients pass an optimization barrier."""

    def barrier(module: nn.Module, grad_input: Any, grad_output: Any) -> tuple[torch.Tensor | None, ...]:
        present = [g for g in grad_input if g is not None]
        if not present:
            return tuple(grad_input)
        fenced = iter(fsdp.optimization_barrier(*present))
        return tuple(None if g is None else next(fenced) for g in grad_input)

    m.register_full_backward_hook(barrier)


class ShardingSpec(sharding.ShardingSpec):
    """PyTorch/XLA's ``ShardingSpec(mesh, partition_spec, minibatch=False)``."""

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec has one entry per dim of ``t``."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: Any) -> Any:
        """``xs.mark_sharding(t, mesh, partition_spec)``."""
        return mark_sharding(t, self.mesh, self.partition_spec)
