"""``__torch_dispatch__`` for XlaTensor: ATen op → lazy node (or eager fallback).

The order of resolution for one ATen call:

1. special handlers (transfers, ``copy_``, ``.item()``, metadata-changing ops);
2. data-dependent ops (``nonzero``, boolean masks): materialise and run on CPU;
3. view ops: a new tensor sharing the storage, with one more ``ViewStep``;
4. mutating ops (``add_``, ``out=``): run the functional twin, write back;
5. a registered lowering: record a node (shapes come from torch's meta kernels,
   cached by argument signature since Python meta kernels are slow);
6. torch's decomposition table, then ``op.decompose()``;
7. otherwise ``NotImplementedError`` naming the overload.
"""

from __future__ import annotations

import functools
import itertools

import jax
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from spmdtorch import _dtypes
from spmdtorch.lazy import keys, metrics, rng
from spmdtorch.lazy.graph import LazyRef, Node, Scalar, Slot, interned_scalar
from spmdtorch.lazy.rewrite import RULES as _REWRITES
from spmdtorch.ops import registry
from spmdtorch.tensor import xla_tensor
from spmdtorch.tensor.xla_tensor import (
    _PYTHON_KEY,
    XLA_DEVICE,
    Storage,
    ViewStep,
    XlaTensor,
    _contiguous_strides,
    _MetaFlag,
    dense_tensor,
    forget_meta_key,
    new_base,
    view_tensor,
)

__all__ = ["dispatch", "read_value", "assign_value", "record", "capture_meta_factories", "MetaFactoryLeak"]

aten = torch.ops.aten

# Argument types whose Python numbers become runtime inputs. "Tensor" is here
# because a Python number passed where a tensor is expected (``t / 0.5``
# inside torch.optim) arrives as a plain number: baking it into the graph would
# recompile every step as Adam's bias correction changes.
# (torch prints the schema type ``Scalar`` as "number".)
_SCALAR_TYPES = frozenset({"number", "Optional[number]", "float", "Optional[float]", "Tensor", "Optional[Tensor]"})
_INT32 = (-(2**31), 2**31 - 1)


class DeviceMismatchError(RuntimeError):
    """An xla tensor met a non-scalar tensor on another device."""


class MetaFactoryLeak(DeviceMismatchError):
    """A plain ``meta`` tensor met xla tensors inside one op.

    XlaTensor's storage device is ``meta``, so a C++ composite op (``cov``,
    ``cosine_similarity``...) that builds a helper tensor with
    ``at::empty(..., self.options())`` gets a real meta tensor, which has no
    data. The device mode (``spmdtorch.tensor.device_mode``) catches this at
    the top-level torch call and runs it again under ``capture_meta_factories``,
    where such factories create xla tensors instead.
    """


# -- per-op static facts ---------------------------------------------------


class OpFacts:
    __slots__ = (
        "lift_pos",
        "lift_names",
        "is_view",
        "mutable_pos",
        "mutable_names",
        "is_inplace",
        "is_out",
        "lowering",
        "has_device",
        "arg_names",
        "implicit",
        "route",
        "allow_cpu",
        "identity_view",
        "static_scalars",
        "twin",
    )


_UNSET = object()


@functools.cache
def op_facts(func) -> OpFacts:
    f = OpFacts()
    schema = func._schema
    args = schema.arguments
    f.arg_names = [a.name for a in args]
    f.lowering = registry.get_lowering(func)
    lift = f.lowering is None or f.lowering.lift_scalars
    f.lift_pos = frozenset(i for i, a in enumerate(args) if lift and not a.kwarg_only and str(a.type) in _SCALAR_TYPES)
    f.lift_names = frozenset(a.name for a in args if lift and str(a.type) in _SCALAR_TYPES)
    f.static_scalars = frozenset() if f.lowering is None else f.lowering.static_scalars
    f.twin = _UNSET  # functional_twin(func), looked up on first use (lru_cache hashes the op in Python)
    f.mutable_pos = tuple(i for i, a in enumerate(args) if a.alias_info is not None and a.alias_info.is_write)
    f.mutable_names = tuple(args[i].name for i in f.mutable_pos)
    rets = schema.returns
    f.is_view = bool(rets) and rets[0].alias_info is not None and not rets[0].alias_info.is_write and not f.mutable_pos
    f.is_out = any(args[i].kwarg_only for i in f.mutable_pos)
    f.is_inplace = bool(f.mutable_pos) and not f.is_out and schema.name.endswith("_")
    f.has_device = any(a.name == "device" for a in args)
    # CompositeImplicitAutograd ops (to.dtype, reshape, contiguous...) are
    # defined by their decomposition; one that reaches us is decomposed.
    f.implicit = f.lowering is None and torch._C._dispatch_has_kernel_for_dispatch_key(
        func.name(), "CompositeImplicitAutograd"
    )
    # Set membership hashes an OpOverload in Python: looked up once here, not per call.
    f.allow_cpu = func in _CPU_OK_OPS
    f.identity_view = func in _IDENTITY_VIEWS
    return f


