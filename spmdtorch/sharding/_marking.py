"""``mark_sharding`` and friends: annotating xla tensors and modules.

PyTorch/XLA's semantics, on any xla tensor:

* concrete data (a parameter, an input batch): the data is resharded right
  away (``jax.device_put``);
* a pending value (an activation): a sharding constraint in the graph
  (``jax.lax.with_sharding_constraint``; PyTorch/XLA's ``CustomSharding``),
  which the storage's next value goes through;
* a view (``x.view(...)``, ``reshape``, ``transpose``, a slice, the output
  of a 3-d ``linear``): a constraint on *that view's* value, the last step
  of its view chain, replayed on every read. Its base keeps its own
  sharding, and writes through the view still reach the base.

Numerically every annotation is the identity, so results and gradients are
those of the unannotated program. A base storage remembers its annotation, so
every later program that overwrites it (an optimizer step) is compiled with
that output sharding: parameters keep their sharding across steps.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import jax
import numpy as np
import torch
from torch._subclasses.fake_tensor import is_fake

from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import ConstraintStep, caches, metrics, padding, replicated_sharding
from spmdtorch.lazy.constraint import constrained_input, record_constraint
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.mesh import Mesh
from spmdtorch.sharding._in_graph import annotation, mark_sharding_in_graph
from spmdtorch.tensor import set_view_chain, storage_of, view_chain
from spmdtorch.tensor.dispatch import base_value, constrained_chain, special_op
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = [
    "ShardingError",
    "ShardingSpec",
    "mark_sharding",
    "clear_sharding",
    "mark_sharding_with_gradients",
    "tensor_sharding",
]


class ShardingError(ValueError):
    """An annotation that cannot be applied (bad spec, conflicting re-mark...)."""


class ShardingTypeError(ShardingError, ArgumentTypeError):
    """An argument of the wrong type (a ``TypeError`` too)."""


def _check_mesh(mesh: object, what: str) -> Mesh:
    if not isinstance(mesh, Mesh):
        raise ShardingTypeError(
            f"{what}: mesh must be a spmdtorch.mesh.Mesh, got {type(mesh).__module__}.{type(mesh).__qualname__}; "
            "build one with Mesh(device_ids, mesh_shape, axis_names) or get_1d_mesh()"
        )
    return mesh


def _check_spec(partition_spec: object, what: str) -> tuple[Any, ...]:
    """The spec as a tuple; its entries are checked against the mesh by ``Mesh.named_sharding``."""
    if isinstance(partition_spec, jax.sharding.PartitionSpec):  # not a tuple (nor a Sequence) in jax >= 0.10
        return tuple(partition_spec)
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, Sequence):
        hint = f"; did you mean ({partition_spec!r},)?" if isinstance(partition_spec, (str, int)) else ""
        raise ShardingTypeError(
            f"{what}: partition_spec must be a tuple with one entry per tensor dim (None, an axis index, "
            f"an axis name or a tuple of those), got {type(partition_spec).__name__} {partition_spec!r}{hint}"
        )
    return tuple(partition_spec)


@caches.memoize("partition.marking.pad_programs", maxsize=256)
def _pad_program(target: tuple[int, ...], sharding: jax.sharding.NamedSharding) -> Callable[..., Any]:
    return jax.jit(functools.partial(padding.pad_to, shape=target), out_shardings=sharding)


def _check_tensor(t: object, what: str = "mark_sharding") -> XlaTensor:
    if not isinstance(t, XlaTensor):
        device = getattr(t, "device", type(t).__name__)
        raise ShardingError(
            f"{what} expects a tensor on the xla device, got {type(t).__name__} on {device}; "
            "move it first with t.to('xla')"
        )
    return t


def view_constraint(t: XlaTensor) -> ConstraintStep | None:
    """The constraint step ending view ``t``'s chain (its annotation, or what clear_sharding left), else None."""
    chain = view_chain(t)
    if chain and type(chain[-1]) is ConstraintStep:
        step: ConstraintStep = chain[-1]
        return step
    return None


