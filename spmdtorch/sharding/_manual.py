"""Manual sharding regions: per-device torch code with explicit collectives.

``shard_map(fn, mesh, in_specs, out_specs)`` runs ``fn`` once per device on
that device's *local* blocks, like ``jax.shard_map``. Inside, torch code sees
local tensors and may call the collectives here (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``ppermute``, ``axis_index``).

How it is built: ``fn`` is recorded lazily on placeholder tensors of the local
shapes (``spmdtorch.tensor.subgraph``); the recorded graph becomes the body of
a ``jax.shard_map``, which is one node of the enclosing lazy graph; values the
body captures from outside are replicated inputs of that node. ``enable_manual_sharding`` /
``disable_manual_sharding`` open and close such a region around ordinary code.
Regions are not differentiable through torch autograd yet (arguments that
require grad are refused rather than silently detached).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
from torch.utils import _pytree as pytree

from spmdtorch import _checks, _dtypes
from spmdtorch.lazy import padding
from spmdtorch.lazy.graph import Slot
from spmdtorch.mesh import Mesh, MeshError
from spmdtorch.sharding._marking import ShardingError, ShardingTypeError, _check_mesh, _check_spec
from spmdtorch.tensor import subgraph
from spmdtorch.tensor.dispatch import read_value, record
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = [
    "shard_map",
    "enable_manual_sharding",
    "disable_manual_sharding",
    "ManualRegionError",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "ppermute",
    "axis_index",
]


class ManualRegionError(RuntimeError):
    """A collective outside a manual region, or a region used wrongly."""


@dataclasses.dataclass
class _Region:
    mesh: Mesh
    args: list[XlaTensor]
    in_specs: list[jax.sharding.PartitionSpec]  # the arguments' (padded to their ndim)
    recording: subgraph.Recording  # the local blocks the body sees are its placeholders


_ACTIVE: list[_Region] = []


def _axis_sizes(mesh: Mesh, jspec: jax.sharding.PartitionSpec) -> list[int]:
    return padding.shards_per_dim(mesh.jax_mesh, jspec, len(jspec))


def _jax_spec(mesh: Mesh, spec: Sequence[Any], ndim: int, what: str) -> jax.sharding.PartitionSpec:
    jspec = mesh.jax_partition_spec(tuple(spec))
    if len(jspec) < ndim:
        jspec = jax.sharding.PartitionSpec(*(tuple(jspec) + (None,) * (ndim - len(jspec))))
    if len(jspec) != ndim:
        raise ShardingError(f"{what}: spec {tuple(spec)} has {len(jspec)} entries for a {ndim}-dim tensor")
    return jspec


def _begin(mesh: Mesh, args: Sequence[Any], in_specs: Sequence[Sequence[Any]]) -> list[XlaTensor]:
    if len(args) != len(in_specs):
        raise ShardingError(f"shard_map got {len(args)} arguments but {len(in_specs)} in_specs")
    jspecs: list[jax.sharding.PartitionSpec] = []
    locals_: list[tuple[tuple[int, ...], torch.dtype]] = []
    for i, (a, spec) in enumerate(zip(args, in_specs)):
        if not isinstance(a, XlaTensor):
            raise ShardingError(f"shard_map argument {i} must be an xla tensor, got {type(a).__name__}")
        if a.requires_grad and torch.is_grad_enabled():
            raise ManualRegionError(
                f"shard_map argument {i} requires grad; manual regions are not differentiable "
                "through torch autograd yet: pass t.detach() or run under torch.no_grad()"
            )
        jspec = _jax_spec(mesh, spec, a.dim(), f"in_specs[{i}]")
        local: list[int] = []
        for dim, (size, parts) in enumerate(zip(a.shape, _axis_sizes(mesh, jspec))):
            if size % parts:
                raise ShardingError(
                    f"shard_map argument {i}: dim {dim} of size {size} is not divisible by its "
                    f"{parts} shards (spec {tuple(spec)})"
                )
            local.append(size // parts)
        jspecs.append(jspec)
        locals_.append((tuple(local), a.dtype))
    rec = subgraph.begin(locals_, "a manual region (shard_map body)")
    _ACTIVE.append(_Region(mesh, list(args), jspecs, rec))
    return rec.placeholders


def _end(region: _Region, outs: Any, out_specs: Sequence[Sequence[Any]]) -> Any:
    flat, spec = pytree.tree_flatten(outs)
    if not flat or not all(isinstance(o, XlaTensor) for o in flat):
        raise ShardingError("the body of a manual region must return xla tensors")
    if len(out_specs) != len(flat):
        raise ShardingError(f"the region returns {len(flat)} tensors but {len(out_specs)} out_specs were given")
    body = subgraph.end(region.recording, flat)
    if body.has_random:
        raise NotImplementedError("random ops inside a manual region are not supported yet")
    mesh = region.mesh
    # The region's arguments' values, then the captured values: every device gets all of those.
    inputs: list[Any] = [read_value(a) for a in region.args] + list(body.captured)
    in_specs = tuple(region.in_specs) + (jax.sharding.PartitionSpec(),) * len(body.captured)
    out_jspecs: list[jax.sharding.PartitionSpec] = []
    out_avals: list[tuple[tuple[int, ...], Any]] = []
    for k, (o, s) in enumerate(zip(flat, out_specs)):
        jspec = _jax_spec(mesh, s, o.dim(), f"out_specs[{k}]")
        shape = tuple(n * p for n, p in zip(o.shape, _axis_sizes(mesh, jspec)))
        out_jspecs.append(jspec)
        out_avals.append((shape, _dtypes.to_jax_dtype(o.dtype)))
    mapped = jax.shard_map(
        body.fn,
        mesh=mesh.jax_mesh,
        in_specs=in_specs,
        out_specs=tuple(out_jspecs),
        check_vma=False,
    )
    name = ("shard_map", body.key, in_specs, tuple(out_jspecs), mesh.jax_mesh)
    template = (tuple(Slot(i) for i in range(len(inputs))), ())
    out_refs = record(mapped, name, template, inputs, tuple(out_avals))
    if len(out_avals) == 1:
        out_refs = [out_refs]
    results = [new_base(r, o.dtype) for r, o in zip(out_refs, flat)]
    return pytree.tree_unflatten(results, spec)


def shard_map(
    fn: Callable[..., Any], mesh: Mesh, in_specs: Sequence[Sequence[Any]], out_specs: Sequence[Any]
) -> Callable[..., Any]:
    """Wrap ``fn`` to run per device on local blocks (PyTorch/XLA/JAX ``shard_map``).

    Args:
        fn: torch code over local tensors; may call the collectives of this module.
        mesh: a ``spmdtorch.mesh.Mesh``.
        in_specs: one partition spec per positional argument.
        out_specs: one spec per returned tensor (a single spec if ``fn`` returns one).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import shard_map, all_reduce
        >>> mesh = get_1d_mesh("x")
        >>> f = shard_map(lambda t: all_reduce(t.sum(0, keepdim=True), "x"), mesh, [("x", None)], (None, None))
        >>> f(torch.ones(8, 2, device="xla")).cpu()
        tensor([[8., 8.]])
    """

    _checks.check_callable(fn, "shard_map", "fn", ShardingTypeError)
    _check_mesh(mesh, "shard_map")
    for name, specs in (("in_specs", in_specs), ("out_specs", out_specs)):
        if isinstance(specs, (str, bytes)) or not isinstance(specs, Sequence):
            _checks.fail(ShardingTypeError, "shard_map", name, "a sequence of partition specs", specs)
    for i, spec in enumerate(in_specs):
        try:
            mesh.jax_partition_spec(_check_spec(spec, f"shard_map: in_specs[{i}]"))
        except MeshError as e:
            raise type(e)(f"shard_map: in_specs[{i}]: {e}") from None

    def wrapped(*args: Any) -> Any:
        placeholders = _begin(mesh, args, list(in_specs))
        region = _ACTIVE[-1]
        try:
            outs = fn(*placeholders)
        finally:
            _ACTIVE.pop()
        # One tensor returned: out_specs is its spec; several: one spec each.
        specs = [tuple(out_specs)] if isinstance(outs, torch.Tensor) else [tuple(s) for s in out_specs]
        return _end(region, outs, specs)

    return wrapped


def enable_manual_sharding(t: torch.Tensor, partition_spec: Sequence[Any], *, mesh: Mesh) -> XlaTensor:
    """Start a manual region on ``t``: returns its local block (close with ``disable_manual_sharding``)."""
    _check_region_tensor(t, "enable_manual_sharding")
    spec = _check_spec(partition_spec, "enable_manual_sharding")
    return _begin(_check_mesh(mesh, "enable_manual_sharding"), [t], [spec])[0]


def _check_region_tensor(t: object, what: str) -> XlaTensor:
    if not isinstance(t, XlaTensor):
        raise ShardingTypeError(
            f"{what}: t must be a tensor on the xla device, got {type(t).__name__} {getattr(t, 'device', '')}".rstrip()
        )
    return t


def disable_manual_sharding(
    t: torch.Tensor, partition_spec: Sequence[Any], full_shape: Sequence[int], *, mesh: Mesh
) -> torch.Tensor:
    """Close the innermost manual region: ``t`` (local) becomes a global tensor of ``full_shape``."""
    what = "disable_manual_sharding"
    _check_region_tensor(t, what)
    partition_spec = _check_spec(partition_spec, what)
    full_shape = _checks.check_int_sequence(full_shape, what, "full_shape", ShardingError, minimum=0)
    if _check_mesh(mesh, what) != (_ACTIVE[-1].mesh if _ACTIVE else mesh):
        raise ShardingError(f"{what}: mesh {mesh} is not the mesh of the open region ({_ACTIVE[-1].mesh})")
    if not _ACTIVE:
        raise ManualRegionError("disable_manual_sharding without a matching enable_manual_sharding")
    region = _ACTIVE.pop()
    out: torch.Tensor = _end(region, t, [tuple(partition_spec)])
    if tuple(out.shape) != tuple(full_shape):
        raise ShardingError(f"full_shape {tuple(full_shape)} does not match the region's output {tuple(out.shape)}")
    return out


# -- collectives ------------------------------------------------------------------


def _region(what: str) -> _Region:
    if not _ACTIVE:
        raise ManualRegionError(f"{what} is only available inside shard_map / a manual region")
    return _ACTIVE[-1]


# A mesh axis as the collectives take it: a name, an index, or a tuple of those.
Axis = str | int | tuple[Any, ...]


def _check_dim(dim: object, t: torch.Tensor, what: str) -> int:
    """``dim`` wrapped into ``0..t.dim()-1``."""
    n = t.dim()
    return _checks.check_int(dim, what, "dim", ShardingError, minimum=-n, maximum=n - 1) % n


def _axis(region: _Region, axis: Axis) -> str | tuple[Any, ...]:
    names = region.mesh.jax_mesh.axis_names
    if isinstance(axis, bool) or not isinstance(axis, (int, str, tuple)):
        raise ShardingTypeError(
            f"axis must be a mesh axis name, index or a tuple of those, got {type(axis).__name__} {axis!r}; "
            f"the mesh has {names}"
        )
    if isinstance(axis, int):
        if not -len(names) <= axis < len(names):
            raise ManualRegionError(f"axis index {axis} is out of range; the mesh has {names}")
        name: str = names[axis]
        return name
    if isinstance(axis, tuple):
        return tuple(_axis(region, a) for a in axis)
    if axis not in names:
        raise ManualRegionError(f"unknown mesh axis {axis!r}; the mesh has {names}")
    return axis


def _size(region: _Region, axis: str | tuple[Any, ...]) -> int:
    axes = axis if isinstance(axis, tuple) else (axis,)
    n = 1
    for a in axes:
        n *= region.mesh.jax_mesh.shape[a]
    return n


# jax.lax's collectives are unannotated: their results are typed Any here.
_REDUCTIONS: dict[str, Callable[..., Any]] = {
    "sum": jax.lax.psum,
    "max": jax.lax.pmax,
    "min": jax.lax.pmin,
    "mean": jax.lax.pmean,
}


def _psum(x: jax.Array, *, axis: Any, op: str) -> Any:
    return _REDUCTIONS[op](x, axis)


def _gather(x: jax.Array, *, axis: Any, dim: int) -> Any:
    return jax.lax.all_gather(x, axis, axis=dim, tiled=True)


def _scatter(x: jax.Array, *, axis: Any, dim: int) -> Any:
    return jax.lax.psum_scatter(x, axis, scatter_dimension=dim, tiled=True)


def _permute(x: jax.Array, *, axis: Any, perm: tuple[tuple[int, int], ...]) -> Any:
    return jax.lax.ppermute(x, axis, perm)


def _index(*, axis: Any) -> Any:
    return jax.lax.axis_index(axis)


def _collective(fn: Callable[..., Any], name: str, t: torch.Tensor, shape: Sequence[int], **static: Any) -> XlaTensor:
    region = _region(name)
    ref = record(
        fn,
        name,
        ((Slot(0),), tuple(sorted(static.items()))),
        [read_value(t)],
        ((tuple(shape), _dtypes.to_jax_dtype(t.dtype)),),
    )
    region.recording.pin(ref)  # a collective runs inside the region even on a captured value
    return new_base(ref, t.dtype)


def all_reduce(t: torch.Tensor, axis: Axis, op: str = "sum") -> XlaTensor:
    """Sum (or ``max``/``min``/``mean``) ``t`` over mesh ``axis`` inside a region."""
    region = _region("all_reduce")
    _check_region_tensor(t, "all_reduce")
    _checks.check_choice(op, ("sum", "max", "min", "mean"), "all_reduce", "op", ShardingError)
    return _collective(_psum, "psum", t, t.shape, axis=_axis(region, axis), op=op)


def all_gather(t: torch.Tensor, axis: Axis, dim: int = 0) -> XlaTensor:
    """Concatenate every device's ``t`` along ``dim`` over mesh ``axis``."""
    region = _region("all_gather")
    _check_region_tensor(t, "all_gather")
    ax = _axis(region, axis)
    dim = _check_dim(dim, t, "all_gather")
    shape = list(t.shape)
    shape[dim] *= _size(region, ax)
    return _collective(_gather, "all_gather", t, shape, axis=ax, dim=dim)