@functools.cache
def functional_twin(func):
    """``add_.Tensor`` → ``add.Tensor``; ``add.out`` → ``add.Tensor``; else None."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    facts = op_facts(func)
    if facts.is_inplace:
        packet = getattr(aten, name[:-1], None)
        if packet is None:
            return None
        # Same overload name is not always the same signature: pow_.Scalar
        # (Tensor self, Scalar exponent) is pow.Tensor_Scalar, while
        # pow.Scalar is (Scalar self, Tensor exponent).
        want = [(a.name, str(a.type)) for a in schema.arguments]
        same = getattr(packet, func._overloadname, None)
        cands = ([same] if same is not None else []) + [getattr(packet, ov) for ov in packet.overloads()]
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


# -- reading and writing tensor values ---------------------------------------


def base_value(st: Storage):
    """The logical value of a storage (padded device data is read through a slice)."""
    value = st.value
    if st.logical_shape is None or isinstance(value, LazyRef) or tuple(value.shape) == st.logical_shape:
        return value
    cache = st.unpadded
    if cache is not None and cache[0] == st.version:
        return cache[1]
    from spmdtorch.lazy import padding

    ref = record(
        padding.unpad,
        "unpad",
        ((Slot(0),), (("shape", st.logical_shape),)),
        [value],
        ((st.logical_shape, value.dtype),),
    )
    st.unpadded = (st.version, ref)
    return ref


def concrete_value(t: XlaTensor) -> jax.Array:
    """The computed array of ``t``: pending work is run (a sync), and a view's
    slice that no storage holds is evaluated on its own."""
    from spmdtorch.lazy import executor

    value = read_value(t)
    if isinstance(value, LazyRef):
        executor.sync()
        value = read_value(t)
        if isinstance(value, LazyRef):
            value = executor.evaluate(value)
    return value


def read_value(t: XlaTensor):
    """The current value of ``t``: concrete array or LazyRef (views replayed).

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
        value = _record_view_step(step, value)
    if st.vcache is None:
        st.vcache = {}
    st.vcache[chain] = value
    return value


def _record_view_step(step: ViewStep, value):
    # Every read of a view replays its chain (hundreds per step): what the
    # node needs besides its input is built once per ViewStep and reused
    # while the op's lowering stays the same one.
    low = _facts(step.op).lowering
    rp = step.replay
    if rp is None or rp[0] is not low:
        rp = step.replay = _view_replay(step, low)
    return record(rp[1], rp[2], rp[3], [value], rp[4], sig=rp[5])


def _view_replay(step: ViewStep, low) -> tuple:
    """``(lowering, fn, name, template, out_avals, sig)`` of ``step``'s replay node.

    For one output of a multi-output view (``split``) the node computes the
    op and keeps output ``out_index``, as ``record(..., out_index=)`` makes it.
    """
    if low is None:
        raise NotImplementedError(f"spmdtorch has no lowering for view op {step.op}")
    template = ((Slot(0),) + step.args, step.kwargs)
    if step.out_index is None:
        fn, name = low.fn, step.op
    else:
        fn, name = _Select(low.fn, step.out_index), (step.op, "select", step.out_index)
    return (low, fn, name, template, (step.aval,), keys.node_sig(name, template))


def assign_value(t: XlaTensor, value) -> None:
    """Make ``value`` (same shape, storage dtype) the new value of ``t``.

    Writes through a view become inverse view ops on the base, so every alias
    of the storage sees the change.
    """
    st = t._st
    if not t._chain:
        st.set(value)
        return
    from spmdtorch.ops import views

    bases = [base_value(st)]
    for step in t._chain[:-1]:
        bases.append(_record_view_step(step, bases[-1]))
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


# -- recording -----------------------------------------------------------------


def record(fn, name, template, inputs, out_avals, *, random=False, out_index=None, sig=None):
    """Record one node; return its LazyRef (or LazyRefs for several outputs).

    ``template`` is ``(args, kwargs_items)`` with ``Slot(i)`` for ``inputs[i]``.
    With ``out_index``, ``fn`` returns several values of which the node keeps
    only that one (a single output of a multi-output view like ``split``).
    ``sig``: the node's ``keys.node_sig`` when the caller has it cached (for
    the name the node ends up with: ``(name, "select", out_index)`` with
    ``out_index``); dropped when a rewrite or a keyed region changes the node.
    """
    if random:
        region = rng.active_region()
        if region is not None:  # checkpoint_module: a replayable key (lazy/rng.keyed_region)
            fn, name, template, inputs = region.keyed(fn, name, template, inputs)
            random = False
            sig = None
    if out_index is None and not random:
        # Peephole rewrites (spmdtorch.lazy.rewrite): one t(W) per parameter, products read through transposes.
        rule = _REWRITES.get(id(name))
        if rule is not None:
            folded = rule(name, template, inputs, out_avals)
            if folded is not None:
                return folded
    node = Node(fn, name, template, inputs, template, out_avals, random, sig)
    if out_index is not None:
        node.fn = _Select(fn, out_index)
        node.name = (name, "select", out_index)
    if len(out_avals) == 1:
        return LazyRef(node, 0)
    return [LazyRef(node, i) for i in range(len(out_avals))]


class _Select:
    """``fn(...)[index]`` as a picklable-ish callable with a stable identity."""

    __slots__ = ("fn", "index")

    def __init__(self, fn, index):
        self.fn = fn
        self.index = index

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)[self.index]


# -- argument classification -----------------------------------------------


def _check_other_tensor(a: torch.Tensor, func, allow_cpu: bool):
    if a.device.type == "cpu" and (a.dim() == 0 or allow_cpu):
        return
    if a.device.type == "meta":
        raise MetaFactoryLeak(
            f"Expected all tensors to be on the same device, but found at least two devices, xla:0 and meta! "
            f"(when checking arguments for {func}). A meta tensor has no data; if it was made inside a torch "
            "op on xla tensors, that op created it from the xla tensor's options (run the op under "
            "spmdtorch.tensor.dispatch.capture_meta_factories())."
        )
    raise DeviceMismatchError(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"xla:0 and {a.device}! (when checking arguments for {func})"
    )


