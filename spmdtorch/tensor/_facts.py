"""What the dispatcher knows about an ATen op before it sees any argument.

``op_facts(func)`` reads the op's schema once (which arguments are mutated,
whether it is a view, which numbers may become runtime inputs, its lowering);
the router (``spmdtorch.tensor._router``) adds the route it resolved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from spmdtorch.lazy import caches
from spmdtorch.ops import registry

__all__ = ["UNSET", "OpFacts", "Route", "functional_twin", "op_facts", "view_twin"]

aten = torch.ops.aten

if TYPE_CHECKING:
    from typing import TypeAlias

    Op: TypeAlias = torch._ops.OpOverload[..., Any]  # an ATen overload

# Argument types whose Python numbers become runtime inputs. "Tensor" is here
# because a Python number passed where a tensor is expected (``t / 0.5``
# inside torch.optim) arrives as a plain number: baking it into the graph would
# recompile every step as Adam's bias correction changes.
# (torch prints the schema type ``Scalar`` as "number".)
_SCALAR_TYPES = frozenset({"number", "Optional[number]", "float", "Optional[float]", "Tensor", "Optional[Tensor]"})

# Ops that, like on CUDA, accept CPU index tensors next to device tensors.
_CPU_OK_OPS = frozenset(
    op
    for name in ("index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default")
    for op in registry.resolve_ops(name)
)
_IDENTITY_VIEWS = frozenset(
    op for n in ("alias.default", "detach.default", "lift_fresh.default") for op in registry.resolve_ops(n)
)

UNSET: Any = object()  # OpFacts.twin before functional_twin was looked up

# A dispatch path or special handler: ``route(func, args, kwargs, facts)``.
Route = Callable[[Any, tuple[Any, ...], dict[str, Any], "OpFacts"], Any]


def _unresolved(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``OpFacts.route`` until the router resolves it (``facts_of``), which it does before any call."""
    raise RuntimeError(f"{func}: its facts were used before the router resolved a route (read them with facts_of)")


@dataclasses.dataclass(slots=True, eq=False)
class OpFacts:
    """Static facts about one ATen overload, computed once (``op_facts``).

    Identity-hashed (``eq=False``): a facts object stands for its op in the
    meta-cache keys. All fields but the last three are fixed at creation.

    Attributes:
        arg_names: the schema's argument names, in order.
        lowering: the registered ``Lowering`` or None.
        lift_pos: positions of (positional) numbers that become runtime inputs.
        lift_names: names of the arguments whose numbers become runtime inputs.
        static_scalars: numbers the lowering wants as Python numbers.
        branch: ``registry.get_branch(op)``: the static branch its lowering
            takes from the arguments (``Lowering.branch``), or None.
        mutable_pos: positions of the arguments the op writes.
        mutable_names: their names.
        is_view: the first result aliases an input (and nothing is written).
        is_out: an ``out=`` variant.
        is_inplace: an in-place variant (``add_``).
        has_device: the op takes a ``device`` argument.
        implicit: CompositeImplicitAutograd with no lowering: decomposed first.
        allow_cpu: CPU tensors may be arguments (index tensors).
        identity_view: ``alias``/``detach``: the same view again.
        twin: ``functional_twin(op)``, looked up on first use (``UNSET`` until then).
        route: the handler the router resolved, set once by the router (``_unresolved`` before).
        decompose_first: the router tries ``op.decompose()`` before ``route``.
    """

    arg_names: list[str]
    lowering: registry.Lowering | None
    lift_pos: frozenset[int]
    lift_names: frozenset[str]
    static_scalars: frozenset[Any]
    branch: Callable[..., Any] | None
    mutable_pos: tuple[int, ...]
    mutable_names: tuple[str, ...]
    is_view: bool
    is_out: bool
    is_inplace: bool
    has_device: bool
    implicit: bool
    allow_cpu: bool
    identity_view: bool
    twin: Any = UNSET
    route: Route = _unresolved
    decompose_first: bool = False