def _already_annotated(t: torch.Tensor, current: jax.sharding.Sharding, partition_spec: Sequence[Any]) -> ShardingError:
    annotation = cast(jax.sharding.NamedSharding, current)  # annotations are mark_sharding's NamedShardings
    what = "view" if view_chain(cast(XlaTensor, t)) else "tensor"
    return ShardingError(
        f"{what} of shape {tuple(t.shape)} is already annotated with spec "
        f"{tuple(annotation.spec)}; call spmdtorch.partition.clear_sharding(t) before "
        f"annotating it with {tuple(partition_spec)}"
    )


def _named_sharding(mesh: Mesh, partition_spec: Sequence[Any], t: torch.Tensor) -> jax.sharding.NamedSharding:
    _check_mesh(mesh, "mark_sharding")
    spec = _check_spec(partition_spec, "mark_sharding")
    if len(spec) != t.dim():
        raise ShardingError(
            f"partition_spec {spec} has {len(spec)} entries but the tensor has {t.dim()} dims "
            f"(shape {tuple(t.shape)}); give one entry per dim (None = replicated)"
        )
    return mesh.named_sharding(spec)


def _tracing(t: object) -> bool:
    """Whether ``t`` is a tracer's stand-in: TorchDynamo is tracing, or ``t`` is a fake (AOTAutograd, make_fx)."""
    if torch.compiler.is_compiling():
        return True
    return isinstance(t, torch.Tensor) and not isinstance(t, XlaTensor) and is_fake(t)


_T = TypeVar("_T", bound=torch.Tensor)
_M = TypeVar("_M", bound=torch.nn.Module)


@overload
def mark_sharding(t: _M, mesh: Mesh, partition_spec: Mapping[str, Sequence[Any]]) -> _M: ...
@overload
def mark_sharding(t: _T, mesh: Mesh, partition_spec: Sequence[Any]) -> _T: ...
def mark_sharding(t: Any, mesh: Mesh, partition_spec: Any) -> Any:
    """Annotate ``t`` (a tensor or an ``nn.Module``) with a sharding over ``mesh``.

    On a view the annotation constrains the view's value (its base is
    unaffected); on a pending value it is a constraint in the graph; on
    concrete data it reshards the data (see the module docstring).

    Args:
        t: an xla tensor (views and activations included), or a module (then
            ``partition_spec`` is a rules dict).
        mesh: a ``spmdtorch.mesh.Mesh``.
        partition_spec: one entry per tensor dim: a mesh axis index (int), an
            axis name (str), None (replicated), or a tuple of those (the dim
            is split over several axes, in that order). For a module: a mapping
            from parameter-name glob patterns to partition specs.

    Returns:
        ``t``, annotated in place.

    Raises:
        ShardingError: bad spec, or ``t`` already carries a different annotation
            (call ``clear_sharding(t)`` first).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding
        >>> w = torch.zeros(8, 4, device="xla")
        >>> _ = mark_sharding(w, get_1d_mesh("data"), ("data", None))
        >>> h = w.t().reshape(2, 2, 8)          # a view: its value is constrained, w is not
        >>> mark_sharding(h, get_1d_mesh("data"), (None, None, "data")) is h
        True
    """
    if isinstance(t, torch.nn.Module):
        return _mark_module(t, mesh, partition_spec)
    if _tracing(t):
        # TorchDynamo or AOTAutograd is tracing (t is a fake stand-in): the
        # annotation becomes an op in the captured graph, applied when it runs.
        return mark_sharding_in_graph(t, mesh, partition_spec)
    xt = _check_tensor(t)
    _mark_tensor(xt, _named_sharding(mesh, partition_spec, xt), partition_spec)
    return t