class _Args:
    """One walk over (args, kwargs): template with Slots, dynamic inputs, meta key.

    The hot path of tracing (every recorded op): xla tensors, the common
    argument, are handled inline; everything else goes through ``_leaf``.
    """

    __slots__ = ("template", "inputs", "key", "metas")

    def __init__(self, func, facts, args, kwargs):
        inputs = self.inputs = []
        key = [facts]
        allow_cpu = facts.allow_cpu
        lift_pos = facts.lift_pos
        t_args = []
        for i, a in enumerate(args):
            if isinstance(a, XlaTensor):
                key.append(a._mk)  # (shape, stride, offset, dtype), stored when the tensor was made
                st = a._st
                inputs.append(st.value if not a._chain and st.logical_shape is None else read_value(a))
                n = len(inputs) - 1
                t_args.append(_SLOTS[n] if n < _N_SLOTS else Slot(n))
                continue
            t = type(a)
            if t is int or t is float:  # _leaf's rule for numbers, inline (optimizers pass hundreds)
                if i in lift_pos and _INT32[0] <= a <= _INT32[1] and a not in facts.static_scalars:
                    key.append(t)
                    inputs.append(interned_scalar(a, id(func)))
                    n = len(inputs) - 1
                    t_args.append(_SLOTS[n] if n < _N_SLOTS else Slot(n))
                else:
                    if t is float:  # 2.0 == 2 and -0.0 == 0.0 in the template: the key tells them apart
                        key.append(a.hex())
                    t_args.append(a)
            elif t is bool:
                key.append(bool)  # True == 1 in the template
                t_args.append(a)
            elif a is None:
                t_args.append(a)
            elif t is list and _all_ints(a):  # sizes and dims (view, sum, _unsafe_view): static, no slots
                t_args.append(tuple(a))
            else:
                t_args.append(self._leaf(a, i in lift_pos, key, func, allow_cpu))
        if kwargs:
            lift_names = facts.lift_names
            t_kwargs = tuple((k, self._leaf(a, k in lift_names, key, func, allow_cpu)) for k, a in kwargs.items())
        else:
            t_kwargs = ()
        self.template = (tuple(t_args), t_kwargs)
        key.append(self.template)
        self.key = tuple(key)

    def _leaf(self, a, liftable, key, func, allow_cpu):
        if isinstance(a, XlaTensor):
            key.append(a._mk)
            self.inputs.append(read_value(a))
            return Slot(len(self.inputs) - 1)
        if isinstance(a, torch.Tensor):
            _check_other_tensor(a, func, allow_cpu)
            if a.dim() == 0 and not allow_cpu:
                key.append(("cpu0", a.dtype))
                self.inputs.append(Scalar(a.item()))
            else:
                key.append(("cpu", tuple(a.shape), a.dtype))
                from spmdtorch.tensor import transfer

                self.inputs.append(transfer.to_device_array(a))
            return Slot(len(self.inputs) - 1)
        if isinstance(a, (list, tuple)):
            return tuple(self._leaf(x, False, key, func, allow_cpu) for x in a)
        if (
            liftable
            and type(a) in (float, int)
            and _INT32[0] <= a <= _INT32[1]
            and a not in _facts(func).static_scalars
        ):
            key.append(type(a))
            self.inputs.append(interned_scalar(a, id(func)))  # equal numbers: one program input
            return Slot(len(self.inputs) - 1)
        if type(a) is float or type(a) is bool:  # see __init__: 2.0 == 2 == True, -0.0 == 0.0
            key.append((type(a), a.hex() if type(a) is float else a))
        return a


def _all_ints(seq) -> bool:
    """Every element is a plain ``int`` (what ``_Args._leaf`` would keep as is, one call each)."""
    for x in seq:
        if type(x) is not int:
            return False
    return True


# Interned slots for the inline path of _Args (Slot(i) is always the same object).
_N_SLOTS = 64
Slot(_N_SLOTS - 1)
_SLOTS = [Slot(i) for i in range(_N_SLOTS)]


# Ops that, like on CUDA, accept CPU index tensors next to device tensors.
_CPU_OK_OPS = frozenset(
    op
    for name in ("index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default")
    for op in registry.resolve_ops(name)
)


# -- meta (shape inference) ------------------------------------------------------

# Output specs by argument signature. Bounded: a program whose static
# arguments never repeat (a loop over slice offsets) must not grow it forever.
META_CACHE_MAX = 1 << 14
_META_CACHE = keys.BoundedCache(META_CACHE_MAX)
keys.ENGINE.register_cache("tensor.dispatch.meta_cache", _META_CACHE)


def _run_meta(func, args, kwargs, facts):
    meta_kwargs = kwargs
    if facts.has_device and kwargs.get("device") is not None:
        meta_kwargs = dict(kwargs, device="meta")
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in meta_kwargs.items()}
    _MetaFlag.active = True
    try:
        with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
            return func(*meta_args, **meta_kwargs)
    finally:
        _MetaFlag.active = False


def _to_meta(a):
    if isinstance(a, XlaTensor):
        return a
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_to_meta(x) for x in a)
    return a


class MetaSpec:
    """What torch's meta kernel says about an op's outputs, precomputed once.

    Attributes:
        specs: per output ``(shape, stride, offset, dtype, contiguous_stride)``
            or None for a non-tensor output.
        multi: the op returns a tuple/list.
        avals: ``((shape, jax dtype), ...)`` of the tensor outputs.
    """

    __slots__ = ("specs", "multi", "avals", "sig", "steps", "twin", "dense_mks", "view_mks")

    def __init__(self, specs, multi):
        self.specs = specs
        self.multi = multi
        self.avals = tuple((sp[0], _dtypes.to_jax_dtype(sp[3])) for sp in specs if sp is not None)
        # Each output's ``XlaTensor._mk``, made once: as a fresh contiguous
        # tensor (a lowered op's result) and as the view the spec describes.
        self.dense_mks = tuple(None if sp is None else (sp[0], sp[4], 0, sp[3]) for sp in specs)
        self.view_mks = tuple(None if sp is None else sp[:4] for sp in specs)
        # Filled by the first caller, valid for every hit (the cache key holds
        # the op and its template): the node signature of a lowered op, the
        # ViewSteps of a view op, the functional twin's MetaSpec of an
        # in-place op (False: the in-place fast path does not apply).
        self.sig = None
        self.steps = None
        self.twin = None