@caches.memoize("tensor.facts.op_facts", maxsize=8192)
def op_facts(func: Op) -> OpFacts:
    """``func``'s static facts (cached; ``spmdtorch.tensor._router.reset_op_facts`` clears it)."""
    schema = func._schema
    args = schema.arguments
    lowering = registry.get_lowering(func)
    lift = lowering is None or lowering.lift_scalars
    mutable_pos = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    rets = schema.returns
    is_out = any(args[i].kwarg_only for i in mutable_pos)
    return OpFacts(
        arg_names=[a.name for a in args],
        lowering=lowering,
        lift_pos=frozenset(i for i, a in enumerate(args) if lift and not a.kwarg_only and str(a.type) in _SCALAR_TYPES),
        lift_names=frozenset(a.name for a in args if lift and str(a.type) in _SCALAR_TYPES),
        static_scalars=frozenset() if lowering is None else lowering.static_scalars,
        branch=registry.get_branch(func),
        mutable_pos=mutable_pos,
        mutable_names=tuple(args[i].name for i in mutable_pos),
        is_view=bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write and not mutable_pos,
        is_out=is_out,
        is_inplace=bool(mutable_pos) and not is_out and schema.name.endswith("_"),
        has_device=any(a.name == "device" for a in args),
        # CompositeImplicitAutograd ops (to.dtype, reshape, contiguous...) are
        # defined by their decomposition; one that reaches us is decomposed.
        implicit=lowering is None
        and torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd"),
        # Set membership hashes an OpOverload in Python: looked up once here, not per call.
        allow_cpu=func in _CPU_OK_OPS,
        identity_view=func in _IDENTITY_VIEWS,
    )


@caches.memoize("tensor.facts.functional_twins", maxsize=8192)
def functional_twin(func: Op) -> Op | None:
    """``add_.Tensor`` → ``add.Tensor``; ``add.out`` → ``add.Tensor``; else None."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    facts = op_facts(func)
    cand: Op
    if facts.is_inplace:
        packet = getattr(aten, name[:-1], None)
        if packet is None:
            return None
        # Same overload name is not always the same signature: pow_.Scalar
        # (Tensor self, Scalar exponent) is pow.Tensor_Scalar, while
        # pow.Scalar is (Scalar self, Tensor exponent).
        want: list[tuple[str, str]] | list[str] = [(a.name, str(a.type)) for a in schema.arguments]
        same: Op | None = getattr(packet, func._overloadname, None)
        cands: list[Op] = ([same] if same is not None else []) + [getattr(packet, ov) for ov in packet.overloads()]
        for cand in cands:
            if [(a.name, str(a.type)) for a in cand._schema.arguments] == want and not op_facts(cand).mutable_pos:
                return cand
        return None
    if facts.is_out:
        packet = getattr(aten, name, None)
        if packet is None:
            return None
        want = [a.name for a in schema.arguments if not (a.alias_info is not None and a.alias_info.is_write)]
        for ov in packet.overloads():
            cand = getattr(packet, ov)
            if cand is func or op_facts(cand).mutable_pos:
                continue
            if [a.name for a in cand._schema.arguments] == want:
                return cand
    return None


@caches.memoize("tensor.facts.view_twins", maxsize=8192)
def view_twin(func: Op) -> Op:
    """``transpose_.default`` → ``transpose.int``: the out-of-place view op with
    the same arguments (overload names differ between the two packets)."""
    name = func._schema.name.split("::")[-1][:-1]
    packet = getattr(aten, name)
    same: Op | None = getattr(packet, func._overloadname, None)
    cand: Op
    if same is not None:
        return same
    want = [(a.name, str(a.type)) for a in func._schema.arguments]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
            return cand
    raise NotImplementedError(f"{func}: no view op {name} with the same arguments")
