"""FSDP2's ``fully_shard`` over an xla mesh: parameters as ``Shard(0)`` DTensors, XLA's collectives.

torch's ``fully_shard`` builds per-rank shards and issues the all-gathers and
reduce-scatters itself, through the process group of each mesh dim (it asks
the mesh for ``get_group`` at once, which an xla mesh refuses with
:class:`~spmdtorch.dtensor.errors.NoRankError` naming this function). Under
one controller the same intent is a layout: :func:`fully_shard` takes FSDP2's
signature and turns each parameter it manages into an ``XlaDTensor`` sharded
``Shard(0)`` over the mesh (``[Replicate(), Shard(0)]`` on a 2-D HSDP mesh;
composed with a tensor-parallel placement the parameter already has), and
gives the module FSDP2's ``FSDPModule`` class, whose methods are accepted
with their GSPMD meaning (docs/dtensor.md): XLA inserts the all-gathers
before use and reduces the gradients into the parameters' layout, inside
the step program.

* The forward reads each managed parameter unsharded, as FSDP2's does: the
  global xla tensor (a plain tensor; over tensor-parallel dims, a DTensor on
  those), which keeps its ``Shard(0)`` annotation, so XLA gathers it where
  it is used; the registered parameters stay DTensors.
* ``mp_policy`` (torch's ``MixedPrecisionPolicy``): the module's forward
  reads ``param_dtype`` copies of its parameters (each device casts its own
  shard, so the all-gathers move ``param_dtype`` bytes), floating inputs are
  cast to ``param_dtype`` (``cast_forward_inputs``) and floating outputs to
  ``output_dtype``; parameters, gradients and optimizer state keep the
  parameters' dtype. ``reduce_dtype`` is accepted: the gradient reductions
  are XLA's, placed on the backward's products, in their dtype.
* ``reshard_after_forward``: accepted (validated as in torch); whether the
  gathered weights live from the forward to the backward is XLA's
  scheduling choice inside the one program (activation checkpointing,
  ``spmdtorch.fsdp.checkpoint_module``, is the way to recompute instead).
* ``set_requires_gradient_sync(False)``: recorded; in one program a
  per-micro-batch ``backward()`` still reduces its gradients (GSPMD reduces
  where the gradient is made). Accumulate with
  :func:`spmdtorch.fsdp.accumulate_gradients` for one reduction per step.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils._pytree import tree_map

from spmdtorch import _checks, sharding
from spmdtorch.dtensor._mesh import XlaDeviceMesh, as_xla_mesh, init_device_mesh
from spmdtorch.dtensor._tensor import _annotate, _spec, distribute_tensor, from_local
from spmdtorch.dtensor.errors import DTensorError, UnsupportedFSDPError
from spmdtorch.tensor import is_xla_tensor

__all__ = ["XlaFSDPModule", "fully_shard"]

_FLOATING = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class _Handle:
    """What ``unshard(async_op=True)`` returns: nothing to wait for (XLA gathers inside the program)."""

    def wait(self) -> None:
        """Returns at once."""


class XlaFSDPModule(FSDPModule):
    """FSDP2's ``FSDPModule`` for modules :func:`fully_shard` sharded over an xla mesh.

    ``isinstance(m, torch.distributed.fsdp.FSDPModule)`` holds, and FSDP2's
    methods are accepted with their single-controller meaning: the
    scheduling knobs (``reshard``, ``unshard``, prefetching, reshard after
    forward/backward, gradient sync and all-reduce flags, post-optimizer
    events) are recorded and change no program, because XLA places and
    schedules every collective; methods that plug in communication code or
    change gradient values (custom all-gather / reduce-scatter, all-reduce
    hooks, divide factors) raise :class:`UnsupportedFSDPError`.
    """

    # MRO: [FSDP<Orig>, XlaFSDPModule, FSDPModule, Orig, ...]: FSDPModule.__new__ reads the original class here.
    _orig_cls_mro_index: int = 3

    # -- FSDP2's forward: mixed precision ------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The original forward on the unsharded parameters, with ``mp_policy``'s casts (see :func:`fully_shard`)."""
        policy: MixedPrecisionPolicy = self.__dict__["_spmdtorch_fsdp_mp"]
        # Instances are always FSDP<Orig>, whose MRO continues to Orig's forward (FSDPModule defines none).
        original = super().forward  # type: ignore[misc]
        dtype = policy.param_dtype
        if dtype is not None and policy.cast_forward_inputs:
            args, kwargs = _cast_floating((args, kwargs), dtype)
        out = _with_unsharded_params(cast(nn.Module, self), dtype, lambda: original(*args, **kwargs))
        if policy.output_dtype is not None:
            out = _cast_floating(out, policy.output_dtype)
        return out

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        # Skip FSDPModule._apply (it re-registers torch's per-rank shards): the parameters are the DTensors.
        return super(FSDPModule, self)._apply(*args, **kwargs)  # type: ignore[misc]  # Orig's, an nn.Module

    def _get_fsdp_state(self) -> Any:
        raise UnsupportedFSDPError(
            f"{type(self).__name__}: spmdtorch.dtensor.fully_shard keeps no per-rank FSDP state (no shards, streams "
            "or process groups); the parameters are DTensors laid out over the mesh and XLA does the collectives"
        )

    # -- recorded knobs -----------------------------------------------------------------
    def _fsdp_modules(self, recurse: bool) -> list[XlaFSDPModule]:
        if not recurse:
            return [self]
        return [m for m in cast(nn.Module, self).modules() if isinstance(m, XlaFSDPModule)]

    def _record(self, name: str, value: Any, recurse: bool = False) -> None:
        for m in self._fsdp_modules(recurse):
            m.__dict__.setdefault("_spmdtorch_fsdp_settings", {})[name] = value

    def fsdp_setting(self, name: str) -> Any:
        """The value a recorded ``set_*`` call gave (``"requires_gradient_sync"``...), or None."""
        return self.__dict__.get("_spmdtorch_fsdp_settings", {}).get(name)

    def reshard(self) -> None:
        """A no-op: the parameters are always laid out sharded; XLA frees gathered copies after use."""

    def unshard(self, async_op: bool = False) -> Any:
        """A no-op (XLA all-gathers inside the program where a weight is used); a handle when ``async_op``."""
        return _Handle() if async_op else None

    def set_requires_gradient_sync(self, requires_gradient_sync: bool, *, recurse: bool = True) -> None:
        """Recorded; a per-micro-batch ``backward()`` still reduces (use ``spmdtorch.fsdp.accumulate_gradients``)."""
        self._record("requires_gradient_sync", _check_bool(requires_gradient_sync, "requires_gradient_sync"), recurse)
        if not requires_gradient_sync:
            warnings.warn(
                "set_requires_gradient_sync(False) on an xla mesh: in one program GSPMD reduces each backward's "
                "gradients where they are made, so accumulating with backward() per micro-batch still reduces per "
                "micro-batch; spmdtorch.fsdp.accumulate_gradients(model, loss_fn, micro_batches) reduces once per "
                "step (docs/dtensor.md)",
                stacklevel=2,
            )

    def set_requires_all_reduce(self, requires_all_reduce: bool, *, recurse: bool = True) -> None:
        """Recorded (HSDP's all-reduce over the replicate dim is XLA's, as every reduction)."""
        self._record("requires_all_reduce", _check_bool(requires_all_reduce, "requires_all_reduce"), recurse)

    def set_reshard_after_forward(self, reshard_after_forward: bool, recurse: bool = True) -> None:
        """Recorded (what XLA keeps between forward and backward is its scheduling choice)."""
        self._record("reshard_after_forward", _check_bool(reshard_after_forward, "reshard_after_forward"), recurse)

    def set_reshard_after_backward(self, reshard_after_backward: bool, *, recurse: bool = True) -> None:
        """Recorded (parameters are always laid out sharded between programs)."""
        self._record("reshard_after_backward", _check_bool(reshard_after_backward, "reshard_after_backward"), recurse)

    def set_is_last_backward(self, is_last_backward: bool) -> None:
        """Recorded."""
        self._record("is_last_backward", _check_bool(is_last_backward, "is_last_backward"))

    def set_unshard_in_backward(self, unshard_in_backward: bool) -> None:
        """Recorded."""
        self._record("unshard_in_backward", _check_bool(unshard_in_backward, "unshard_in_backward"))

    def set_modules_to_forward_prefetch(self, modules: list[FSDPModule]) -> None:
        """Recorded (XLA's latency-hiding scheduler orders the all-gathers)."""
        self._record("modules_to_forward_prefetch", list(modules))

    def set_modules_to_backward_prefetch(self, modules: list[FSDPModule]) -> None:
        """Recorded (XLA's latency-hiding scheduler orders the all-gathers)."""
        self._record("modules_to_backward_prefetch", list(modules))

    def set_post_optim_event(self, event: Any) -> None:
        """Recorded (no CUDA streams here)."""
        self._record("post_optim_event", event)

    def set_force_sum_reduction_for_comms(self, enable: bool) -> None:
        """Recorded (gradients are the exact gradients of the loss either way)."""
        self._record("force_sum_reduction_for_comms", _check_bool(enable, "enable"))

    def set_allocate_memory_from_process_group_for_comm(self, enable: bool) -> None:
        """Recorded (no process group: XLA owns the buffers)."""
        self._record("allocate_memory_from_process_group_for_comm", _check_bool(enable, "enable"))

    def set_reduce_scatter_max_input_buffers(self, *args: Any, **kwargs: Any) -> None:
        """Recorded (XLA owns the buffers)."""
        self._record("reduce_scatter_max_input_buffers", (args, kwargs))

    def set_reduce_scatter_unused_params(self, *args: Any, **kwargs: Any) -> None:
        """Recorded (an unused parameter's gradient is XLA's zero or None, as autograd gives)."""
        self._record("reduce_scatter_unused_params", (args, kwargs))

    def set_separate_reduce_scatter_group(self, *args: Any, **kwargs: Any) -> None:
        """Recorded (no process groups)."""
        self._record("separate_reduce_scatter_group", (args, kwargs))

    def set_symm_mem_for_comm(self, *args: Any, **kwargs: Any) -> None:
        """Recorded (no process groups)."""
        self._record("symm_mem_for_comm", (args, kwargs))

    def _set_unshard_async_op(self, async_op: bool) -> None:
        self._record("unshard_async_op", bool(async_op))

    def reset_iter_state(self) -> None:
        """A no-op (no per-iteration FSDP state)."""

    # -- what has no meaning here ---------------------------------------------------------
    def set_custom_all_gather(self, comm: Any) -> None:
        """Raises :class:`UnsupportedFSDPError`: XLA inserts the all-gathers."""
        _no_comm_hook("set_custom_all_gather")

    def set_custom_reduce_scatter(self, comm: Any) -> None:
        """Raises :class:`UnsupportedFSDPError`: XLA inserts the reduce-scatters."""
        _no_comm_hook("set_custom_reduce_scatter")

    def set_all_reduce_hook(self, hook: Callable[[torch.Tensor], None], *, stream: Any = None) -> None:
        """Raises :class:`UnsupportedFSDPError`: there is no per-rank reduced gradient to hand a hook."""
        _no_comm_hook("set_all_reduce_hook")

    def set_gradient_divide_factor(self, factor: float) -> None:
        """Raises :class:`UnsupportedFSDPError`: gradients are the loss's own (scale the loss instead)."""
        _no_divide("set_gradient_divide_factor", factor)

    def set_reduce_scatter_divide_factor(self, factor: float) -> None:
        """Raises :class:`UnsupportedFSDPError`: gradients are the loss's own (scale the loss instead)."""
        _no_divide("set_reduce_scatter_divide_factor", factor)


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise DTensorError(f"FSDPModule: {name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def _no_comm_hook(what: str) -> None:
    raise UnsupportedFSDPError(
        f"FSDPModule.{what}: under one controller XLA inserts and runs every collective inside the compiled "
        "program, so there is no per-rank communication to replace or hook; drop the call (for custom collectives "
        "write the region with spmdtorch.sharding.shard_map)"
    )


def _no_divide(what: str, factor: Any) -> None:
    raise UnsupportedFSDPError(
        f"FSDPModule.{what}({factor!r}): gradients here are the exact gradients of the loss over the global batch "
        "(XLA's reductions sum per-device partial gradients), not per-rank gradients to divide; scale the loss "
        "instead (loss / factor * world_size gives torch's result)"
    )


def _cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


def _unsharded(p: torch.Tensor, fsdp_mesh: DeviceMesh, dtype: torch.dtype | None) -> torch.Tensor:
    """What FSDP2's forward reads for parameter ``p``: its value gathered over the FSDP dims (differentiably).

    For a parameter over the FSDP mesh alone, the global xla tensor (a plain
    tensor, as FSDP2's unsharded parameter is); composed with tensor
    parallelism, a DTensor over the remaining (TP) dims with their placements.
    Either way the value keeps its annotation, so XLA gathers it where it is
    used; gradients reach ``p`` with its placements. A ``dtype`` copy is
    annotated like ``p``, so each device casts its own shard and the gather
    moves ``dtype`` bytes (unannotated, XLA may gather first and cast after).
    """
    cast = dtype is not None and p.is_floating_point() and p.dtype != dtype
    if not isinstance(p, DTensor):
        # Already swapped for a plain tensor (spmdtorch.fsdp.accumulate_gradients' per-device leaves).
        return p.to(dtype) if cast else p
    value = p.to_local()
    if cast:
        value = _annotate(value.to(dtype), _spec(p.device_mesh, p.placements, value), creating=True)
    fsdp_names = tuple(fsdp_mesh.mesh_dim_names or ())
    names = tuple(p.device_mesh.mesh_dim_names or ())
    rest = names[len(fsdp_names) :]
    if names == fsdp_names or not rest:
        return value
    return from_local(value, p.device_mesh._get_root_mesh()[rest], p.placements[len(fsdp_names) :])


def _with_unsharded_params(module: nn.Module, dtype: torch.dtype | None, run: Callable[[], Any]) -> Any:
    """``run()`` while the parameters this module manages read unsharded (and as ``dtype`` copies, when given).

    The registered DTensor parameters are put back afterwards, as FSDP2 reshards
    after forward; autograd has recorded the reads, so gradients reach them.
    """
    managed: list[tuple[nn.Module, str]] = module.__dict__["_spmdtorch_fsdp_params"]
    fsdp_mesh: DeviceMesh = module.__dict__["_spmdtorch_fsdp_mesh"]
    saved: list[tuple[nn.Module, str, nn.Parameter]] = []
    views: dict[int, torch.Tensor] = {}
    try:
        for owner, name in managed:
            p = owner._parameters.get(name)
            if p is None:
                continue
            if id(p) not in views:  # a tied weight is one parameter under two names: one read
                views[id(p)] = _unsharded(p, fsdp_mesh, dtype)
            if views[id(p)] is p:
                continue
            saved.append((owner, name, p))
            # _parameters holds the read for the call, as torch.func.functional_call does.
            owner._parameters[name] = views[id(p)]  # type: ignore[assignment]
        return run()
    finally:
        for owner, name, p in reversed(saved):
            owner._parameters[name] = p


_FSDP_CLASSES: dict[type, type] = {}


def _fsdp_class(cls: type) -> type:
    if issubclass(cls, XlaFSDPModule):
        return cls
    found = _FSDP_CLASSES.get(cls)
    if found is None:
        found = type(f"FSDP{cls.__name__}", (XlaFSDPModule, cls), {})
        _FSDP_CLASSES[cls] = found
    return found


def _check_mesh(mesh: Any) -> XlaDeviceMesh:
    if mesh is None:
        from spmdtorch import runtime

        return init_device_mesh("xla", (runtime.global_runtime_device_count(),), mesh_dim_names=("dp_shard",))
    m = as_xla_mesh(mesh, "fully_shard(mesh)")
    if m.ndim not in (1, 2):
        raise DTensorError(
            f"fully_shard: mesh has {m.ndim} dims {m.mesh_dim_names}; FSDP2 takes a 1-D mesh (shard) or a 2-D mesh "
            "(replicate, shard): slice or flatten the data-parallel dims, e.g. mesh['dp'] or mesh['dp', 'cp']._flatten()"
        )
    return m


def _check_reshard(value: Any, mesh: DeviceMesh) -> None:
    if value is None or isinstance(value, bool):
        return
    size = mesh.size(mesh.ndim - 1)
    if not isinstance(value, int) or value <= 1 or value >= size or size % value:
        raise DTensorError(
            f"fully_shard: reshard_after_forward={value!r}; give True, False, None or an int that is a non-trivial "
            f"divisor of the shard dim's size {size} (as torch requires)"
        )


def _shard_placement(param: nn.Parameter, fn: Callable[[nn.Parameter], Any] | None) -> Shard:
    if fn is None:
        return Shard(0)
    got = fn(param)
    if got is None:
        return Shard(0)
    if not isinstance(got, Shard) or type(got) is not Shard:
        raise UnsupportedFSDPError(
            f"fully_shard: shard_placement_fn returned {got!r}; here it may return None or a Shard(dim) (a "
            "ShardPlacementResult's own mesh has no meaning: every parameter is laid out over the one xla mesh)"
        )
    dim = got.dim if got.dim >= 0 else got.dim + param.dim()
    if not 0 <= dim < param.dim():
        raise DTensorError(
            f"fully_shard: shard_placement_fn returned {got!r} for a parameter of shape {tuple(param.shape)}; "
            "give a dim it has"
        )
    return Shard(dim)


def _combined(mesh: DeviceMesh, param: DTensor, shard: Shard) -> tuple[DeviceMesh, list[Placement]]:
    """FSDP's mesh and placement composed with a DTensor parameter's own (tensor parallel): one mesh, both placements."""
    fsdp_names = tuple(mesh.mesh_dim_names or ())
    tp_names = tuple(param.device_mesh.mesh_dim_names or ())
    root = mesh._get_root_mesh()
    if param.device_mesh._get_root_mesh() != root or not fsdp_names or not tp_names:
        raise DTensorError(
            f"fully_shard: a parameter is already a DTensor on {param.device_mesh}, not a named sub-mesh of the "
            f"root of fully_shard's mesh {mesh}; slice both from one init_device_mesh mesh (mesh['dp'], mesh['tp'])"
        )
    if set(fsdp_names) & set(tp_names):
        raise DTensorError(
            f"fully_shard: a parameter is already laid out over {tp_names}, which fully_shard's mesh {fsdp_names} "
            "also spans; apply fully_shard once per module, over the data-parallel dims only"
        )
    fsdp_places: list[Placement] = [Replicate()] * (mesh.ndim - 1) + [shard]
    return root[fsdp_names + tp_names], fsdp_places + list(param.placements)


def _managed(modules: Sequence[nn.Module], ignored: set[int]) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """(owner, name, parameter) of every parameter these modules manage: not under a nested fully_shard module."""
    out: list[tuple[nn.Module, str, nn.Parameter]] = []
    seen: set[int] = set()

    def visit(m: nn.Module, top: bool) -> None:
        if not top and isinstance(m, XlaFSDPModule):
            return
        if id(m) in seen:
            return
        seen.add(id(m))
        for name, p in m._parameters.items():
            if p is not None and id(p) not in ignored:
                out.append((m, name, p))
        for child in m.children():
            visit(child, False)

    for m in modules:
        visit(m, True)
    return out


def fully_shard(
    module: nn.Module | list[nn.Module],
    *,
    mesh: DeviceMesh | None = None,
    reshard_after_forward: bool | int | None = None,
    shard_placement_fn: Callable[[nn.Parameter], Any] | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
    offload_policy: OffloadPolicy | None = None,
    ignored_params: set[nn.Parameter] | None = None,
    dp_mesh_dims: Any = None,
) -> Any:
    """FSDP2's ``fully_shard`` on an xla mesh: the module's parameters become ``Shard(0)`` DTensors.

    Call it per layer, then on the root, as with torch's: each call manages
    the parameters not already managed by a nested call. Every managed
    parameter is replaced by an ``nn.Parameter`` holding an ``XlaDTensor``
    sharded ``Shard(0)`` over ``mesh`` (``shard_placement_fn`` may pick
    another dim; on a 2-D mesh ``[Replicate(), Shard(0)]``: HSDP), so
    ``get_sharding_spec(p.to_local())`` is the ``mark_sharding`` layout with
    the data-parallel axis on that dim. A parameter that is already a
    DTensor on another sub-mesh of the same root (``parallelize_module``
    over ``mesh["tp"]`` first) keeps its placement there and gains FSDP's
    over ``mesh``: one DTensor over both, as FSDP2 + TP gives; its data is
    resharded into that layout at once (the replaced parameter shares it), so
    the first step program reshards no parameter. The module's
    class becomes ``FSDP<Class>``, an :class:`XlaFSDPModule` (so a
    ``torch.distributed.fsdp.FSDPModule``). The module docstring and
    docs/dtensor.md say what each option means under GSPMD.

    Args:
        module: a module, or a list of modules sharded as one group.
        mesh: an xla ``DeviceMesh`` (:func:`~spmdtorch.dtensor.init_device_mesh`),
            1-D (shard) or 2-D (replicate, shard), often a slice (``mesh["dp"]``);
            default: a 1-D mesh over every device.
        reshard_after_forward: ``True``, ``False``, ``None`` or a divisor of
            the shard dim's size, as in torch; accepted (see the module docstring).
        shard_placement_fn: ``fn(param) -> Shard(dim) | None`` (None: ``Shard(0)``).
        mp_policy: torch's ``MixedPrecisionPolicy``.
        offload_policy: torch's ``OffloadPolicy()`` (CPU offload is refused).
        ignored_params: parameters left as they are.
        dp_mesh_dims: must be None (torch 2.13's full-SPMD-mesh form is not taken).

    Returns:
        ``module`` (its class changed in place), as torch's.

    Raises:
        DeviceMeshError: ``mesh`` is not an xla mesh.
        DTensorError: a mesh with more than 2 dims, a bad ``reshard_after_forward``,
            a module that is not an ``nn.Module``.
        UnsupportedFSDPError: ``CPUOffloadPolicy``, ``dp_mesh_dims``, a
            ``shard_placement_fn`` result other than ``Shard``/None.

    Example:
        >>> import torch
        >>> from torch.distributed.fsdp import FSDPModule
        >>> from spmdtorch.dtensor import fully_shard, init_device_mesh
        >>> mesh = init_device_mesh("xla", (8,), mesh_dim_names=("dp",))
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16))
        >>> for layer in model:
        ...     _ = fully_shard(layer, mesh=mesh)
        >>> model = fully_shard(model, mesh=mesh)
        >>> isinstance(model, FSDPModule), model[0].weight.placements
        (True, (Shard(dim=0),))
        >>> model(torch.ones(8, 16, device="xla")).shape
        torch.Size([8, 16])
    """
    modules = list(module) if isinstance(module, (list, tuple)) else [module]
    if not modules or not all(isinstance(m, nn.Module) for m in modules):
        raise DTensorError(
            f"fully_shard: module must be an nn.Module or a non-empty list of them, got {type(module).__name__}"
        )
    if dp_mesh_dims is not None:
        raise UnsupportedFSDPError(
            "fully_shard: dp_mesh_dims (the full SPMD mesh form) is not taken; pass the data-parallel slice as "
            "mesh (mesh['dp'], or mesh['dp_replicate', 'dp_shard'] for HSDP)"
        )
    if offload_policy is not None and not isinstance(offload_policy, OffloadPolicy):
        raise DTensorError(f"fully_shard: offload_policy must be an OffloadPolicy, got {type(offload_policy).__name__}")
    if isinstance(offload_policy, CPUOffloadPolicy):
        raise UnsupportedFSDPError(
            "fully_shard: CPUOffloadPolicy keeps parameters and optimizer state in host memory between per-rank "
            "collectives; XLA's programs read device memory: drop offload_policy (use a larger mesh, or "
            "activation checkpointing, to fit)"
        )
    policy = MixedPrecisionPolicy() if mp_policy is None else mp_policy
    if not isinstance(policy, MixedPrecisionPolicy):
        raise DTensorError(f"fully_shard: mp_policy must be a MixedPrecisionPolicy, got {type(policy).__name__}")
    for field in ("param_dtype", "reduce_dtype", "output_dtype"):
        value = getattr(policy, field)
        if value is not None and value not in _FLOATING:
            raise DTensorError(f"fully_shard: mp_policy.{field} must be a floating dtype or None, got {value!r}")
    xmesh = _check_mesh(mesh)
    _check_reshard(reshard_after_forward, xmesh)
    if shard_placement_fn is not None and not callable(shard_placement_fn):
        raise DTensorError(f"fully_shard: shard_placement_fn must be callable, got {type(shard_placement_fn).__name__}")
    if ignored_params is not None and (
        not isinstance(ignored_params, (set, frozenset, list, tuple))
        or not all(isinstance(p, torch.Tensor) for p in ignored_params)
    ):
        _checks.fail(DTensorError, "fully_shard", "ignored_params", "a set of parameters or None", ignored_params)
    ignored = {id(p) for p in (ignored_params or ())}

    replaced: dict[int, nn.Parameter] = {}
    managed: list[tuple[nn.Module, str]] = []
    for owner, name, p in _managed(modules, ignored):
        managed.append((owner, name))
        new = replaced.get(id(p))
        if new is None:
            shard = _shard_placement(p, shard_placement_fn)
            if isinstance(p, DTensor):
                target_mesh, placements = _combined(xmesh, p, shard)
                value = p.to_local().detach()
            else:
                target_mesh, placements = xmesh, [Replicate()] * (xmesh.ndim - 1) + [shard]
                value = p.detach()
            if is_xla_tensor(value):
                # The parameter this one replaces lays its data out otherwise (parallelize_module's tensor-parallel
                # layout, a mark_sharding): re-lay that data in place, so concrete data is resharded now (one
                # device_put) and the new parameter is concrete. distribute_tensor would copy it instead, and the
                # pending copy would reshard in the first step program (collective-permutes the steps after it
                # have not). The replaced parameter shares the data, as an unannotated one already does.
                sharding.clear_sharding(value)
            new = nn.Parameter(distribute_tensor(value, target_mesh, placements), requires_grad=p.requires_grad)
            replaced[id(p)] = new
        owner._parameters[name] = new
    for m in modules:
        m.__dict__["_spmdtorch_fsdp_mp"] = policy
        m.__dict__["_spmdtorch_fsdp_mesh"] = xmesh
        m.__dict__["_spmdtorch_fsdp_params"] = managed
        m.__dict__["_spmdtorch_fsdp_settings"] = {"reshard_after_forward": reshard_after_forward}
        m.__class__ = _fsdp_class(type(m))
    return module