def _tensor_spec(o):
    shape = tuple(o.shape)
    return (shape, tuple(o.stride()), o.storage_offset(), o.dtype, _contiguous_strides(shape))


def _meta_spec(out) -> MetaSpec | None:
    if isinstance(out, torch.Tensor):
        return MetaSpec((_tensor_spec(out),), False)
    if isinstance(out, (tuple, list)):
        return MetaSpec(tuple(_tensor_spec(o) if isinstance(o, torch.Tensor) else None for o in out), True)
    return None


def meta_outputs(func, args, kwargs, facts, key):
    hit = _META_CACHE.get(key)
    if hit is not None:
        _COUNTERS["MetaCacheHit"] += 1
        return hit
    return _meta_miss(func, args, kwargs, facts, key)


def _meta_miss(func, args, kwargs, facts, key):
    """``meta_outputs`` after a cache miss (the hot paths look the cache up inline)."""
    out = _run_meta(func, args, kwargs, facts)
    spec = _meta_spec(out)
    if spec is None:
        raise NotImplementedError(f"{func} returned a non-tensor on meta; spmdtorch cannot record it")
    try:
        _META_CACHE.put(key, spec)
    except TypeError:  # an unhashable static argument: just don't cache
        pass
    return spec


# -- the dispatcher --------------------------------------------------------------


_CLONE = aten.clone.default
_AS_STRIDED = aten.as_strided.default

# id(OpOverload) -> OpFacts. OpOverload.__hash__ is Python-level, and the hot
# path looks an op up once per call: an int key keeps that lookup cheap (ops
# are long-lived singletons, so their ids are stable).
_FACTS_BY_ID: dict = {}


def reset_op_facts() -> None:
    """Forget every op's cached facts (after changing the lowering or decomposition tables)."""
    op_facts.cache_clear()
    _FACTS_BY_ID.clear()


keys.ENGINE.register_cache("tensor.dispatch.op_facts", reset_op_facts, size=lambda: len(_FACTS_BY_ID))


def _facts(func) -> OpFacts:
    """``func``'s facts, route included (``dispatch`` inlines this lookup)."""
    return _FACTS_BY_ID.get(id(func)) or _facts_with_route(func)


def _facts_with_route(func) -> OpFacts:
    facts = op_facts(func)
    special = _SPECIAL.get(func)
    if special is not None:
        facts.route = special
    elif func._schema.name.startswith("aten::_foreach_"):
        facts.route = _foreach
    elif func in _DATA_DEPENDENT:
        facts.route = cpu_fallback
    elif func in _INDEX_OPS:
        facts.route = _dispatch_index
    elif func in _PREFER_DECOMPOSITION:
        facts.route = _decompose_batch_norm
    else:
        facts.route = None
    _FACTS_BY_ID[id(func)] = facts
    return facts


_COUNTERS = metrics.counters  # one object for the process (metrics.reset clears it in place)


def dispatch(func, args, kwargs):
    _COUNTERS["DispatchedOps"] += 1
    facts = _FACTS_BY_ID.get(id(func)) or _facts_with_route(func)
    if facts.route is not None:
        return facts.route(func, args, kwargs)
    if facts.implicit:
        out = func.decompose(*args, **kwargs)
        if out is not NotImplemented:
            return out
    if facts.is_view:
        return _dispatch_view(func, args, kwargs, facts)
    if facts.mutable_pos and facts.lowering is None:
        return _dispatch_mutation(func, args, kwargs, facts)
    if facts.lowering is not None:
        return _dispatch_lowering(func, args, kwargs, facts)
    return _decompose(func, args, kwargs)


def _dispatch_index(func, args, kwargs):
    """index/index_put: boolean masks make the shape data-dependent."""
    if _has_bool_index(func, args):
        return cpu_fallback(func, args, kwargs)
    facts = op_facts(func)
    if facts.mutable_pos and facts.lowering is None:
        return _dispatch_mutation(func, args, kwargs, facts)
    return _dispatch_lowering(func, args, kwargs, facts)


def _decompose(func, args, kwargs):
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


def _dispatch_lowering(func, args, kwargs, facts):
    low = facts.lowering
    if low.random and kwargs.get("generator") is not None:
        rng.check_generator(func, kwargs["generator"])  # raises: xla draws use the default generator
    parsed = _Args(func, facts, args, kwargs)
    meta = _META_CACHE.get(parsed.key)  # meta_outputs' hit path, inline (one call less per op)
    if meta is None:
        meta = _meta_miss(func, args, kwargs, facts, parsed.key)
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


