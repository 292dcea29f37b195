"""The general paths of the router (steps 3-6 of ``spmdtorch.tensor._router``).

* ``lowering``: record one node for a lowered op; its outputs are new dense tensors.
* ``view``: a new tensor on the same storage, with one more ``ViewStep``.
* ``mutation``: an in-place or ``out=`` op without a lowering of its own runs
  its functional twin and writes the result back (``write``).
* ``decompose``: torch's decomposition table, then ``op.decompose()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from spmdtorch import _dtypes
from spmdtorch.lazy import Part, Storage, ViewStep, keys, metrics, record, record_batch, rng
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor._facts import UNSET, functional_twin, op_facts
from spmdtorch.tensor._router import dispatch, facts_of, path
from spmdtorch.tensor._values import assign_value, read_value
from spmdtorch.tensor.dispatch._args import Args, all_ints
from spmdtorch.tensor.dispatch._errors import DeviceMismatchError
from spmdtorch.tensor.dispatch._meta import META_CACHE, meta_miss, meta_outputs
from spmdtorch.tensor.xla_tensor import PYTHON_KEY, XlaTensor, dense_tensor, forget_meta_key, view_tensor

if TYPE_CHECKING:
    from spmdtorch.ops.registry import Lowering
    from spmdtorch.tensor._facts import Op, OpFacts
    from spmdtorch.tensor.dispatch._meta import MetaSpec

__all__ = ["decompose", "dispatch_lowering", "dispatch_mutation", "dispatch_view", "write"]

aten = torch.ops.aten
_CLONE = aten.clone.default
_AS_STRIDED = aten.as_strided.default
_COUNTERS = metrics.counters  # one object for the process (metrics.reset clears it in place)
_new_part = tuple.__new__  # Part(...) without the NamedTuple's Python-level __new__ (one per foreach element)


@path("decompose")
def decompose(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts | None = None) -> Any:
    """torch's decomposition of ``func``, else ``NotImplementedError`` naming the overload."""
    decomp = torch._decomp.decomposition_table.get(func)
    if decomp is not None:
        metrics.inc("Decomposed")
        out = decomp(*args, **kwargs)
        if out is not NotImplemented:
            return out
    out = func.decompose(*args, **kwargs)
    if out is not NotImplemented:
        metrics.inc("Decomposed")
        return out
    raise NotImplementedError(
        f"spmdtorch has no lowering for ATen op '{func}' (overload {func._schema.name}."
        f"{func._overloadname or 'default'}) and torch has no decomposition for it. "
        "Add a lowering in spmdtorch/ops/ or file an issue with this message."
    )