def _mark_tensor(xt: XlaTensor, sharding: jax.sharding.NamedSharding, partition_spec: Sequence[Any]) -> None:
    """:func:`mark_sharding` of an xla tensor, its spec already checked and converted to ``sharding``."""
    if view_chain(xt):
        step = view_constraint(xt)
        if step is not None and step.annotated:
            if step.sharding == sharding:
                return
            raise _already_annotated(xt, step.sharding, partition_spec)
        # A view's own value is constrained; what clear_sharding left is replaced.
        chain = view_chain(xt) if step is None else view_chain(xt)[:-1]
        set_view_chain(xt, constrained_chain(chain, sharding, annotated=True))
        return
    st = storage_of(xt)
    if st.annotated:
        if st.sharding == sharding:
            return
        raise _already_annotated(xt, cast(jax.sharding.Sharding, st.sharding), partition_spec)
    if st.host is not None:
        # Still on the host (deferred upload): each device gets only its shard.
        st.upload(sharding)
        st.sharding = sharding
        st.annotated = True
        return
    value = base_value(st)
    cleared = constrained_input(value)
    if isinstance(cleared, jax.Array):
        # clear_sharding's pending gather of concrete data: reshard the data itself.
        value = cleared
    if isinstance(value, LazyRef):
        st.set(record_constraint(value, sharding))
    else:
        metrics.inc("ReshardOnDevice")
        if value.size == 0:
            # No data to move. jax 0.10 reshards an empty *replicated* array onto
            # a mesh with another device order with wrong per-device shapes
            # (reading it back then fails); a fresh host array places correctly.
            value = np.zeros(value.shape, value.dtype)
        target = padding.padded_shape(value.shape, sharding)
        if target is None:
            st.logical_shape = None
            st.set(jax.device_put(value, sharding))
        else:
            # Uneven: keep the data padded so each device holds only its block.
            # The pad program's input must live on the target mesh's devices
            # in its order (a replicated relabelling, not a reshard).
            home = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
            st.logical_shape = tuple(value.shape)
            st.set(_pad_program(target, sharding)(jax.device_put(value, home)))
    st.sharding = sharding
    st.annotated = True


# When a captured graph runs on xla tensors, its annotation ops (spmdtorch.sharding._in_graph) are mark_sharding.
@special_op(torch.ops.spmdtorch.mark_sharding_.default)
def _mark_in_graph(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], facts: Any) -> None:
    t, key = args
    mark_sharding(t, *annotation(key))


@special_op(torch.ops.spmdtorch.sharded_copy.default)
def _sharded_copy_in_graph(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], facts: Any) -> torch.Tensor:
    t, key = args
    out: torch.Tensor = mark_sharding(t.clone(), *annotation(key))
    return out


def match_rules(names: Iterable[str], rules: Mapping[str, Any], owner: str = "") -> dict[str, str]:
    """``name -> pattern`` for the names the glob ``rules`` match.

    Raises:
        ShardingError: a pattern matches no name, or a name matches two patterns.
    """
    listed = list(names)
    matched: dict[str, str] = {}
    for pattern in rules:
        hits = [name for name in listed if fnmatch.fnmatchcase(name, pattern)]
        if not hits:
            raise ShardingError(
                f"sharding rule {pattern!r} matches no parameter{owner}; parameter names look like {listed[:5]}"
            )
        for name in hits:
            if name in matched:
                raise ShardingError(
                    f"parameter {name!r} is matched by two rules, {matched[name]!r} and {pattern!r}; "
                    "make the patterns disjoint"
                )
            matched[name] = pattern
    return matched


def _mark_module(module: _M, mesh: Mesh, rules: Mapping[str, Sequence[Any]]) -> _M:
    """Apply glob ``rules`` to ``module.named_parameters()`` (see ``mark_sharding``)."""
    if not isinstance(rules, Mapping):
        raise ShardingError(
            f"marking a module needs a dict of parameter-name patterns to partition specs, got {type(rules).__name__}"
        )
    params = dict(module.named_parameters())
    matched = match_rules(params, rules, owner=f" of {type(module).__name__}")
    for name, pattern in matched.items():
        p = params[name]
        try:
            mark_sharding(p, mesh, rules[pattern])
        except ShardingError as e:
            raise type(e)(f"parameter {name!r} (rule {pattern!r}): {e}") from None
    return module