def _dispatch_view(func, args, kwargs, facts):
    self = args[0]
    if not isinstance(self, XlaTensor):
        raise DeviceMismatchError(f"view op {func} got a {type(self).__name__} on {self.device} as self")
    mk = self._mk
    if facts.identity_view:
        return view_tensor(self._st, self._chain, mk)
    statics = _view_statics(args)
    kw = tuple(sorted([(k, _static(v)) for k, v in kwargs.items()])) if kwargs else ()
    key = (facts, mk, statics, kw)
    meta = _META_CACHE.get(key)
    if meta is None:
        meta = _meta_miss(func, args, kwargs, facts, key)
    else:
        _COUNTERS["MetaCacheHit"] += 1
    specs, multi = meta.specs, meta.multi
    # ViewSteps are immutable and the key fixes every field: one set per key
    # (which also keeps each step's node signature across calls).
    steps = meta.steps
    if steps is None:
        steps = meta.steps = tuple(
            ViewStep(func, statics, kw, i if multi else None, (s[0], _dtypes.to_jax_dtype(s[3])))
            for i, s in enumerate(specs)
        )
    if func is _AS_STRIDED:
        # as_strided addresses the *storage*, not the input view.
        chain_base = ()
    else:
        chain_base = self._chain
    if not multi:
        return view_tensor(self._st, chain_base + steps, meta.view_mks[0])
    return [view_tensor(self._st, chain_base + (step,), mk) for step, mk in zip(steps, meta.view_mks)]


def _view_statics(args) -> tuple:
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
    return tuple([tuple(a) if type(a) is list and _all_ints(a) else _static(a) for a in rest])


def _static(a):
    t = type(a)
    if t is int or t is bool or a is None:  # the common case (dims, sizes), checked first
        return a
    if isinstance(a, torch.Tensor):
        raise NotImplementedError("view ops with tensor arguments are not supported")
    if isinstance(a, list):
        return tuple([_static(x) for x in a])
    return a


# Ops that update some arguments as a side effect (batch norm's running
# statistics; ``native_batch_norm`` does so without saying it in its schema).
# torch's decompositions express the update as a functional op plus copy_,
# which the engine writes back like any in-place op.
_PREFER_DECOMPOSITION = frozenset(
    op
    for n in ("native_batch_norm.default", "_native_batch_norm_legit.default", "_batch_norm_with_update.default")
    for op in registry.resolve_ops(n)
)


def _decompose_batch_norm(func, args, kwargs):
    """torch's decomposition, with eager CPU's eval-mode outputs: empty
    ``save_mean``/``save_invstd`` (the decomposition returns per-channel ones
    off CPU, as CUDA does; backward in eval mode reads the running stats)."""
    out = _decompose(func, args, kwargs)
    names = op_facts(func).arg_names
    if "training" not in names:  # _batch_norm_with_update always trains
        return out
    i = names.index("training")
    training = args[i] if i < len(args) else kwargs.get("training")
    if training or not isinstance(out, (tuple, list)) or len(out) != 3:
        return out
    empty = [dispatch(aten.empty.memory_format, ([0],), {"dtype": o.dtype, "device": XLA_DEVICE}) for o in out[1:]]
    return (out[0], *empty)


_IDENTITY_VIEWS = frozenset(
    op for n in ("alias.default", "detach.default", "lift_fresh.default") for op in registry.resolve_ops(n)
)


def _inplace_twin_spec(func, twin, args, kwargs, parsed):
    """``(lowering, MetaSpec)`` of ``twin`` for an in-place call, or False.

    Valid for every call with the same meta key (the key fixes the shapes,
    dtypes and template the answer depends on). False when the general path
    is needed: the twin is not a plain lowered op, it parses its arguments
    differently (another set of liftable scalars), draws random numbers, or
    its result needs a cast or broadcast before it can be written into self.
    """
    facts = op_facts(func)
    tf = _facts(twin)
    low = tf.lowering
    if (
        low is None
        or low.random
        or tf.route is not None
        or tf.is_view
        or tf.mutable_pos
        or tf.lift_pos != facts.lift_pos
        or tf.lift_names != facts.lift_names
        or tf.allow_cpu != facts.allow_cpu
    ):
        return False
    spec = meta_outputs(twin, args, kwargs, tf, (tf,) + parsed.key[1:])
    self = args[0]
    if spec.multi or spec.specs[0][0] != tuple(self.shape) or spec.specs[0][3] != self.dtype:
        return False
    if spec.sig is None:
        spec.sig = keys.node_sig(twin, parsed.template)
    return low, spec


def _dispatch_mutation(func, args, kwargs, facts):
    """``add_``/``out=``: run the functional twin and write its results back."""
    twin = facts.twin
    if twin is _UNSET:
        twin = facts.twin = functional_twin(func)
    if twin is None:
        return _decompose(func, args, kwargs)
    if facts.is_inplace:
        self = args[0]
        if not isinstance(self, XlaTensor):
            raise DeviceMismatchError(f"in-place {func} on a tensor on {self.device} with xla arguments")
        # torch's checks (broadcast into self, dtype castability) via meta.
        parsed = _Args(func, facts, args, kwargs)
        meta = meta_outputs(func, args, kwargs, facts, parsed.key)
        tw = meta.twin
        if tw is None:
            tw = meta.twin = _inplace_twin_spec(func, twin, args, kwargs, parsed)
        if tw is not False:
            # The twin's node on the same template and inputs becomes self's
            # value directly: no result tensor to wrap, no second argument walk.
            ref = record(tw[0].fn, twin, parsed.template, parsed.inputs, tw[1].avals, sig=tw[1].sig)
            assign_value(self, ref)
            return self
        result = dispatch(twin, args, kwargs)
        _write(self, result)
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
            with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
                torch.ops.aten.resize_.default(o, list(r.shape))
            forget_meta_key(o)
        _write(o, r)
    return outs[0] if len(outs) == 1 else tuple(outs)


def _write(dst: XlaTensor, src: XlaTensor, *, fresh: bool = False) -> None:
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


# -- special ops -------------------------------------------------------------------


