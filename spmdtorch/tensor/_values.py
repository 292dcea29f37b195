"""Reading and writing an xla tensor's value through its storage and view chain.

An xla tensor is ``(storage, view chain)`` (``spmdtorch.lazy._storage``):
reading replays the chain as lazy view nodes; writing through a view records
the inverse view ops that produce the base's next value. Duck-typed on
``t._st`` and ``t._chain``, so this sits below the tensor class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import torch

from spmdtorch.lazy import Select, Storage, ViewStep, contract, executor, keys, padding, record
from spmdtorch.lazy.constraint import CONSTRAINT, ConstraintStep, constrain, constraint_template
from spmdtorch.lazy.graph import LazyRef, Slot
from spmdtorch.ops import views
from spmdtorch.tensor._host import array_to_torch
from spmdtorch.tensor._router import facts_of

if TYPE_CHECKING:
    from spmdtorch.lazy.graph import Aval
    from spmdtorch.ops.registry import Lowering

__all__ = ["assign_value", "base_value", "concrete_value", "constrained_chain", "read_value", "to_cpu"]

# The op of a ConstraintStep: an identity view, whose inverse passes a write
# through the constraint to the parent unchanged.
_ALIAS = torch.ops.aten.alias.default


def base_value(st: Storage) -> Any:
    """The logical value of a storage (padded device data is read through a slice)."""
    value = st.value
    if st.logical_shape is None or isinstance(value, LazyRef) or tuple(value.shape) == st.logical_shape:
        return value
    cache = st.unpadded
    if cache is not None and cache[0] == st.version:
        return cache[1]
    ref = record(
        padding.unpad,
        "unpad",
        ((Slot(0),), (("shape", st.logical_shape),)),
        [value],
        ((st.logical_shape, value.dtype),),
    )
    st.unpadded = (st.version, ref)
    return ref


def concrete_value(t: Any) -> jax.Array:
    """The computed array of ``t``: pending work is run (a sync), and a view's
    slice that no storage holds is evaluated on its own."""
    value: jax.Array | LazyRef = read_value(t)
    if isinstance(value, LazyRef):
        executor.sync()
        value = read_value(t)
        if isinstance(value, LazyRef):
            value = executor.evaluate(value)
    return value


def to_cpu(t: Any) -> torch.Tensor:
    """Materialise an XlaTensor and return a CPU copy with torch's dtype."""
    contract.check_not_tracing("reads a tensor's value (.item(), .cpu(), print, bool)")
    value = read_value(t)
    if not isinstance(value, jax.Array):
        executor.sync()
        value = read_value(t)
        if not isinstance(value, jax.Array):  # a view: its slice is still pending
            value = executor.evaluate(value)
    return array_to_torch(value, t.dtype)


def read_value(t: Any) -> Any:
    """The current value of ``t``: concrete array or LazyRef (views replayed).

    ``t`` is an ``XlaTensor`` (duck-typed: the class sits above this module).

    A view's value is cached in its storage, keyed by the view chain, until the
    storage's next write (``Storage.set`` empties the cache). Keeping it in the
    storage rather than the tensor means a write drops the cached nodes at
    once: a tensor's stale cache used to pin the previous step's whole graph
    until the view was read again. Equal chains (their ViewSteps are shared)
    give the same value, so views re-made from the same base share it too.
    """
    st = t._st
    chain = t._chain
    if not chain:
        return base_value(st)
    cache = st.vcache
    if cache is not None:
        value = cache.get(chain)
        if value is not None:
            return value
    value = base_value(st)
    for step in chain:
        value = record_view_step(step, value)
    if st.vcache is None:
        st.vcache = {}
    st.vcache[chain] = value
    return value


def record_view_step(step: ViewStep, value: jax.Array | LazyRef) -> LazyRef:
    """Record ``step`` applied to ``value`` (a view's replay)."""
    # Every read of a view replays its chain (hundreds per step): what the
    # node needs besides its input is built once per ViewStep and reused
    # while the op's lowering stays the same one.
    low = facts_of(step.op).lowering
    rp = step.replay
    if rp is None or rp.lowering is not low:
        rp = step.replay = _view_replay(step, low)
    ref: LazyRef = record(rp.fn, rp.name, rp.template, [value], rp.out_avals, sig=rp.sig)
    return ref


class _Replay:
    """What recording one ViewStep's replay takes (built once per step and lowering)."""

    __slots__ = ("fn", "lowering", "name", "out_avals", "sig", "template")

    def __init__(
        self,
        lowering: Lowering,
        fn: Callable[..., Any],
        name: Any,
        template: Any,
        out_avals: tuple[Aval, ...],
        sig: int,
    ) -> None:
        self.lowering = lowering
        self.fn = fn
        self.name = name
        self.template = template
        self.out_avals = out_avals
        self.sig = sig


def _view_replay(step: ViewStep, low: Lowering | None) -> _Replay:
    """The replay node of ``step``.

    For one output of a multi-output view (``split``) the node computes the
    op and keeps output ``out_index``, as ``record(..., out_index=)`` makes it.
    """
    if low is None:
        raise NotImplementedError(f"spmdtorch has no lowering for view op {step.op}")
    if type(step) is ConstraintStep:  # built once per step: the read path stays as it is
        template: tuple[tuple[Any, ...], tuple[tuple[str, Any], ...]] = constraint_template(step.sharding)
        return _Replay(low, constrain, CONSTRAINT, template, (step.aval,), keys.node_sig(CONSTRAINT, template))
    template = ((Slot(0),) + step.args, step.kwargs)
    if step.out_index is None:
        fn, name = low.fn, step.op
    else:
        fn, name = Select(low.fn, step.out_index), (step.op, "select", step.out_index)
    return _Replay(low, fn, name, template, (step.aval,), keys.node_sig(name, template))


def constrained_chain(
    chain: tuple[ViewStep, ...], sharding: jax.sharding.Sharding, annotated: bool
) -> tuple[ViewStep, ...]:
    """``chain`` (a view's, non-empty) plus a step that constrains the view's value to ``sharding``.

    Every read of the view then replays the constraint (``mark_sharding`` of a
    view); the base is unaffected, and writes through the view reach it as before.
    """
    return chain + (ConstraintStep(_ALIAS, chain[-1].aval, sharding, annotated),)


def assign_value(t: Any, value: jax.Array | LazyRef) -> None:
    """Make ``value`` (same shape, storage dtype) the new value of ``t``.

    Writes through a view become inverse view ops on the base, so every alias
    of the storage sees the change.
    """
    st = t._st
    if not t._chain:
        st.set(value)
        return
    bases = [base_value(st)]
    for step in t._chain[:-1]:
        bases.append(record_view_step(step, bases[-1]))
    new = value
    for step, base in zip(reversed(t._chain), reversed(bases)):
        inv = views.VIEW_INVERSES.get(step.op)
        if inv is None:
            raise NotImplementedError(f"writing through a view made by {step.op} is not supported yet")
        kwargs = dict(step.kwargs)
        if step.out_index is not None:
            kwargs["out_index"] = step.out_index
        aval = (tuple(base.shape), base.dtype)
        new = record(
            inv,
            ("inverse", step.op),
            ((Slot(0), Slot(1)) + step.args, tuple(sorted(kwargs.items()))),
            [base, new],
            (aval,),
        )
    st.set(new)
    st.vcache = {t._chain: value}