def clear_sharding(t: _T) -> _T:
    """Drop ``t``'s annotation: from now on ``t`` is unannotated, i.e. replicated.

    As in PyTorch/XLA, ``get_sharding_spec(t)`` is ``""`` right after, and so
    is every inspection (``sharding_type`` REPLICATED, ``tensor_sharding``
    None until the value is recomputed): concrete sharded data is gathered at
    the next barrier (a pending reshard, so ``clear_sharding`` followed by
    ``mark_sharding`` reshards once, without the gather), and programs that
    overwrite ``t`` later keep it replicated. A pending value loses the
    annotation's constraint; a view loses its constraint and reads replicated.

    Returns:
        ``t``, cleared in place.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import clear_sharding, get_sharding_spec, mark_sharding
        >>> w = mark_sharding(torch.zeros(8, 4, device="xla"), get_1d_mesh("d"), ("d", None))
        >>> get_sharding_spec(clear_sharding(w))
        ''
    """
    xt = _check_tensor(t, "clear_sharding")
    if view_chain(xt):
        _clear_view(xt)
        return t
    st = storage_of(xt)
    if st.host is not None:
        return t  # still on the host (deferred upload): never annotated, placed nowhere yet
    annotation = st.sharding if st.annotated else None
    st.annotated = False
    value = st.value
    if isinstance(value, LazyRef):
        inner = constrained_input(value)
        if annotation is not None and inner is not None and value.node.template[1] == (("sharding", annotation),):
            st.set(inner)  # the annotation's own constraint node goes with it
        st.sharding = None
        return t
    if value.is_fully_replicated and st.logical_shape is None:
        st.sharding = None  # already replicated: nothing to gather
        CLEARED_AT[st] = st.version
        return t
    replicated = _replicated_like(value.sharding)
    ref = record_constraint(base_value(st), replicated)
    st.logical_shape = None  # the gathered value is unpadded
    st.set(ref)
    st.sharding = replicated  # set() would keep the old placement for the next program
    CLEARED_AT[st] = st.version + 1  # the gather's result (the next barrier sets it) is still cleared data
    return t


# Storage -> the version at which its concrete value is the data clear_sharding
# left (the value itself, or the result of the gather it queued). PyTorch/XLA
# reports no sharding for such data until a program computes the tensor again;
# ``get_sharding_spec(t, computed=True)`` reads this to do the same.
CLEARED_AT: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _replicated_like(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """Replicated over the mesh of ``sharding`` (the default placement for other kinds)."""
    if isinstance(sharding, jax.sharding.NamedSharding):
        return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return replicated_sharding()


def _clear_view(t: XlaTensor) -> None:
    """A view reads replicated after clear_sharding: its constraint becomes a replicated one.

    Without a mesh to be replicated over (an unannotated view of a pending,
    unannotated base), there is nothing to clear and the chain stays.
    """
    chain = view_chain(t)
    step = view_constraint(t)
    if step is not None:
        chain = chain[:-1]
        mesh_of: jax.sharding.Sharding | None = step.sharding
    else:
        st = storage_of(t)
        mesh_of = st.sharding if st.annotated else getattr(st.value, "sharding", None)
    if mesh_of is None:
        return
    set_view_chain(t, constrained_chain(chain, _replicated_like(mesh_of), annotated=False))


def tensor_sharding(t: torch.Tensor) -> jax.sharding.Sharding | None:
    """The sharding ``t``'s data has (concrete) or will have (annotated), else None.

    For a view: its annotation (or the replicated constraint ``clear_sharding``
    left), else None (a view holds no data of its own). None too for data still
    on the host (deferred upload, ``spmdtorch.tensor.transfer``); asking never
    uploads it.
    """
    xt = _check_tensor(t, "tensor_sharding")
    if view_chain(xt):
        step = view_constraint(xt)
        return None if step is None else step.sharding
    st = storage_of(xt)
    if st.annotated:
        annotation: jax.sharding.Sharding | None = st.sharding
        return annotation
    if st.host is not None:
        # Still on the host (deferred upload): placed nowhere yet. Asking must
        # not upload it, or a mark_sharding that asks first would replicate it.
        return None
    value = st.value
    if isinstance(value, LazyRef):
        return None
    placement: jax.sharding.Sharding = value.sharding
    return placement


class _MarkWithGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, t: torch.Tensor, mesh: Mesh, spec: tuple[Any, ...]) -> torch.Tensor:
        ctx.mesh, ctx.spec = mesh, spec
        out = t.clone()
        mark_sharding(out, mesh, spec)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.clone()
        mark_sharding(grad, ctx.mesh, ctx.spec)
        return grad, None, None