def _copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if not isinstance(dst, XlaTensor):
        # xla → cpu (or another device): materialise then let torch copy.
        from spmdtorch.tensor import transfer

        dst.copy_(transfer.to_cpu(src))
        return dst
    if not isinstance(src, XlaTensor):
        if src.device.type == "meta":
            raise MetaFactoryLeak(f"copy_ from a tensor on meta (it has no data) into an xla tensor {tuple(dst.shape)}")
        if src.device.type != "cpu":
            raise DeviceMismatchError(f"copy_ from a tensor on {src.device} into an xla tensor")
        from spmdtorch.tensor import transfer

        src = new_base(transfer.to_device_array(src), src.dtype)
    _write(dst, src, fresh=True)
    return dst


def _to_copy(func, args, kwargs):
    x = args[0]
    device = kwargs.get("device")
    # C++ code sees an XlaTensor's storage device (meta): ``x.to(dtype)``
    # inside a composite op (softmax with dtype=) asks for a copy on meta,
    # which means "stay where you are". A meta tensor holds no data, so no
    # caller can want the xla value moved there.
    if device is not None and torch.device(device).type not in ("xla", "meta"):
        from spmdtorch.tensor import transfer

        out = transfer.to_cpu(x)
        dtype = kwargs.get("dtype")
        if dtype is not None and dtype != out.dtype:
            out = out.to(dtype)
        if torch.device(device).type != "cpu":
            out = out.to(device)
        return out
    kwargs = {k: v for k, v in kwargs.items() if k in ("dtype",) and v is not None}
    facts = op_facts(func)
    return _dispatch_lowering(func, (x,), kwargs, facts)


def _local_scalar_dense(func, args, kwargs):
    from spmdtorch.tensor import transfer

    metrics.inc("aten::_local_scalar_dense")
    return transfer.to_cpu(args[0]).item()


def _metadata_inplace_view(func, args, kwargs):
    """``t_``, ``transpose_``, ``squeeze_``...: self becomes a view of itself."""
    self = args[0]
    view = dispatch(_view_twin(func), args, kwargs)
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
        torch.ops.aten.as_strided_.default(self, list(view.shape), list(view.stride()), view.storage_offset())
    forget_meta_key(self)
    self._chain = view._chain
    return self


@functools.cache
def _view_twin(func):
    """``transpose_.default`` → ``transpose.int``: the out-of-place view op with
    the same arguments (overload names differ between the two packets)."""
    name = func._schema.name.split("::")[-1][:-1]
    packet = getattr(aten, name)
    same = getattr(packet, func._overloadname, None)
    if same is not None:
        return same
    want = [(a.name, str(a.type)) for a in func._schema.arguments]
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
            return cand
    raise NotImplementedError(f"{func}: no view op {name} with the same arguments")


def _set_(func, args, kwargs):
    self = args[0]
    if len(args) < 2 or not isinstance(args[1], XlaTensor):
        raise NotImplementedError(f"{func} is only supported with another xla tensor as source")
    src = args[1]
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
        torch.ops.aten.as_strided_.default(self, list(src.shape), list(src.stride()), src.storage_offset())
    forget_meta_key(self)
    self._st = src._st
    self._chain = src._chain
    return self


def _resize_(func, args, kwargs):
    self, size = args[0], list(args[1])
    if list(self.shape) == size:
        return self
    if self._chain:
        raise RuntimeError("resize_ of a view is not supported on xla tensors")
    with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
        torch.ops.aten.resize_.default(self, size)
    forget_meta_key(self)
    fresh = dispatch(aten.empty.memory_format, (size,), {"dtype": self.dtype, "device": torch.device("xla")})
    self._st = fresh._st
    return self


class ForeachError(RuntimeError):
    """A ``_foreach_*`` call whose tensor lists do not line up."""


# Foreach ops whose per-tensor op has another name (torch's own slow path
# computes ``_foreach_maximum(l, 0.5)`` with ``clamp_min``).
_FOREACH_ALIASES = {"maximum": ("maximum", "clamp_min"), "minimum": ("minimum", "clamp_max")}


def _match_overload(packet, want):
    """The overload of ``packet`` whose leading argument types are ``want`` (fewest extra defaults)."""
    best = None
    for ov in packet.overloads():
        cand = getattr(packet, ov)
        cargs = cand._schema.arguments
        if any(c.kwarg_only and c.alias_info is not None and c.alias_info.is_write for c in cargs):
            continue  # an out= variant
        if len(cargs) < len(want) or any(str(c.type) != w[0] for c, w in zip(cargs, want)):
            continue
        if not all(c.has_default_value() for c in cargs[len(want) :]):
            continue
        if best is None or len(cargs) < len(best._schema.arguments):
            best = cand
    return best


@functools.cache
def _foreach_plan(func):
    """How ``_foreach_X`` maps onto the per-tensor op ``X``, or None if it cannot.

    The per-tensor overload is found by argument *types* (the names differ:
    ``_foreach_add_.Scalar(self, scalar)`` is ``add_.Scalar(self, other,
    alpha=1)``; ``_foreach_pow.ScalarAndTensor`` is ``pow.Scalar``): each
    ``List[T]`` argument becomes a ``T`` and ``.Tensor`` overloads' ``scalars``
    tensor (one number per list element) becomes a number. An in-place
    foreach op with no in-place per-tensor op (``maximum_``) runs the
    functional one and writes the result back.

    Returns:
        ``(op, specs, inplace, write_back)`` where ``specs[i]`` is
        ``(kind, kwarg)`` for foreach argument ``i``: kind 0 passes it to
        every call, 1 passes element ``j`` of the list, 2 element ``j`` of a
        tensor of scalars; ``kwarg`` is the per-tensor op's keyword for it
        (None: positional).
    """
    schema = func._schema
    if func._schema.name == "aten::_foreach_norm" and func._overloadname == "Scalar":
        # (self, ord=2, dtype=None): torch's slow path is linalg_vector_norm per tensor.
        return aten.linalg_vector_norm.default, ((1, None), (0, None), (0, "dtype")), False, False
    name = schema.name.split("::")[-1][len("_foreach_") :]
    inplace = not schema.returns
    base = name[:-1] if inplace else name
    want = []
    for a in schema.arguments:
        t = str(a.type)
        if t.startswith("List[") and t.endswith("]"):
            want.append((t[5:-1], 1))
        elif t == "Tensor" and a.name == "scalars":
            want.append(("number", 2))
        else:
            want.append((t, 0))
    for write_back in (False, True) if inplace else (False,):
        for pname in _FOREACH_ALIASES.get(base, (base,)):
            packet = getattr(aten, pname + ("_" if inplace and not write_back else ""), None)
            best = None if packet is None else _match_overload(packet, want)
            if best is not None:
                cargs = best._schema.arguments
                specs = tuple((w[1], c.name if c.kwarg_only else None) for w, c in zip(want, cargs))
                return best, specs, inplace, write_back
    return None


