"""``mark_sharding`` and friends: annotating xla tensors and modules.

An annotation lives on the tensor's storage. On concrete data it reshards the
data right away (``jax.device_put``); on a pending value it adds
``jax.lax.with_sharding_constraint`` to the graph. Either way the storage
remembers the sharding, so every later program that overwrites it (an
optimizer step) is compiled with that output sharding: parameters keep their
sharding across steps.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast, overload

import jax
import numpy as np
import torch

from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import metrics, padding
from spmdtorch.lazy._engine import ENGINE
from spmdtorch.lazy.graph import LazyRef, Slot
from spmdtorch.mesh import Mesh
from spmdtorch.tensor.dispatch import base_value, record
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
    if isinstance(partition_spec, (str, bytes)) or not isinstance(partition_spec, Sequence):
        hint = f"; did you mean ({partition_spec!r},)?" if isinstance(partition_spec, (str, int)) else ""
        raise ShardingTypeError(
            f"{what}: partition_spec must be a tuple with one entry per tensor dim (None, an axis index, "
            f"an axis name or a tuple of those), got {type(partition_spec).__name__} {partition_spec!r}{hint}"
        )
    return tuple(partition_spec)


@functools.lru_cache(maxsize=256)
def _pad_program(target: tuple[int, ...], sharding: jax.sharding.NamedSharding) -> Callable[..., Any]:
    return jax.jit(functools.partial(padding.pad_to, shape=target), out_shardings=sharding)


ENGINE.register_cache("partition.marking.pad_programs", _pad_program)


def _constrain(x: jax.Array, *, sharding: jax.sharding.Sharding) -> Any:  # jax.lax is unannotated
    return jax.lax.with_sharding_constraint(x, sharding)


def _check_tensor(t: object, what: str = "mark_sharding") -> XlaTensor:
    if not isinstance(t, XlaTensor):
        device = getattr(t, "device", type(t).__name__)
        raise ShardingError(
            f"{what} expects a tensor on the xla device, got {type(t).__name__} on {device}; "
            "move it first with t.to('xla')"
        )
    if t._chain:
        raise ShardingError(
            f"{what} of a view (shape {tuple(t.shape)}) is not supported: annotate the base "
            "tensor, or t.clone() the view to give it its own data"
        )
    return t


def _named_sharding(mesh: Mesh, partition_spec: Sequence[Any], t: torch.Tensor) -> jax.sharding.NamedSharding:
    _check_mesh(mesh, "mark_sharding")
    spec = _check_spec(partition_spec, "mark_sharding")
    if len(spec) != t.dim():
        raise ShardingError(
            f"partition_spec {spec} has {len(spec)} entries but the tensor has {t.dim()} dims "
            f"(shape {tuple(t.shape)}); give one entry per dim (None = replicated)"
        )
    return mesh.named_sharding(spec)


_T = TypeVar("_T", bound=torch.Tensor)
_M = TypeVar("_M", bound=torch.nn.Module)


@overload
def mark_sharding(t: _M, mesh: Mesh, partition_spec: Mapping[str, Sequence[Any]]) -> _M: ...
@overload
def mark_sharding(t: _T, mesh: Mesh, partition_spec: Sequence[Any]) -> _T: ...
def mark_sharding(t: Any, mesh: Mesh, partition_spec: Any) -> Any:
    """Annotate ``t`` (a tensor or an ``nn.Module``) with a sharding over ``mesh``.

    Args:
        t: an xla tensor, or a module (then ``partition_spec`` is a rules dict).
        mesh: a ``spmdtorch.mesh.Mesh``.
        partition_spec: one entry per tensor dim: a mesh axis index (int), an
            axis name (str), None (replicated), or a tuple of those (the dim
            is split over several axes, in that order). For a module: a mapping
            from parameter-name glob patterns to partition specs.

    Returns:
        ``t``.

    Raises:
        ShardingError: bad spec, or ``t`` already carries a different annotation
            (call ``clear_sharding(t)`` first).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding
        >>> w = torch.zeros(8, 4, device="xla")
        >>> _ = mark_sharding(w, get_1d_mesh("data"), ("data", None))
    """
    if isinstance(t, torch.nn.Module):
        return _mark_module(t, mesh, partition_spec)
    xt = _check_tensor(t)
    sharding = _named_sharding(mesh, partition_spec, xt)
    st = xt._st
    if st.annotated:
        if st.sharding == sharding:
            return t
        annotation = cast(jax.sharding.NamedSharding, st.sharding)  # annotated: mark_sharding's NamedSharding
        raise ShardingError(
            f"tensor of shape {tuple(t.shape)} is already annotated with spec "
            f"{tuple(annotation.spec)}; call spmdtorch.partition.clear_sharding(t) before "
            f"annotating it with {tuple(partition_spec)}"
        )
    value = base_value(st)
    if isinstance(value, LazyRef):
        ref = record(
            _constrain,
            "sharding_constraint",
            ((Slot(0),), (("sharding", sharding),)),
            [value],
            ((tuple(value.shape), value.dtype),),
        )
        st.set(ref)
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
    return t


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
    """Drop ``t``'s annotation; its data keeps its placement until recomputed."""
    st = _check_tensor(t, "clear_sharding")._st
    st.annotated = False
    st.sharding = None
    return t


def tensor_sharding(t: torch.Tensor) -> jax.sharding.Sharding | None:
    """The sharding ``t``'s data has (concrete) or will have (annotated), else None."""
    st = _check_tensor(t, "tensor_sharding")._st
    if st.annotated:
        annotation: jax.sharding.Sharding | None = st.sharding
        return annotation
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
    if not isinstance(t, XlaTensor):  # a view is fine: the annotated tensor is a copy
        _check_tensor(t, "mark_sharding_with_gradients")
    # Checked here, not in forward: autograd would report errors from there wrapped.
    spec = _check_spec(partition_spec, "mark_sharding_with_gradients")
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
        """``mark_sharding(t, self.mesh, self.partition_spec)``."""
        return mark_sharding(t, self.mesh, self.partition_spec)