def mark_sharding_with_gradients(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """Annotate a value *and its gradient* with the same sharding.

    Returns a tensor to use in place of ``t`` (autograd needs a new node for
    the gradient annotation); inside XLA the copy is free.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding_with_gradients
        >>> x = torch.ones(8, 2, device="xla", requires_grad=True)
        >>> y = mark_sharding_with_gradients(x * 2, get_1d_mesh("d"), ("d", None))
    """
    tracing = _tracing(t)
    if not isinstance(t, XlaTensor) and not tracing:  # a view is fine: the annotated tensor is a copy
        _check_tensor(t, "mark_sharding_with_gradients")
    # Checked here, not in forward: autograd would report errors from there wrapped.
    spec = _check_spec(partition_spec, "mark_sharding_with_gradients")
    if not torch.compiler.is_compiling():  # (TorchDynamo would stop at JAX's mesh code)
        _check_mesh(mesh, "mark_sharding_with_gradients").named_sharding(spec, t.dim())
    # torch leaves Function.apply unannotated.
    out: torch.Tensor = _MarkWithGradients.apply(t, mesh, tuple(partition_spec))  # type: ignore[no-untyped-call]
    return out


@dataclasses.dataclass(frozen=True)
class ShardingSpec:
    """A reusable (mesh, partition_spec) pair, as in PyTorch/XLA.

    ``minibatch=True`` marks input batches whose dim 0 each process loads only
    its own part of (used by the data loaders).

    Example:
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> spec = ShardingSpec(get_1d_mesh("data"), ("data", None))
    """

    mesh: Mesh
    partition_spec: tuple[Any, ...]
    minibatch: bool = False

    def __post_init__(self) -> None:
        mesh = _check_mesh(self.mesh, "ShardingSpec")
        spec = _check_spec(self.partition_spec, "ShardingSpec")
        # Entries are checked now (unknown axis, an axis used twice...), so a bad
        # spec fails where it is written, not at the first batch; the rank is
        # checked when the spec is applied to a tensor.
        mesh.jax_partition_spec(spec)
        if not isinstance(self.minibatch, bool):
            raise ShardingTypeError(f"ShardingSpec: minibatch must be True or False, got {self.minibatch!r}")
        object.__setattr__(self, "partition_spec", spec)

    def apply(self, t: _T) -> _T:
        """``mark_sharding(t, self.mesh, self.partition_spec)``.

        The spec was checked when this object was made, so applying it to an
        xla tensor only checks the rank (callers that annotate every op's
        result, such as ``spmdtorch.dtensor``, keep one per layout).
        """
        if isinstance(t, XlaTensor) and not _tracing(t):
            sharding = _SPEC_SHARDINGS.get(self)
            if sharding is None:
                sharding = self.mesh.named_sharding(self.partition_spec)
                _SPEC_SHARDINGS.put(self, sharding)
            if len(self.partition_spec) != t.dim():
                _named_sharding(self.mesh, self.partition_spec, t)  # raises mark_sharding's error
            _mark_tensor(t, sharding, self.partition_spec)
            return t
        return mark_sharding(t, self.mesh, self.partition_spec)


# ShardingSpec -> its NamedSharding (kept out of the frozen dataclass: a NamedSharding does not pickle).
_SPEC_SHARDINGS = caches.bounded("sharding.spec_shardings", maxsize=1024)