def _foreach(func, args, kwargs):
    """``_foreach_X(lists, ...)`` → ``X`` once per list element.

    Each element op goes straight to ``dispatch`` (this already runs below
    autograd), not through the torch dispatcher again: an optimizer's foreach
    step is hundreds of element ops. Ops with no per-tensor twin use torch's
    decomposition.
    """
    plan = _foreach_plan(func)
    if plan is None:
        return _decompose(func, args, kwargs)
    op, specs, inplace, write_back = plan
    fargs = op_facts(func).arg_names
    given = []  # (kind, kwarg, value) of each argument passed
    n = None
    for i, spec in enumerate(specs):
        if i < len(args):
            v = args[i]
        elif fargs[i] in kwargs:
            v = kwargs[fargs[i]]
        else:
            continue  # left to the per-tensor op's default
        kind = spec[0]
        if kind == 2:
            v = v.tolist()  # a host tensor of scalars (torch's slow path reads them the same way)
        if kind:
            if n is None:
                n = len(v)
            elif len(v) != n:
                raise ForeachError(
                    f"{func}: all tensor and scalar lists must have the same length, got {n} and {len(v)} "
                    f"(argument {fargs[i]!r})"
                )
        given.append((kind, spec[1], v))
    results = []
    for j in range(n or 0):
        pos = []
        kw = {}
        for kind, kwarg, v in given:
            e = v[j] if kind else v
            if kwarg is None:
                pos.append(e)
            else:
                kw[kwarg] = e
        out = dispatch(op, tuple(pos), kw)
        if write_back:
            _write(pos[0], out)
        results.append(out)
    return None if inplace else results


def _equal(func, args, kwargs):
    """``torch.equal``: a Python bool, so the comparison is computed now."""
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    return bool(
        _local_scalar_dense(None, (dispatch(aten.all.default, (dispatch(aten.eq.Tensor, (a, b), {}),), {}),), {})
    )


def _allclose(func, args, kwargs):
    """``torch.allclose``: a Python bool, computed now through ``isclose``."""
    close = dispatch(aten.isclose.default, args, kwargs)
    return bool(_local_scalar_dense(None, (dispatch(aten.all.default, (close,), {}),), {}))


def _linalg_check_errors(func, args, kwargs):
    """torch.linalg's ``check_errors``: skipped, as PyTorch/XLA does, because
    raising needs the ``info`` values on the host (a sync per call, and
    impossible inside ``spmdtorch.compile``); a failed factorization shows as
    inf/nan in its results instead."""
    return None


def _linalg_det_factors(func, args, kwargs):
    """``_linalg_det``/``_linalg_slogdet``: return the LU factors torch's backward expects.

    torch factors ``A^T`` when A is contiguous and real (LAPACK is
    column-major; det(A^T) = det(A)) and ``A`` itself otherwise, and its
    backward picks the solve from the saved A's strides. The lowering sees
    values only and always factors the transpose of what it is given, so a
    non-contiguous real A (a transposed view...) is handed over as the
    contiguous ``A^T``: the same determinant, and the factors of A.
    """
    A = args[0]
    if not A.is_complex() and not A.is_contiguous():
        args = (A.mT.contiguous(),) + tuple(args[1:])
    return _dispatch_lowering(func, args, kwargs, op_facts(func))


_SPECIAL: dict = {}
for _name, _fn in [
    ("_linalg_det.default", _linalg_det_factors),
    ("_linalg_slogdet.default", _linalg_det_factors),
    ("_linalg_check_errors.default", _linalg_check_errors),
    ("equal.default", _equal),
    ("allclose.default", _allclose),
    ("copy_.default", _copy_),
    ("_to_copy.default", _to_copy),
    ("_local_scalar_dense.default", _local_scalar_dense),
    ("set_.source_Tensor", _set_),
    ("resize_.default", _resize_),
]:
    for _op in registry.resolve_ops(_name):
        _SPECIAL[_op] = _fn
for _name in ("t_", "transpose_", "squeeze_", "unsqueeze_", "swapdims_", "swapaxes_", "as_strided_"):
    for _op in registry.resolve_ops(_name):
        _SPECIAL[_op] = _metadata_inplace_view
# (``_facts_with_route`` sends every ``aten::_foreach_*`` overload to ``_foreach``:
# ``dir(aten)`` lists only the packets loaded so far, so it cannot enumerate them.)


# -- data-dependent ops: materialise and carry on -------------------------------------