def reduce_scatter(t: torch.Tensor, axis: Axis, dim: int = 0) -> XlaTensor:
    """Sum over mesh ``axis`` and keep this device's slice of ``dim``."""
    region = _region("reduce_scatter")
    _check_region_tensor(t, "reduce_scatter")
    ax = _axis(region, axis)
    dim = _check_dim(dim, t, "reduce_scatter")
    n = _size(region, ax)
    if t.shape[dim] % n:
        raise ShardingError(f"reduce_scatter: dim {dim} of size {t.shape[dim]} is not divisible by {n}")
    shape = list(t.shape)
    shape[dim] //= n
    return _collective(_scatter, "reduce_scatter", t, shape, axis=ax, dim=dim)


def ppermute(t: torch.Tensor, axis: Axis, perm: Sequence[Sequence[int]]) -> XlaTensor:
    """Send ``t`` from device i to device j for each ``(i, j)`` in ``perm`` along ``axis``."""
    region = _region("ppermute")
    _check_region_tensor(t, "ppermute")
    ax = _axis(region, axis)
    if isinstance(perm, (str, bytes)) or not isinstance(perm, Sequence):
        _checks.fail(ShardingTypeError, "ppermute", "perm", "a sequence of (source, destination) pairs", perm)
    pairs = tuple(_checks.check_int_sequence(p, "ppermute", f"perm[{i}]", ShardingError) for i, p in enumerate(perm))
    n = _size(region, ax)
    for i, pair in enumerate(pairs):
        if len(pair) != 2 or not all(0 <= k < n for k in pair):
            _checks.fail(ShardingError, "ppermute", f"perm[{i}]", f"a (source, destination) pair in 0..{n - 1}", pair)
    return _collective(_permute, "ppermute", t, t.shape, axis=ax, perm=pairs)


def axis_index(axis: Axis) -> XlaTensor:
    """This device's index along mesh ``axis`` (a 0-dim int32 tensor)."""
    region = _region("axis_index")
    ref = record(_index, "axis_index", ((), (("axis", _axis(region, axis)),)), [], (((), jax.numpy.int32),))
    region.recording.pin(ref)  # reads no placeholder, yet means this device's index
    return new_base(ref, torch.int32)
