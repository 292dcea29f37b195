"""``XlaDTensor``: a torch ``DTensor`` whose local tensor is the whole (global) xla tensor.

Single-controller meaning (docs/dtensor.md): this process holds every shard,
so the ``DTensor``'s ``_local_tensor`` is the *global* xla tensor, annotated
with the partition spec its placements mean (``_placements``); the sharding is
GSPMD's, applied when the lazy program compiles. Consequences:

* ``to_local()`` is that global tensor and ``from_local(t, ...)`` takes ``t``
  as the global tensor; values never depend on placements, only layouts do.
* ``redistribute`` is a re-annotation (a copy carrying the new sharding; XLA
  inserts the collectives); ``full_tensor()`` is the replicated copy.
* ``Partial()`` is metadata: the global tensor already holds the reduced
  value, so every copy is whole (GSPMD's annotation replicates that axis).

How ops run: torch's own DTensor dispatch would propagate placements and call
collectives through process groups. Here an op on ``XlaDTensor`` arguments is
run at the ``__torch_function__`` level on their global xla tensors (so every
xla-tensor behaviour applies: autocast, index lists, fused attention), while a
dispatch mode watches the ATen ops it runs and asks torch's own sharding
propagator what placements each output has (the placements multi-controller
DTensor would report). Each tensor result is annotated with that layout and
wrapped again. An op torch has no sharding rule for gives replicated results.
Autograd joins the two levels with two identity functions (``_ToGlobal`` /
``_FromGlobal``), so gradients of ``XlaDTensor`` parameters are ``XlaDTensor``
with the parameter's placements.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from spmdtorch import _checks, fsdp, sharding
from spmdtorch.dtensor import _optim
from spmdtorch.dtensor._mesh import as_xla_mesh, spans_root, spmd_mesh
from spmdtorch.dtensor._placements import normalize_placements, spec_of
from spmdtorch.dtensor.errors import DTensorError, InplaceGradError, LocalTensorError, PlacementError
from spmdtorch.lazy import caches
from spmdtorch.tensor import BACKWARD_FUNCS, BACKWARD_NOT_HANDLED, is_xla_tensor, run_backward

__all__ = ["XlaDTensor", "distribute_tensor", "from_local"]


# -- specs and annotations ------------------------------------------------------
# (id(mesh), mesh, placements, shape, stride, dtype) -> the DTensorSpec of that layout, one object shared
# by every tensor with it (torch builds a spec in ~30 us and never changes one once made; torch's own
# dispatch shares its cached output specs the same way). The mesh is held, so its id is never reused.
_SPECS = caches.bounded("dtensor.specs", maxsize=4096)


def _meta(t: torch.Tensor) -> tuple[torch.Size, tuple[int, ...], torch.dtype]:
    # Read past the tensor's torch-function override (xla tensors route every attribute through theirs).
    with torch._C.DisableTorchFunctionSubclass():
        return t.shape, t.stride(), t.dtype


def _spec(mesh: DeviceMesh, placements: Sequence[Placement], t: torch.Tensor) -> DTensorSpec:
    placements = tuple(placements)
    shape, stride, dtype = _meta(t)
    key = (id(mesh), mesh, placements, shape, stride, dtype)
    spec = _SPECS.get(key)
    if spec is None:
        spec = DTensorSpec(mesh, placements, tensor_meta=TensorMeta(shape, stride, dtype))
        _SPECS.put(key, spec)
    return spec


# (spec, id(its mesh), rank, creating) -> the sharding.ShardingSpec to annotate with, or None when the
# layout leaves root axes open (see _annotate). Specs hash once (torch caches it) and are shared (_SPECS).
_LAYOUTS = caches.bounded("dtensor.layouts", maxsize=4096)


def _annotate(t: torch.Tensor, spec: DTensorSpec, *, creating: bool = False) -> torch.Tensor:
    """``t`` annotated with the GSPMD sharding of ``spec`` (a copy if ``t`` already carries another one).

    On a sub-mesh that leaves root axes out (``mesh["tp"]`` of dp x tp) a
    placement says nothing about those axes: in multi-controller DTensor each
    dp group holds its own data. A partition spec cannot leave an axis open
    (spmdtorch's annotations have no "unconstrained" entry), so such a spec
    is applied only where the values are created (``creating``: distribute_tensor,
    replicated over the other axes as torch's is); op results, ``from_local``
    and ``redistribute`` on such a mesh are left to GSPMD's propagation, which
    keeps e.g. a batch dim split over dp.
    """
    if fsdp.in_local_step():
        # accumulate_gradients' per-device body: t is one device's block, the mesh axes are manual there.
        return t
    # (every caller's spec was made from t or a tensor of its shape)
    rank = len(spec.tensor_meta.shape) if spec.tensor_meta is not None else len(_meta(t)[0])
    key = (spec, id(spec.mesh), rank, creating)
    layout = _LAYOUTS.get(key, _MISSING)
    if layout is _MISSING:
        if not creating and not spans_root(spec.mesh):
            layout = None
        else:
            # A ShardingSpec converts its spec to a NamedSharding once (mark_sharding would on every call).
            layout = sharding.ShardingSpec(spmd_mesh(spec.mesh), spec_of(spec.mesh, spec.placements, rank))
        _LAYOUTS.put(key, layout)
    if layout is None:
        return t
    try:
        return cast(sharding.ShardingSpec, layout).apply(t)
    except sharding.ShardingError:
        # t shares its storage with a tensor laid out otherwise (the caller's, a
        # view's base). A copy may inherit that annotation (a clone of concrete
        # data keeps its layout), so it is cleared first; the copy is free in XLA.
        return cast(sharding.ShardingSpec, layout).apply(sharding.clear_sharding(t.clone()))


def _grad_spec(spec: DTensorSpec, t: torch.Tensor) -> DTensorSpec:
    # A gradient is never a pending sum: Partial placements become Replicate.
    if not any(isinstance(p, Partial) for p in spec.placements) and _meta(t) == spec.tensor_meta:
        return spec  # (the usual case: the gradient has its tensor's layout and metadata)
    placements = [Replicate() if isinstance(p, Partial) else p for p in spec.placements]
    return _spec(spec.mesh, placements, t)


def _requires_grad(d: torch.Tensor) -> bool:
    # The wrapper's own flag, read past XlaDTensor's torch-function override (a __get__ call through it).
    with torch._C.DisableTorchFunctionSubclass():
        return d.requires_grad


def _detached(t: torch.Tensor) -> torch.Tensor:
    # An alias of t, straight to the dispatcher: xla tensors' torch-level routing has nothing to do for detach.
    with torch._C.DisableTorchFunctionSubclass():
        return t.detach()


def _to_xla(t: torch.Tensor) -> torch.Tensor:
    return t if is_xla_tensor(t) else t.to("xla")


def _grad_dtensor(grad: torch.Tensor, spec: DTensorSpec) -> XlaDTensor:
    """A gradient's global tensor as an ``XlaDTensor`` (in the joints' backward).

    Under ``create_graph`` the gradient has a history that a second backward
    must reach: the wrapper is then made through ``_FromGlobal``, an edge to
    it. A bare wrapper would drop it (the gradient would not require grad).
    """
    if grad.requires_grad and torch.is_grad_enabled():
        return cast(XlaDTensor, _FromGlobal.apply(grad, spec))
    return XlaDTensor._make(grad, spec)


def _grad_global(grad: torch.Tensor) -> torch.Tensor:
    """A gradient as a global xla tensor (in the joints' backward): an ``XlaDTensor``'s, through ``_ToGlobal``
    when it has a history to keep (``create_graph``; its bare ``_local_tensor`` is a detached alias)."""
    if not isinstance(grad, XlaDTensor):
        return grad
    if _requires_grad(grad) and torch.is_grad_enabled():
        return cast(torch.Tensor, _ToGlobal.apply(grad, None, False))
    return grad._local_tensor


# -- autograd joints ----------------------------------------------------------------
class _ToGlobal(torch.autograd.Function):
    """``XlaDTensor`` -> its global xla tensor; the gradient comes back as an ``XlaDTensor``.

    ``grad_spec``: the gradient's placements (default: ``d``'s). ``constrain``:
    the gradient is also annotated with them (``to_local``, and a parameter's
    gradient); an op's input that is an activation leaves its gradient's layout
    to GSPMD, as torch's DTensor leaves it to the backward ops' own rules.
    """

    @staticmethod
    def forward(ctx: Any, d: XlaDTensor, grad_spec: DTensorSpec | None, constrain: bool = True) -> torch.Tensor:
        ctx.grad_spec = grad_spec if grad_spec is not None else d._spec
        # A leaf (a parameter made by distribute_tensor) gets its gradient laid
        # out as itself, on a sub-mesh too (see _annotate's `creating`).
        with torch._C.DisableTorchFunctionSubclass():  # (read past XlaDTensor's torch-function override)
            ctx.leaf = d.is_leaf
        ctx.constrain = constrain or ctx.leaf
        # An alias of the global tensor that autograd does not treat as a view
        # (a view of a Function's input could not be written in place).
        return _detached(d._local_tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = _grad_global(grad)
        spec = _grad_spec(ctx.grad_spec, grad)
        if ctx.constrain:
            grad = _annotate(grad, spec, creating=ctx.leaf)
        return _grad_dtensor(grad, spec), None, None


class _FromGlobal(torch.autograd.Function):
    """A global xla tensor -> an ``XlaDTensor`` with ``spec``; the gradient goes back as the global tensor."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, spec: DTensorSpec) -> XlaDTensor:
        return XlaDTensor._make(_detached(t), spec)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _grad_global(grad), None


class _Redistribute(torch.autograd.Function):
    """A copy carrying ``spec``'s sharding; the gradient goes back with the source placements."""

    @staticmethod
    def forward(ctx: Any, d: XlaDTensor, spec: DTensorSpec, dtype: torch.dtype | None) -> XlaDTensor:
        ctx.source = d._spec
        ctx.dtype = d.dtype
        t = d._local_tensor.clone() if dtype is None or dtype == d.dtype else d._local_tensor.to(dtype)
        return XlaDTensor._make(_annotate(t, spec), spec)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        g = _grad_global(grad)
        g = g.clone() if g.dtype == ctx.dtype else g.to(ctx.dtype)
        spec = _grad_spec(ctx.source, g)
        return _grad_dtensor(_annotate(g, spec), spec), None, None


# -- placement propagation ------------------------------------------------------------
# (op, each argument's shape/stride/dtype/placements or value) -> the outputs' (mesh, placements).
# torch caches its own propagation too, but reaching it costs a DTensor stand-in per argument.
_PLACEMENTS = caches.bounded("dtensor.propagated_placements", maxsize=4096)


def _key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], specs: dict[int, Any]) -> Any:
    flat, tree = tree_flatten((args, kwargs))
    parts: list[Any] = [func, tree]
    for a in flat:
        if isinstance(a, torch.Tensor):
            entry = specs.get(id(a))
            spec = None if entry is None else (entry[1].mesh, entry[1].placements)
            parts.append((tuple(a.shape), a.stride(), a.dtype, spec))
        else:
            parts.append((type(a), a))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # an unhashable argument (a list of lists): not cached
        return None
    return key