_DATA_DEPENDENT = frozenset(
    op
    for n in (
        "nonzero",
        "nonzero_numpy",
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "unique_dim_consecutive",
        "repeat_interleave.Tensor",
        "bincount",
        "histc",
        "nonzero_static",
        # histograms: bin edges and counts come from a data pass; the CPU
        # kernels are what torch_xla falls back to as well
        "histogram",
        "_histogramdd_bin_edges",
        "_histogramdd_from_bin_cts",
        "_histogramdd_from_bin_tensors",
        # no meta kernel in torch, so no output shapes to record a node with
        "geqrf",
        "linalg_lstsq",
    )
    for op in registry.resolve_ops(n)
)
_INDEX_OPS = frozenset(
    op
    for n in ("index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default")
    for op in registry.resolve_ops(n)
)


def _has_bool_index(func, args) -> bool:
    if func not in _INDEX_OPS:
        return False
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ()))


def cpu_fallback(func, args, kwargs):
    """Run ``func`` on CPU copies and bring the results back (data-dependent shapes).

    Counted as ``aten::<op>`` in the metrics, like PyTorch/XLA's CPU fallback.
    """
    from spmdtorch.lazy import contract
    from spmdtorch.tensor import transfer

    contract.check_not_tracing(f"runs the data-dependent op {func}")
    metrics.inc(f"aten::{func._schema.name.split('::')[-1]}")

    def to_cpu(a):
        if isinstance(a, XlaTensor):
            return transfer.to_cpu(a)
        if isinstance(a, (list, tuple)):
            return type(a)(to_cpu(x) for x in a)
        return a

    cpu_args = [to_cpu(a) for a in args]
    cpu_kwargs = {k: to_cpu(v) for k, v in kwargs.items()}
    if "device" in cpu_kwargs and cpu_kwargs["device"] is not None:
        cpu_kwargs["device"] = torch.device("cpu")
    out = func(*cpu_args, **cpu_kwargs)
    facts = op_facts(func)
    # Mutated arguments: write the CPU result back into the xla tensor.
    for i in facts.mutable_pos:
        orig = args[i] if i < len(args) else kwargs.get(facts.arg_names[i])
        new = cpu_args[i] if i < len(args) else cpu_kwargs.get(facts.arg_names[i])
        if isinstance(orig, XlaTensor):
            _copy_(None, (orig, new), {})

    def back(o):
        if isinstance(o, torch.Tensor):
            for i in facts.mutable_pos:
                if i < len(args) and o is cpu_args[i]:
                    return args[i]
            return new_base(transfer.to_device_array(o), o.dtype)
        if isinstance(o, (list, tuple)):
            return type(o)(back(x) for x in o)
        return o

    return back(out)


# -- factories inside C++ composite ops ----------------------------------------------

# Top-level torch functions known to build helper tensors from an xla tensor's
# options (so on meta); the device mode runs them under capture_meta_factories
# straight away instead of failing first.
CAPTURE_FUNCS: set = set()


def _has_tensor(args, kwargs) -> bool:
    for a in itertools.chain(args, kwargs.values()):
        if isinstance(a, torch.Tensor):
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return True
    return False


class _MetaFactoriesToXla(TorchDispatchMode):
    """Factories asked for on ``meta`` (with no tensor arguments) create xla tensors."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch otherwise wraps __torch_dispatch__ in torch._dynamo.disable,
        # whose eval-frame bookkeeping costs about a microsecond per op; every
        # backward op runs through this mode, and no TorchDynamo ever traces
        # xla tensors (XlaTensor.__tensor_unflatten__ refuses).
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None:
            if torch.device(device).type == "meta":
                if not _has_tensor(args, kwargs):
                    kwargs = dict(kwargs, device=XLA_DEVICE)
                elif func is aten._to_copy.default and args[0].device.type == "cpu":
                    # Host data sent to "self's device" (index lists in x[[0, 2]]).
                    from spmdtorch.tensor import transfer

                    src = args[0] if kwargs.get("dtype") is None else args[0].to(kwargs["dtype"])
                    return new_base(transfer.to_device_array(src), src.dtype)
            return func(*args, **kwargs)
        for a in args:
            if isinstance(a, XlaTensor):
                # What XlaTensor.__torch_dispatch__ would do, minus a second
                # trip through the dispatcher (backward passes run here).
                return dispatch(func, args, kwargs)
        return func(*args, **kwargs)


def capture_meta_factories():
    """Context manager: factory ops on ``meta`` create xla tensors instead.

    Only for running one torch call on xla tensors whose C++ implementation
    makes helper tensors from the inputs' options (whose device is meta):
    every op in it pays one extra Python hop.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.tensor.dispatch import capture_meta_factories
        >>> x = torch.ones(3, 2, device="xla")
        >>> with capture_meta_factories():
        ...     c = torch.cov(x)
        >>> c.device.type
        'xla'
    """
    return _MetaFactoriesToXla()


# -- factories on the XLA dispatch key -------------------------------------------------


def factory_kernel(func):
    """Kernel for ``torch.<factory>(..., device="xla")`` registered on the XLA key."""

    def kernel(*args, **kwargs):
        facts = op_facts(func)
        if facts.lowering is None:
            raise NotImplementedError(f"spmdtorch has no lowering for factory {func}")
        return _dispatch_lowering(func, args, kwargs, facts)

    return kernel


def wrap_jax_array(arr: jax.Array, dtype: torch.dtype | None = None, requires_grad: bool = False) -> XlaTensor:
    """Wrap a concrete JAX array as an XlaTensor (the array is owned, not copied)."""
    if dtype is None:
        dtype = _dtypes.to_torch_dtype(arr.dtype)
    return new_base(arr, dtype, requires_grad=requires_grad)


# XlaTensor.__torch_dispatch__ calls this module's dispatch without an import per call.
xla_tensor._DISPATCH[0] = dispatch