@path("lowering")
def dispatch_lowering(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """Record ``func``'s lowering as one node; return its outputs as new tensors."""
    # Not a stub gap: the router sends only ops with a lowering here (_router._resolve),
    # a fact mypy cannot see, and a check would cost every recorded op.
    low: Lowering = facts.lowering  # type: ignore[assignment]
    if low.random and kwargs.get("generator") is not None:
        rng.check_generator(func, kwargs["generator"])  # raises: xla draws use the default generator
    parsed = Args(func, facts, args, kwargs)
    meta = META_CACHE.get(parsed.key)  # meta_outputs' hit path, inline (one call less per op)
    if meta is None:
        meta = meta_miss(func, args, kwargs, facts, parsed.key)
    else:
        _COUNTERS["MetaCacheHit"] += 1
    if facts.mutable_pos:
        # An in-place-only op with its own lowering (uniform_, copy_, ...):
        # the lowering returns the new values of the mutated arguments.
        targets = [args[i] if i < len(args) else kwargs[facts.arg_names[i]] for i in facts.mutable_pos]
        out_avals = tuple((tuple(t.shape), _dtypes.to_jax_dtype(t.dtype)) for t in targets)
        refs = record(low.fn, func, parsed.template, parsed.inputs, out_avals, random=low.random)
        if len(targets) == 1:
            refs = [refs]
        for t, r in zip(targets, refs):
            assign_value(t, r)
        return targets[0] if len(targets) == 1 else tuple(targets)
    sig = meta.sig
    if sig is None:
        sig = meta.sig = keys.node_sig(func, parsed.template)
    refs = record(low.fn, func, parsed.template, parsed.inputs, meta.avals, random=low.random, sig=sig)
    if not meta.multi:
        out = dense_tensor(Storage(refs), meta.dense_mks[0])  # contiguous, whatever strides meta gave
        if func is _CLONE and args[0]._st.annotated and not args[0]._chain:
            # A clone is the same tensor again: it keeps the annotation (XLA
            # would propagate it anyway, except for uneven shardings, which
            # JAX cannot return as program outputs without the annotation).
            out._st.sharding, out._st.annotated = args[0]._st.sharding, True
        return out
    if len(meta.avals) == 1:
        refs = [refs]
    outs = []
    it = iter(refs)
    for sp, mk in zip(meta.specs, meta.dense_mks):
        outs.append(None if sp is None else dense_tensor(Storage(next(it)), mk))
    return tuple(outs)


@path("view")
def dispatch_view(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """A view of ``args[0]``: same storage, one more ``ViewStep`` (no node until read)."""
    self = args[0]
    if not isinstance(self, XlaTensor):
        raise DeviceMismatchError(f"view op {func} got a {type(self).__name__} on {self.device} as self")
    mk = self._mk
    if facts.identity_view:
        return view_tensor(self._st, self._chain, mk)
    statics = _view_statics(args)
    kw = tuple(sorted([(k, _static(v)) for k, v in kwargs.items()])) if kwargs else ()
    key = (facts, mk, statics, kw)
    meta = META_CACHE.get(key)
    if meta is None:
        meta = meta_miss(func, args, kwargs, facts, key)
    else:
        _COUNTERS["MetaCacheHit"] += 1
    specs, multi = meta.specs, meta.multi
    # ViewSteps are immutable and the key fixes every field: one set per key
    # (which also keeps each step's node signature across calls).
    steps = meta.steps
    if steps is None:
        steps = meta.steps = tuple(
            ViewStep(func, statics, kw, i if multi else None, (s.shape, _dtypes.to_jax_dtype(s.dtype)))
            for i, s in enumerate(specs)
        )
    if func is _AS_STRIDED:
        # as_strided addresses the *storage*, not the input view.
        chain_base: tuple[ViewStep, ...] = ()
    else:
        chain_base = self._chain
    if not multi:
        return view_tensor(self._st, chain_base + steps, meta.view_mks[0])
    return [view_tensor(self._st, chain_base + (step,), mk) for step, mk in zip(steps, meta.view_mks)]


def _view_statics(args: Sequence[Any]) -> tuple[Any, ...]:
    """The arguments after ``self`` of a view op as a hashable tuple (``_static`` of each).

    Dims and sizes (ints, int lists) are the usual arguments of the ~300
    views of a training step: those skip the per-element ``_static`` calls.
    """
    rest = args[1:]
    for a in rest:
        t = type(a)
        if not (t is int or t is bool or a is None):
            break
    else:
        return rest if type(rest) is tuple else tuple(rest)
    return tuple([tuple(a) if type(a) is list and all_ints(a) else _static(a) for a in rest])


def _static(a: Any) -> Any:
    t = type(a)
    if t is int or t is bool or a is None:  # the common case (dims, sizes), checked first
        return a
    if isinstance(a, torch.Tensor):
        raise NotImplementedError("view ops with tensor arguments are not supported")
    if isinstance(a, list):
        return tuple([_static(x) for x in a])
    return a


def _inplace_twin_spec(
    func: Op, twin: Op, args: tuple[Any, ...], kwargs: dict[str, Any], parsed: Args
) -> tuple[Lowering, MetaSpec] | Literal[False]:
    """``(lowering, MetaSpec)`` of ``twin`` for an in-place call, or False.

    Valid for every call with the same meta key (the key fixes the shapes,
    dtypes and template the answer depends on). False when the general path
    is needed: the twin is not a plain lowered op, it parses its arguments
    differently (another set of liftable scalars), draws random numbers, or
    its result needs a cast or broadcast before it can be written into self.
    """
    facts = op_facts(func)
    tf = facts_of(twin)
    low = tf.lowering
    if (
        low is None
        or low.random
        or tf.route is not dispatch_lowering
        or tf.is_view
        or tf.mutable_pos
        or tf.lift_pos != facts.lift_pos
        or tf.lift_names != facts.lift_names
        or tf.allow_cpu != facts.allow_cpu
    ):
        return False
    spec = meta_outputs(twin, args, kwargs, tf, (tf,) + parsed.key[1:])
    self = args[0]
    out = spec.specs[0]
    if spec.multi or out.shape != tuple(self.shape) or out.dtype != self.dtype:
        return False
    if spec.sig is None:
        spec.sig = keys.node_sig(twin, parsed.template)
    return low, spec


@path("mutation")
def dispatch_mutation(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``add_``/``out=``: run the functional twin and write its results back."""
    twin = facts.twin
    if twin is UNSET:
        twin = facts.twin = functional_twin(func)
    if twin is None:
        return decompose(func, args, kwargs)
    if facts.is_inplace:
        self = args[0]
        if not isinstance(self, XlaTensor):
            raise DeviceMismatchError(f"in-place {func} on a tensor on {self.device} with xla arguments")
        # torch's checks (broadcast into self, dtype castability) via meta.
        parsed = Args(func, facts, args, kwargs)
        meta = meta_outputs(func, args, kwargs, facts, parsed.key)
        tw = meta.twin
        if tw is None:
            tw = meta.twin = _inplace_twin_spec(func, twin, args, kwargs, parsed)
        if tw is not False:
            # The twin's node on the same template and inputs becomes self's
            # value directly: no result tensor to wrap, no second argument walk.
            low, spec = tw
            ref = record(low.fn, twin, parsed.template, parsed.inputs, spec.avals, sig=spec.sig)
            assign_value(self, ref)
            return self
        result = dispatch(twin, args, kwargs)
        write(self, result)
        return self
    # out= variant
    out_names = facts.mutable_names
    outs = [kwargs[n] for n in out_names]
    fkwargs = {k: v for k, v in kwargs.items() if k not in out_names}
    result = dispatch(twin, args, fkwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    for o, r in zip(outs, results):
        if tuple(o.shape) != tuple(r.shape):
            if o._chain:
                raise RuntimeError(f"{func}: cannot resize out= view of shape {tuple(o.shape)} to {tuple(r.shape)}")
            with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEY):
                torch.ops.aten.resize_.default(o, list(r.shape))
            forget_meta_key(o)
        write(o, r)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _reads_other_self(values: Iterable[Any], own: Storage, selves: set[int]) -> bool:
    """Whether an xla tensor among ``values`` (or in a list among them) lives in another call's ``self`` storage."""
    for v in values:
        if isinstance(v, XlaTensor):
            if v._st is not own and id(v._st) in selves:
                return True
        elif isinstance(v, (list, tuple)) and _reads_other_self(v, own, selves):
            return True
    return False


def _identity(inputs: Sequence[Any]) -> tuple[object, ...]:
    """What the plan's merge of equal computations sees of a node's inputs.

    An input-less, non-random pending value (``torch.zeros`` made once per
    parameter) is keyed by what it computes, as the plan keys it, so equal
    calls on equal fresh values are found too.
    """
    out: list[object] = []
    for i in inputs:
        if type(i) is LazyRef:
            n = i.node
            if not n.inputs and not n.random:
                sig = n.sig if n.sig is not None else keys.node_sig(n.name, n.static_key)
                out.append(("made", sig, i.index))
            else:
                out.append((id(n), i.index))
        else:
            out.append(id(i))
    return tuple(out)


def inplace_batch(func: Op, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> bool:
    """Record the in-place calls ``func(*args, **kwargs)`` (one per list element) as ONE node.

    An optimizer's ``_foreach_add_(params, ...)`` is one in-place op per
    parameter; recorded one node each, they are most of a deep model's lazy
    step (hundreds of nodes per foreach op, walked and keyed every step).
    Every call must take :func:`dispatch_mutation`'s direct path (the
    functional twin's node becomes self's value: same shape and dtype, a
    plain lowering); the calls are then parsed first and written after, so
    no call may read another's ``self`` (nor two write one storage), and no
    two calls may compute the same thing from the same inputs (those stay
    separate nodes, which the plan merges into one shared buffer: AdamW's
    per-parameter step counters). Returns False, having recorded nothing,
    when any of that does not hold: the caller then dispatches one by one.

    Args:
        func: the per-element in-place op (``aten.add_.Tensor``...).
        calls: ``(args, kwargs)`` per list element.
    """
    facts = facts_of(func)
    if facts.route is not dispatch_mutation or facts.decompose_first or not facts.is_inplace or len(calls) < 2:
        return False
    twin = facts.twin
    if twin is UNSET:
        twin = facts.twin = functional_twin(func)
    if twin is None:
        return False
    selves: set[int] = set()  # id() of each call's self storage
    for args, _ in calls:
        self = args[0]
        if not isinstance(self, XlaTensor) or id(self._st) in selves:
            return False
        selves.add(id(self._st))
    # Per element of an optimizer's foreach op (thousands per step): the
    # meta cache's hit path and the Part tuple inline.
    parts = []
    seen = set()
    meta_get = META_CACHE.get
    for args, kwargs in calls:
        own = args[0]._st
        if _reads_other_self(args[1:], own, selves) or (kwargs and _reads_other_self(kwargs.values(), own, selves)):
            return False  # reads another call's self: sequential order would matter
        parsed = Args(func, facts, args, kwargs)
        meta = meta_get(parsed.key)
        if meta is None:
            meta = meta_miss(func, args, kwargs, facts, parsed.key)
        else:
            _COUNTERS["MetaCacheHit"] += 1
        tw = meta.twin
        if tw is None:
            tw = meta.twin = _inplace_twin_spec(func, twin, args, kwargs, parsed)
        if tw is False:
            return False
        low, spec = tw
        same = (spec.sig, _identity(parsed.inputs))
        if same in seen:
            return False
        seen.add(same)
        parts.append(_new_part(Part, (low.fn, twin, parsed.template, parsed.inputs, spec.avals[0], spec.sig)))
    _COUNTERS["DispatchedOps"] += len(calls)
    for (args, _), ref in zip(calls, record_batch(parts)):
        assign_value(args[0], ref)
    return True


def lowering_batch(func: Op, calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[XlaTensor] | None:
    """The out-of-place calls ``func(*args, **kwargs)`` (one per list element) recorded as ONE node.

    ``_foreach_sqrt(exp_avg_sqs)`` and the like (see :func:`inplace_batch`):
    every call must take :func:`dispatch_lowering`'s plain path (one dense
    output, no random draw, no mutated argument, not a clone, which keeps an
    annotation), and no two calls may be the same computation on the same
    inputs. Returns the new tensors, or None, having recorded nothing: the
    caller then dispatches one by one.
    """
    facts = facts_of(func)
    low = facts.lowering
    if (
        facts.route is not dispatch_lowering
        or facts.decompose_first
        or low is None
        or low.random
        or facts.mutable_pos
        or func is _CLONE
        or len(calls) < 2
    ):
        return None
    parts = []
    mks = []
    seen = set()
    for args, kwargs in calls:
        parsed = Args(func, facts, args, kwargs)
        meta = meta_outputs(func, args, kwargs, facts, parsed.key)
        if meta.multi:
            return None
        sig = meta.sig
        if sig is None:
            sig = meta.sig = keys.node_sig(func, parsed.template)
        same = (sig, _identity(parsed.inputs))
        if same in seen:
            return None
        seen.add(same)
        parts.append(Part(low.fn, func, parsed.template, parsed.inputs, meta.avals[0], sig))
        mks.append(meta.dense_mks[0])
    metrics.counters["DispatchedOps"] += len(calls)
    return [dense_tensor(Storage(ref), mk) for ref, mk in zip(record_batch(parts), mks)]


def write(dst: XlaTensor, src: XlaTensor, *, fresh: bool = False) -> None:
    """``dst`` ← ``src`` broadcast to dst's shape and cast to its dtype.

    The value written is always a node of its own unless ``src`` is a
    temporary pending result (``fresh=False`` and lazy): two live storages must
    never share one array or one pending value, or donating one would delete
    the other's data.
    """
    if src.dtype != dst.dtype:
        src = dispatch(aten._to_copy.default, (src,), {"dtype": dst.dtype})
    if tuple(src.shape) != tuple(dst.shape):
        src = dispatch(aten.expand.default, (src, list(dst.shape)), {})
        fresh = True
    value = read_value(src)
    if fresh or not isinstance(value, LazyRef):
        value = read_value(dispatch(aten.clone.default, (src,), {}))
    assign_value(dst, value)