def _placements_only(spec: Any) -> Any:
    if isinstance(spec, DTensorSpec):
        return (spec.mesh, spec.placements)
    if isinstance(spec, (list, tuple)):
        return [_placements_only(x) for x in spec]
    return None


def _as_specs(entry: Any) -> Any:
    # Specs without tensor metadata: every caller rebuilds them with its output's.
    if isinstance(entry, tuple):
        return DTensorSpec(entry[0], entry[1])
    if isinstance(entry, list):
        return [_as_specs(x) for x in entry]
    return None


def _propagated_spec(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], specs: dict[int, Any], depth: int = 0
) -> Any:
    """The output spec(s) torch's sharding rules give ATen op ``func`` on tensors whose specs ``specs`` holds (by id).

    Returns a ``DTensorSpec`` (without tensor metadata), a list of them, or
    None when there is no rule (the caller replicates).
    """
    key = _key(func, args, kwargs, specs)
    if key is not None:
        hit = _PLACEMENTS.get(key, _MISSING)
        if hit is not _MISSING:
            return _as_specs(hit)
    found = _placements_only(_propagate_uncached(func, args, kwargs, specs, depth))
    if key is not None:
        _PLACEMENTS.put(key, found)
    return _as_specs(found)


_MISSING = object()


def _propagate_uncached(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], specs: dict[int, Any], depth: int
) -> Any:
    flat, _ = tree_flatten((args, kwargs))
    mesh = next((specs[id(a)][1].mesh for a in flat if id(a) in specs), None)
    if mesh is None:
        return None

    def stand_in(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        entry = specs.get(id(a))
        # Tensors that are not DTensors are replicated (DTensor's implicit replication).
        spec = entry[1] if entry is not None else _spec(mesh, [Replicate()] * mesh.ndim, a)
        local = a.detach() if a.requires_grad else a  # a stand-in only: no autograd through it
        return DTensor(local, spec, requires_grad=False)  # torch's C constructor

    propagator = DTensor._op_dispatcher.sharding_propagator
    if not (
        func in propagator.op_strategy_funcs
        or func in propagator.op_to_rules
        or func in propagator.op_single_dim_strategy_funcs
    ):
        # Asked first, not caught: a raised exception's traceback holds the frames
        # of the model's forward, which a reference cycle keeps alive until the
        # cyclic collector runs (spmdtorch.compile then sees its activations
        # outlive the call and cannot replay).
        return _spec_by_decomposition(func, args, kwargs, specs, depth)
    try:
        s_args, s_kwargs = tree_map(stand_in, (args, kwargs))
        info = DTensor._op_dispatcher.unwrap_to_op_info(func, s_args, s_kwargs)
        result: Any = DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding(info.schema)
        return result.output_spec
    except Exception:  # noqa: BLE001  # no rule / a rule's own error: try the op's decomposition
        return _spec_by_decomposition(func, args, kwargs, specs, depth)


def _equivalents() -> dict[Any, Any]:
    """spmdtorch's own fused ops and the ATen composites with the same meaning (torch has rules for their parts)."""
    aten, ours = torch.ops.aten, torch.ops.spmdtorch
    return {ours.linear.default: aten.linear.default, ours.batched_matmul.default: aten.matmul.default}


def _spec_by_decomposition(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], specs: dict[int, Any], depth: int
) -> Any:
    """Placements of an op torch has no rule for, read off its decomposition run on meta stand-ins.

    Composite ops (``aten.linear``) and spmdtorch's fused ones (``spmdtorch::linear``,
    ``spmdtorch::batched_matmul``) decompose into ops torch has rules for; the
    decomposition runs on shape-only ``meta`` tensors under a nested
    :class:`_Propagate`, so no value is computed twice. None when there is none.
    """
    target = _equivalents().get(func, func)
    if depth > 2 or not hasattr(target, "decompose"):  # (a decomposition of a decomposition... is enough)
        return None
    meta_specs: dict[int, Any] = {}

    def to_meta(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        m = torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
        if id(a) in specs:
            meta_specs[id(m)] = (m, specs[id(a)][1])
        return m

    m_args, m_kwargs = tree_map(to_meta, (args, kwargs))
    try:
        with _Propagate(meta_specs, depth + 1):
            out = target.decompose(*m_args, **m_kwargs)
    except Exception:  # noqa: BLE001  # no decomposition that runs on meta: the caller replicates
        return None
    if out is NotImplemented:
        return None
    found = [
        meta_specs.get(id(o), (None, None))[1] if isinstance(o, torch.Tensor) else None for o in tree_flatten(out)[0]
    ]
    return found[0] if isinstance(out, torch.Tensor) else found


class _Propagate(TorchDispatchMode):
    """Records, for every ATen op run under it on tracked tensors, the placements torch's rules give its outputs."""

    def __init__(self, specs: dict[int, Any], depth: int = 0) -> None:
        super().__init__()
        self.specs = specs  # id(tensor) -> (tensor kept alive, DTensorSpec)
        self.depth = depth  # how many decompositions deep (see _spec_by_decomposition)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        tracked = any(id(a) in self.specs for a in tree_flatten((args, kwargs))[0])
        if tracked:
            spec = _propagated_spec(func, args, kwargs, self.specs, self.depth)
            outs, _ = tree_flatten(out)
            spec_list = spec if isinstance(spec, (list, tuple)) else [spec] * len(outs)
            for o, s in zip(outs, spec_list):
                if isinstance(o, torch.Tensor) and isinstance(s, DTensorSpec):
                    self.specs[id(o)] = (o, _spec(s.mesh, s.placements, o))
        return out


# -- the class ---------------------------------------------------------------------------
# Python's in-place operators (x += y) and item assignment; other dunders (__int__, __index__) read.
_INPLACE_DUNDERS = frozenset(
    f"__i{op}__"
    for op in (
        "add",
        "sub",
        "mul",
        "matmul",
        "truediv",
        "floordiv",
        "mod",
        "pow",
        "and",
        "or",
        "xor",
        "lshift",
        "rshift",
    )
) | {"__setitem__"}


def _is_inplace(func: Any, kwargs: dict[str, Any]) -> bool:
    """Whether a torch function writes its first argument (``x.add_``, ``x += y``, ``x[i] = v``) or ``out=``."""
    name = getattr(func, "__name__", "")
    if "out" in kwargs:
        return True
    return (name.endswith("_") and not name.startswith("__")) or name in _INPLACE_DUNDERS


_NO_WRAP = torch.overrides.get_default_nowrap_functions()
# Tensor methods that act on the DTensor object itself (its autograd state), not on its values.
_ON_WRAPPER = {
    torch.Tensor.requires_grad_,
    torch.Tensor.retain_grad,
    torch.Tensor.register_hook,
    torch.Tensor.register_post_accumulate_grad_hook,
    torch.Tensor.__reduce_ex__,
    torch.Tensor.__deepcopy__,
    torch.Tensor.dim,
    torch.Tensor.size,
    torch.Tensor.numel,
    torch.Tensor.stride,
}


def _root_grad(root: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """The gradient a root's edge takes: a DTensor for a DTensor root (the root's own node has a DTensor input)."""
    if isinstance(root, XlaDTensor) and not isinstance(grad, XlaDTensor):
        return _grad_dtensor(_to_xla(grad), root._spec)
    if not isinstance(root, XlaDTensor) and isinstance(grad, XlaDTensor):
        return grad._local_tensor
    return grad


class XlaDTensor(DTensor):
    """A ``torch.distributed.tensor.DTensor`` over an xla mesh, driven by this one process.

    ``_local_tensor`` is the global xla tensor (annotated with the sharding
    its placements mean); ``_spec`` is torch's ``DTensorSpec``. Make one with
    :func:`distribute_tensor` or :func:`from_local`; ops on it return
    ``XlaDTensor`` results (see the module docstring).

    Example:
        >>> import torch
        >>> from torch.distributed.tensor import Shard
        >>> from spmdtorch.dtensor import distribute_tensor, init_device_mesh
        >>> mesh = init_device_mesh("xla", (8,), mesh_dim_names=("dp",))
        >>> d = distribute_tensor(torch.arange(16.0).reshape(8, 2), mesh, [Shard(0)])
        >>> (d * 2).placements, (d * 2).full_tensor().sum().item()
        ((Shard(dim=0),), 240.0)
    """

    @staticmethod
    def _make(global_tensor: torch.Tensor, spec: DTensorSpec, requires_grad: bool = False) -> XlaDTensor:
        if spec.tensor_meta is None:
            spec = _spec(spec.mesh, spec.placements, global_tensor)
        r = DTensor.__new__(XlaDTensor, global_tensor, spec, requires_grad=requires_grad)
        return cast(XlaDTensor, r)

    # -- what users see: the global tensor's device, not the wrapper's storage
    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._local_tensor.device

    @property
    def is_meta(self) -> bool:  # type: ignore[override]
        return False

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return f"XlaDTensor(global={self._local_tensor}, device_mesh={self._spec.mesh}, placements={self._spec.placements})"

    # -- DTensor's API, single-controller meanings --------------------------------------
    def to_local(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """The global xla tensor (this process holds every shard); differentiable.

        Args:
            grad_placements: the placements the gradient arriving through the
                result has (default: this tensor's).
        """
        if not (torch.is_grad_enabled() and self.requires_grad):
            return self._local_tensor
        grad_spec = None
        if grad_placements is not None:
            grad_spec = _spec(
                self.device_mesh,
                normalize_placements(grad_placements, self.device_mesh, self.dim(), "to_local(grad_placements)"),
                self,
            )
        out: torch.Tensor = _ToGlobal.apply(self, grad_spec)
        return out

    def redistribute(
        self,
        device_mesh: DeviceMesh | None = None,
        placements: Sequence[Placement] | None = None,
        *,
        async_op: bool = False,
        forward_dtype: torch.dtype | None = None,
        backward_dtype: torch.dtype | None = None,
    ) -> XlaDTensor:
        """A copy laid out as ``placements`` (a re-annotation: XLA inserts the collectives).

        ``async_op`` and ``backward_dtype`` are accepted: the collective is part of
        the next program either way, and the gradient comes back in this tensor's dtype.

        Raises:
            PlacementError: no ``placements``, or a ``Partial`` the source does not have.
        """
        mesh = self.device_mesh if device_mesh is None else as_xla_mesh(device_mesh, "redistribute(device_mesh)")
        if placements is None:
            raise PlacementError("redistribute: placements is required (one Shard/Replicate per mesh dim)")
        target = normalize_placements(placements, mesh, self.dim(), "redistribute")
        for i, p in enumerate(target):
            if isinstance(p, Partial) and (mesh != self.device_mesh or self.placements[i] != p):
                raise PlacementError(
                    f"redistribute: placements[{i}] is {p!r} but the source has {self.placements[i]!r}; "
                    "redistributing to Partial is not a layout (the values are already reduced): use Replicate()"
                )
        spec = _spec(mesh, target, self)
        if torch.is_grad_enabled() and self.requires_grad:
            out: XlaDTensor = _Redistribute.apply(self, spec, forward_dtype)
            return out
        t = self._local_tensor
        t = t.clone() if forward_dtype is None or forward_dtype == t.dtype else t.to(forward_dtype)
        return XlaDTensor._make(_annotate(t, spec), spec)

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None) -> torch.Tensor:
        """The global tensor as a plain xla tensor, annotated replicated (differentiable)."""
        full = self.redistribute(placements=[Replicate()] * self.device_mesh.ndim)
        return full.to_local(grad_placements=grad_placements)

    @staticmethod
    def from_local(
        local_tensor: torch.Tensor,
        device_mesh: DeviceMesh | None = None,
        placements: Sequence[Placement] | None = None,
        *,
        run_check: bool = False,
        shape: torch.Size | None = None,
        stride: tuple[int, ...] | None = None,
        **kwargs: Any,
    ) -> XlaDTensor:
        """:func:`from_local` (the tensor given is the global tensor)."""
        return from_local(local_tensor, device_mesh, placements, run_check=run_check, shape=shape, stride=stride)

    # -- ops: run on the global xla tensors, placements from torch's rules ----------------
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if func in BACKWARD_FUNCS:
            # From the DTensors' own gradient edges: run as an ordinary op, the call would take each DTensor
            # through a new _ToGlobal node, and inputs= would name tensors no root depends on. Not under
            # DisableTorchFunctionSubclass: the engine would run the whole backward so, an
            # activation-checkpointed layer's recomputation included, where xla tensors' own torch-function
            # routing (fused SDPA) is off and SDPA falls to its math path (MetaFactoryLeak). _ToGlobal's
            # backward hands each DTensor its gradient with its placements.
            done = run_backward(func, tuple(args), kwargs, seed_for=_root_grad)
            if done is not BACKWARD_NOT_HANDLED:
                return done
        if func in _ON_WRAPPER or func in _NO_WRAP or name in ("__get__", "__set__", "__delete__"):
            if name == "__get__" and getattr(func, "__self__", None) is torch.Tensor.data:
                return args[0].detach()
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        grad = torch.is_grad_enabled()
        inplace = _is_inplace(func, kwargs)
        if grad and inplace:
            target = args[0] if args else kwargs.get("out")
            if isinstance(target, XlaDTensor) and target.requires_grad:
                raise InplaceGradError(
                    f"{name}: an in-place op on a DTensor that requires grad (shape {tuple(target.shape)}); write it "
                    "out of place (x = x.relu(), not x.relu_()), or run it under torch.no_grad()"
                )
        specs: dict[int, Any] = {}
        originals: dict[int, XlaDTensor] = {}
        parts: list[Any] = [func, grad]

        def unwrap(x: XlaDTensor) -> torch.Tensor:
            g = _ToGlobal.apply(x, None, False) if grad and _requires_grad(x) else x._local_tensor
            specs[id(g)] = (g, x._spec)
            originals[id(g)] = x
            return g

        u_args = _unwrap_tree(tuple(args), unwrap, parts)
        u_kwargs = _unwrap_tree(kwargs, unwrap, parts)
        mesh = next(iter(specs.values()))[1].mesh if specs else None
        if inplace:
            # Its results are its inputs, which keep their placements: nothing to propagate.
            out = func(*u_args, **u_kwargs)
            return _map_tree(out, lambda o: _wrap_inplace_result(o, specs, originals, mesh, grad))
        key = _hashable(parts)
        layouts = None if key is None else _OP_LAYOUTS.get(key)
        if layouts is not None:
            # Seen before with these input layouts: the ATen ops it runs need no propagation again.
            out = func(*u_args, **u_kwargs)
            found = iter(layouts)
            return _map_tree(out, lambda o: _wrap_known(o, found, originals, grad))
        with _Propagate(specs):
            out = func(*u_args, **u_kwargs)
        recorded: list[Any] = []
        result = _map_tree(out, lambda o: _wrap_result(o, specs, originals, mesh, grad, recorded))
        if key is not None:
            _OP_LAYOUTS.put(key, tuple(recorded))
        else:
            _OP_LAYOUTS.bypasses += 1
        return result

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:  # type: ignore[override]
        # ATen ops reach here only from autograd's engine (gradient accumulation,
        # the seed gradient of backward()): below autograd, so no joints needed.
        kwargs = kwargs or {}
        specs: dict[int, Any] = {}
        originals: dict[int, XlaDTensor] = {}

        def unwrap(x: XlaDTensor) -> torch.Tensor:
            specs[id(x._local_tensor)] = (x._local_tensor, x._spec)
            originals[id(x._local_tensor)] = x
            return x._local_tensor

        parts: list[Any] = [func, "aten"]
        u_args = _unwrap_tree(tuple(args), unwrap, parts)
        u_kwargs = _unwrap_tree(kwargs, unwrap, parts)
        out = func(*u_args, **u_kwargs)
        key = _hashable(parts)
        layouts = None if key is None else _OP_LAYOUTS.get(key)
        if layouts is not None:
            found = iter(layouts)
            return _map_tree(out, lambda o: _wrap_known(o, found, originals, False))
        spec = _propagated_spec(func, u_args, u_kwargs, specs)
        outs, _ = tree_flatten(out)
        spec_list = spec if isinstance(spec, (list, tuple)) else [spec] * len(outs)
        for o, s in zip(outs, spec_list):
            if isinstance(o, torch.Tensor) and isinstance(s, DTensorSpec):
                specs[id(o)] = (o, _spec(s.mesh, s.placements, o))
        mesh = next(iter(specs.values()))[1].mesh if specs else None
        recorded: list[Any] = []
        result = _map_tree(out, lambda o: _wrap_result(o, specs, originals, mesh, False, recorded))
        if key is not None:
            _OP_LAYOUTS.put(key, tuple(recorded))
        else:
            _OP_LAYOUTS.bypasses += 1
        return result


_optim.install(XlaDTensor)  # optimizers over XlaDTensor parameters take their foreach path


def _wrap_result(
    o: Any,
    specs: dict[int, Any],
    originals: dict[int, XlaDTensor],
    mesh: DeviceMesh | None,
    grad: bool,
    recorded: list[Any] | None = None,
) -> Any:
    """An op's result ``o`` as an ``XlaDTensor`` with the placements propagation recorded in ``specs``.

    ``recorded`` (when given) gets, per tensor result, the spec it was given,
    or None for one returned as it is (:func:`_wrap_known` replays them).
    """
    if not isinstance(o, torch.Tensor) or isinstance(o, XlaDTensor):
        if recorded is not None and isinstance(o, torch.Tensor):
            recorded.append(None)
        return o
    if id(o) in originals:  # an in-place op's result is its input
        if recorded is not None:
            recorded.append(None)
        return originals[id(o)]
    if mesh is None or not is_xla_tensor(o):
        if recorded is not None:
            recorded.append(None)
        return o  # a host result (.cpu(), .numpy() inputs): the global values, as a plain tensor
    entry = specs.get(id(o))
    spec = entry[1] if entry is not None else None
    if spec is None or len(spec.placements) != spec.mesh.ndim:
        spec = _spec(mesh, [Replicate()] * mesh.ndim, o)
    spec = _spec(spec.mesh, spec.placements, o)
    if recorded is not None:
        recorded.append(spec)
    return _wrap_as(o, spec, grad)


def _wrap_as(o: torch.Tensor, spec: DTensorSpec, grad: bool) -> XlaDTensor:
    o = _annotate(o, spec)
    if grad and o.requires_grad:
        out: XlaDTensor = _FromGlobal.apply(o, spec)
        return out
    return XlaDTensor._make(o, spec)


def _wrap_known(o: Any, found: Iterator[Any], originals: dict[int, XlaDTensor], grad: bool) -> Any:
    """:func:`_wrap_result` for an op seen before: ``found`` yields what it recorded, per tensor result."""
    if not isinstance(o, torch.Tensor):
        return o
    layout = next(found, None)
    if isinstance(o, XlaDTensor):
        return o
    if id(o) in originals:
        return originals[id(o)]
    if layout is None or not is_xla_tensor(o):
        return o
    if _meta(o) != layout.tensor_meta:  # (the same inputs give the same result metadata; checked, not assumed)
        layout = _spec(layout.mesh, layout.placements, o)
    return _wrap_as(o, layout, grad)


def _wrap_inplace_result(
    o: Any, specs: dict[int, Any], originals: dict[int, XlaDTensor], mesh: DeviceMesh | None, grad: bool
) -> Any:
    """:func:`_wrap_result` for an in-place op, run without propagation: its results are its inputs.

    A tensor result that is not an input (no in-place op torch has returns one)
    gets the placements of the first input of its shape, else is replicated.
    """
    if not isinstance(o, torch.Tensor) or isinstance(o, XlaDTensor):
        return o
    if id(o) in originals:
        return originals[id(o)]
    if mesh is None or not is_xla_tensor(o):
        return o
    shape = _meta(o)[0]
    like = next((spec for _, spec in specs.values() if spec.shape == shape), None)
    placements = like.placements if like is not None else (Replicate(),) * mesh.ndim
    return _wrap_as(o, _spec(mesh if like is None else like.mesh, placements, o), grad)


# -- argument and result trees ------------------------------------------------------------
# (the torch function, grad mode, every argument's layout or value) -> per tensor result, the
# spec propagation gave it or None (see _wrap_result). An op seen before runs
# without the propagating mode: torch's rules depend only on what the key holds.
_OP_LAYOUTS = caches.bounded("dtensor.op_layouts", maxsize=4096)


def _unwrap_tree(obj: Any, unwrap: Any, parts: list[Any] | None) -> Any:
    """``obj`` (an argument tree) with every ``XlaDTensor`` replaced by ``unwrap(it)``.

    ``parts`` (when given) gets what torch's sharding rules read of each leaf:
    a DTensor's spec (its mesh, placements, shape, stride, dtype), another
    tensor's shape, stride, dtype and device type, any other value with its
    type (so ``1``, ``1.0`` and ``True`` differ). Containers add their type
    and length, so the flat parts also say the tree.
    """
    t = type(obj)
    if t is XlaDTensor:
        if parts is not None:
            parts.append(obj._spec)
        return unwrap(obj)
    if t is tuple or t is list:
        if parts is not None:
            parts.append((t, len(obj)))
        return t([_unwrap_tree(x, unwrap, parts) for x in obj])
    if t is dict:
        if parts is not None:
            parts.append((dict, tuple(obj)))
        return {k: _unwrap_tree(v, unwrap, parts) for k, v in obj.items()}
    if isinstance(obj, torch.Tensor):
        if isinstance(obj, XlaDTensor):  # (a subclass of it)
            if parts is not None:
                parts.append((t, obj._spec))
            return unwrap(obj)
        if parts is not None:
            shape, stride, dtype = _meta(obj)
            parts.append((t, shape, stride, dtype, obj.device.type))
        return obj
    if parts is not None:
        parts.append((t, (obj.start, obj.stop, obj.step)) if t is slice else (t, obj))
    return obj


def _hashable(parts: list[Any]) -> tuple[Any, ...] | None:
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:  # an unhashable argument: not cached
        return None
    return key


def _map_tree(obj: Any, fn: Any) -> Any:
    """``fn`` applied to every leaf of an op's result (tuples, lists, dicts and torch's named result tuples)."""
    t = type(obj)
    if t is tuple or t is list:
        return t([_map_tree(x, fn) for x in obj])
    if t is dict:
        return {k: _map_tree(v, fn) for k, v in obj.items()}
    if isinstance(obj, tuple):
        items = [_map_tree(x, fn) for x in obj]
        return t(*items) if hasattr(t, "_fields") else t(items)  # a namedtuple, or a structseq (torch.return_types)
    return fn(obj)


# -- constructors ------------------------------------------------------------------------
def _check_src_data_rank(src_data_rank: Any, func: str) -> None:
    # Accepted for torch's signature (every block comes from the one global tensor), but checked as torch types it.
    if src_data_rank is not None and not _checks.is_int(src_data_rank):
        _checks.fail(DTensorError, func, "src_data_rank", "an int or None", src_data_rank)


def distribute_tensor(
    tensor: torch.Tensor,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    *,
    src_data_rank: int | None = 0,
) -> XlaDTensor:
    """torch's ``distribute_tensor`` on an xla mesh: the global ``tensor`` laid out as ``placements`` say.

    The result is a leaf ``XlaDTensor`` (``requires_grad`` as ``tensor``'s)
    whose global tensor is ``tensor`` on the xla device, annotated with the
    sharding of ``placements`` (uneven dims are padded, as ``mark_sharding``
    does). An xla ``tensor`` not yet laid out otherwise shares its storage
    (and so its new layout) with the result; otherwise it is copied.
    ``src_data_rank`` is accepted: every device's block comes from the one
    global tensor.

    Raises:
        DeviceMeshError: ``device_mesh`` is not an xla mesh.
        PlacementError, UnsupportedPlacementError: bad placements.
        DTensorError: ``tensor`` is not a leaf, or is a DTensor or meta tensor.

    Example:
        >>> import torch
        >>> from torch.distributed.tensor import Replicate, Shard
        >>> from spmdtorch.dtensor import distribute_tensor, init_device_mesh
        >>> from spmdtorch.sharding import get_sharding_spec
        >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> d = distribute_tensor(torch.ones(4, 8), mesh, [Replicate(), Shard(1)])
        >>> d.placements, get_sharding_spec(d.to_local())
        ((Replicate(), Shard(dim=1)), '{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}')
    """
    if device_mesh is None:
        raise DTensorError("distribute_tensor: pass device_mesh (an spmdtorch.dtensor.init_device_mesh mesh)")
    mesh = as_xla_mesh(device_mesh, "distribute_tensor(device_mesh)")
    _check_src_data_rank(src_data_rank, "distribute_tensor")
    if isinstance(tensor, DTensor):
        raise DTensorError(
            f"distribute_tensor: tensor is already a DTensor (placements {tensor.placements}); use "
            "tensor.redistribute(mesh, placements) to change its layout"
        )
    if not isinstance(tensor, torch.Tensor):
        raise DTensorError(f"distribute_tensor: tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_leaf:
        raise DTensorError(
            "distribute_tensor: tensor is not a leaf (it has autograd history); distribute parameters and "
            "inputs, or use from_local for a tensor computed in the autograd graph"
        )
    if tensor.is_meta:
        raise DTensorError(
            f"distribute_tensor: tensor (shape {tuple(tensor.shape)}) is a meta tensor and has no values; "
            "materialize it first (module.to_empty(device='xla') and initialize)"
        )
    target = normalize_placements(placements, mesh, tensor.dim(), "distribute_tensor")
    g = _to_xla(tensor.detach())
    spec = _spec(mesh, target, g)
    return XlaDTensor._make(_annotate(g, spec, creating=True), spec, requires_grad=tensor.requires_grad)


def from_local(
    local_tensor: torch.Tensor,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    *,
    run_check: bool = False,
    shape: torch.Size | Sequence[int] | None = None,
    stride: Sequence[int] | None = None,
) -> XlaDTensor:
    """``DTensor.from_local`` under one controller: ``local_tensor`` is the *global* tensor.

    This process holds every shard, so the tensor it has is the whole value
    (what :meth:`XlaDTensor.to_local` returns); the result lays it out as
    ``placements`` say and is differentiable (gradients flow back to
    ``local_tensor``). ``run_check`` is accepted (there is one copy to check).

    Raises:
        LocalTensorError: ``shape``/``stride`` other than ``local_tensor``'s (a
            per-rank shard has no single-controller meaning), or a ``Partial``
            placement (a sum of per-rank values: reduce first and pass the sum).
        DeviceMeshError, PlacementError, UnsupportedPlacementError: as :func:`distribute_tensor`.
    """
    if device_mesh is None:
        raise DTensorError("from_local: pass device_mesh (an spmdtorch.dtensor.init_device_mesh mesh)")
    mesh = as_xla_mesh(device_mesh, "from_local(device_mesh)")
    if isinstance(local_tensor, DTensor):
        raise DTensorError("from_local: local_tensor is already a DTensor; use its redistribute(...)")
    _checks.check_instance(local_tensor, torch.Tensor, "from_local", "local_tensor", DTensorError, "a torch.Tensor")
    _checks.check_bool(run_check, "from_local", "run_check", DTensorError)
    if shape is not None:
        shape = _checks.check_int_sequence(shape, "from_local", "shape", LocalTensorError, minimum=0)
    if stride is not None:
        stride = _checks.check_int_sequence(stride, "from_local", "stride", LocalTensorError, minimum=0)
    target = normalize_placements(placements, mesh, local_tensor.dim(), "from_local")
    if shape is not None and tuple(shape) != tuple(local_tensor.shape):
        raise LocalTensorError(
            f"from_local: shape={tuple(shape)} but local_tensor has shape {tuple(local_tensor.shape)}; under one "
            "controller the local tensor is the global tensor: pass the whole tensor and no shape"
        )
    if stride is not None and tuple(stride) != tuple(local_tensor.stride()):
        raise LocalTensorError(
            f"from_local: stride={tuple(stride)} but local_tensor has stride {tuple(local_tensor.stride())}; pass "
            "the whole tensor and no stride"
        )
    for i, p in enumerate(target):
        if isinstance(p, Partial):
            raise LocalTensorError(
                f"from_local: placements[{i}] is {p!r}, a sum of per-rank tensors, but one controller has one "
                "tensor; reduce first and pass the sum with Replicate()"
            )
    t = _to_xla(local_tensor)
    spec = _spec(mesh, target, t)
    if torch.is_grad_enabled() and t.requires_grad:
        out: XlaDTensor = _FromGlobal.apply(_annotate(t, spec), spec)
        return out
    return XlaDTensor._make(_annotate(t, spec), spec)
