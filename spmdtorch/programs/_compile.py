"""``spmdtorch.compile``: trace a step function, then replay it without Python.

How it works. A call is *traced* by running ``fn`` in lazy mode and syncing at
its end; the sync's plan says exactly which inputs the program read (argument
tensors, pre-existing storages such as parameters and optimizer state, frozen
Python scalars) and which storages it wrote (parameters updated in place,
new gradients and optimizer state, the returned tensors). Once two consecutive
traces for the same input signature record the *same* program with the same
roles and the same frozen scalars, the function is *stable*: later calls skip
Python entirely and call the compiled executable with the current values of
those inputs, writing the outputs back to the same storages.

The contract is ``jax.jit``'s: Python control flow in ``fn`` must not depend on
tensor values (``.item()``, ``bool(t)``, ``print(t)`` inside ``fn`` raise
``CompileContractError``), and Python values computed outside tensors are
frozen at trace time. What torch code commonly switches between calls is
guarded so that it never gives silently stale results: torch optimizers run
with ``capturable=True`` (their step counters live on the device), the float
hyper-parameters of torch's optimizers that a scheduler changes (``lr``,
``betas``, ``momentum``...) are program inputs computed from ``param_groups``
at each replay (``_hparam_inputs``) while any other hyper-parameter change
re-traces, grad mode,
autocast and matmul precision are part of the input signature, and each
program is kept with the plain attributes of the modules ``fn`` called
(``training`` among them), the ``requires_grad`` of their parameters and their
hooks (``model.eval()`` between calls replays the program traced in eval mode,
or traces one; so does freezing a layer, adding a hook or setting
``module.scale = 0.5``). Results carry no autograd history, on a traced call as
on a replay.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import logging
import threading
import warnings
import weakref
from typing import Any, NamedTuple, cast

import jax
import numpy as np
import torch
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from spmdtorch import config
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import (
    TRACE_HOOK,
    CompileCache,
    Storage,
    caches,
    executor,
    holders_of,
    metrics,
    padding,
    paused_gc,
    precision,
    profiling,
    rng,
)
from spmdtorch.lazy.contract import CompileContractError, TraceState, begin_trace, end_trace, tracing
from spmdtorch.lazy.graph import LazyRef, Scalar
from spmdtorch.lazy.trace_records import (
    AliasResult,
    ArgInput,
    ArgResult,
    ConstInput,
    ConstResult,
    FreshOutput,
    FreshResult,
    InputRole,
    OutputTarget,
    ResultRecipe,
    ScalarInput,
    StorageInput,
    StorageOutput,
    TensorMeta,
    ValueResult,
)
from spmdtorch.programs import _guards
from spmdtorch.programs import _hparam_inputs as _hp
from spmdtorch.tensor import storage_of, view_chain
from spmdtorch.tensor.device_mode import to_xla
from spmdtorch.tensor.dispatch import read_value
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["compile", "CompiledArgumentTypeError", "CompiledFunction", "CompileContractError", "tracing"]

# Consecutive identical traces required before replay. Two: the first call of a
# training step usually creates optimizer state, the second shows the steady step.
_STABLE_AFTER = 2

_log = logging.getLogger("spmdtorch.compile")


_TraceState = TraceState


def _storage_hook(st, old):
    if not _TraceState.active:  # another thread's storage (trace state is per thread): not the trace's
        return
    if old is None:
        _TraceState.created.append(weakref.ref(st))
    elif not isinstance(old, LazyRef):
        entry = _TraceState.replaced.get(id(old))
        if entry is None:
            _TraceState.replaced[id(old)] = (old, st, [])
        else:
            entry[2].append(st)  # several storages held one array (equal values share a buffer)


class _HPRecording(threading.local):
    """This thread's recording of float hyperparameters for the trace under way (``_hparam_inputs``)."""

    current: _hp.Recording | None = None  # None: not recorded (no trace, or numbers baked into the program)


_HP_RECORDING = _HPRecording()


def _on_xla(p: torch.Tensor) -> bool:
    """``p`` is an xla tensor, or a tensor subclass that wraps xla tensors (a DTensor over an xla mesh)."""
    if isinstance(p, XlaTensor):
        return True
    if not is_traceable_wrapper_subclass(p):
        return False
    inner, _ = p.__tensor_flatten__()
    return any(isinstance(getattr(p, name), XlaTensor) for name in inner)


def _optimizer_pre_hook(optimizer, args, kwargs):
    """While tracing: make torch optimizers capturable, remember their hparams, record float ones."""
    if not _TraceState.active:
        return None
    for group in optimizer.param_groups:
        if not any(_on_xla(p) for p in group["params"]):
            continue
        if "capturable" in group and not group["capturable"]:
            group["capturable"] = True
            # Host step counters (state from a non-capturable step, or restored
            # into one) move to the device; equal ones share one array, as the
            # counters of a capturable step do, so that the program (and so its
            # numerics, bit for bit) is the one an uninterrupted run compiles.
            moved: dict[tuple[torch.dtype, float], torch.Tensor] = {}
            for p in group["params"]:
                state = optimizer.state.get(p)
                if state and isinstance(state.get("step"), torch.Tensor) and not isinstance(state["step"], XlaTensor):
                    step = state["step"]
                    first = moved.setdefault((step.dtype, float(step)), to_xla(step))
                    state["step"] = new_base(read_value(first), first.dtype)
    _TraceState.optimizers[id(optimizer)] = (weakref.ref(optimizer), _hparams(optimizer))
    recording = _HP_RECORDING.current
    if recording is not None and _hp.liftable(optimizer):
        # Taken after _hparams above (the plain values); _optimizer_post_hook
        # (or the trace's end, if step() raises) puts the plain values back.
        _hp.wrap_groups(optimizer, recording)
    return None


def _optimizer_post_hook(optimizer, args, kwargs):
    """While tracing: the param groups hold plain numbers again once ``step()`` returns."""
    recording = _HP_RECORDING.current
    if recording is not None:
        recording.restore()
    return None


def _collect_module(module, args):
    """Global forward pre-hook while tracing: note each module ``fn`` calls and its attributes then.

    spmdtorch's own per-call wrappers (``_guards.is_internal_module``) are
    left out: a new one each call would be a dead module at the next, and
    every replay would refuse the recording.
    """
    if id(module) not in _TraceState.modules and not _guards.is_internal_module(module):
        _TraceState.modules[id(module)] = (module, _guards.plain_attributes(module))


setattr(_collect_module, _guards.INTERNAL, True)  # not a user hook: recordings do not depend on it


def _pin_grad_shardings(made: frozenset) -> None:
    """Gradients the step made (``made``: storage ids) take their parameter's sharding.

    Without one, a gradient's sharding is XLA's choice, known only once the
    program is compiled; a recycled buffer (``executor.Recycled``) must have
    its sharding before. The parameter's is the one a gradient should have
    (it is what the update reads; ``plan.memory_plan`` counts gradients so)
    and what sharding propagation gives it anyway. Only the parameters of
    the optimizers this step runs, and only gradients whose array is the
    parameter's shape up to size-1 dimensions (``_base_sharding``).
    """
    for ref, _ in _TraceState.optimizers.values():
        opt = ref()
        if opt is None:
            continue
        for group in opt.param_groups:
            for p in group["params"]:
                g = p.grad
                if not (isinstance(g, XlaTensor) and isinstance(p, XlaTensor)) or id(storage_of(g)) not in made:
                    continue
                st = storage_of(g)
                if st.sharding is not None or view_chain(p) or storage_of(p).logical_shape is not None:
                    continue
                sharding = _base_sharding(g, storage_of(p).sharding)
                if sharding is not None and padding.padded_shape(tuple(st.value.shape), sharding) is None:
                    st.sharding = sharding


def _base_sharding(t: XlaTensor, sharding):
    """The sharding of ``t``'s storage array under which ``t`` has ``sharding`` (None: not known).

    Backward leaves most gradients as views of the array it computed: a
    linear weight's is ``t().t()`` of a product, a norm weight's a ``view``
    of a ``[1, 1, n]`` sum. Two such chains are understood: transposes that
    cancel out, and one reshape that only adds or drops size-1 dimensions.
    """
    if not isinstance(sharding, jax.sharding.NamedSharding) or t.storage_offset() != 0 or not t.is_contiguous():
        return None
    base = tuple(storage_of(t).value.shape)
    shape = tuple(t.shape)
    chain = view_chain(t)
    if all(step.op is torch.ops.aten.t.default for step in chain) and len(chain) % 2 == 0:
        return sharding if base == shape else None
    if len(chain) != 1 or chain[0].op not in (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default):
        return None
    if [d for d in base if d != 1] != [d for d in shape if d != 1]:
        return None
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
    if any(axes is not None for axes, d in zip(spec, shape) if d == 1):
        return None
    kept = iter(axes for axes, d in zip(spec, shape) if d != 1)
    return jax.sharding.NamedSharding(
        sharding.mesh, jax.sharding.PartitionSpec(*(None if d == 1 else next(kept) for d in base))
    )


def _is_floats(v) -> bool:
    """A float, or a tuple holding floats (and other plain numbers): what ``_hparam_inputs`` records."""
    if isinstance(v, tuple):
        return any(type(x) is float for x in v) and _is_number_or_numbers(v)
    return type(v) is float


def _is_number_or_numbers(v) -> bool:
    """A Python number, or a tuple of them (Adam's ``betas``), as an optimizer hyperparameter."""
    if isinstance(v, tuple):
        return bool(v) and all(_is_number_or_numbers(x) for x in v)
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _hparams(optimizer):
    out = []
    for group in optimizer.param_groups:
        items = []
        for k, v in sorted(group.items()):
            if k == "params":
                continue
            if isinstance(v, torch.Tensor):
                v = ("tensor", id(v))
            elif isinstance(v, (list, tuple)):
                v = tuple(("tensor", id(x)) if isinstance(x, torch.Tensor) else x for x in v)
            items.append((k, v))
        out.append(tuple(items))
    return tuple(out)


def _changed_floats(opt_id: int, before: tuple, now: tuple) -> set[tuple]:
    """The hyperparameter leaves (``_hparam_inputs``) holding a float in both ``before`` and ``now``, another one."""
    out: set[tuple] = set()
    if len(before) != len(now):
        return out
    for gi, (group_before, group_now) in enumerate(zip(before, now)):
        for (k, a), (k2, b) in zip(group_before, group_now):
            if k != k2:
                continue
            if type(a) is float and type(b) is float:
                if a.hex() != b.hex():
                    out.add(("hp", opt_id, gi, k, None))
            elif type(a) is tuple and type(b) is tuple and len(a) == len(b):
                for i, (x, y) in enumerate(zip(a, b)):
                    if type(x) is float and type(y) is float and x.hex() != y.hex():
                        out.add(("hp", opt_id, gi, k, i))
    return out


def _float_hparams_changed(optimizers: dict) -> bool:
    """Whether a torch optimizer a trace ran (``_Record.optimizers``) has float hyperparameters changed since."""
    for key, (ref, hp) in optimizers.items():
        opt = ref()
        if opt is not None and _hp.liftable(opt) and _changed_floats(key, hp, _hparams(opt)):
            return True
    return False


def _masked(hp: tuple, proven: frozenset, opt_id: int) -> tuple:
    """``hp`` (``_hparams``) with each proven float's value replaced by its type: what a replay compares."""
    out = []
    for gi, group in enumerate(hp):
        items = []
        for k, v in group:
            if type(v) is float and ("hp", opt_id, gi, k, None) in proven:
                v = float
            elif type(v) is tuple:
                v = tuple(
                    float if type(x) is float and ("hp", opt_id, gi, k, i) in proven else x for i, x in enumerate(v)
                )
            items.append((k, v))
        out.append(tuple(items))
    return tuple(out)


def _with_proven_hparams(record: _Record, last: _Record) -> _Record:
    """``record`` with the hyperparameters proven by it and ``last`` (the same trace) guarded by type only.

    Proven: a float whose value differs between the two traces, although
    they recorded the same program with the same recipes, which is only so
    if every number computed from it reached the program as a recipe input
    (``_hparam_inputs``); proofs of ``last`` carry over. Both traces must
    have recorded their hyperparameters; an escaped one is never proven.
    """
    if not (record.hp_recorded and last.hp_recorded):
        return record
    proven = set(last.hp_proven)
    for key, (_, hp) in record.optimizers.items():
        if key in last.optimizers:
            proven |= _changed_floats(key, last.optimizers[key][1], hp)
    proven -= record.hp_escaped | last.hp_escaped
    if not proven:
        return record
    frozen = frozenset(proven)
    masked = {key: _masked(hp, frozen, key) for key, (_, hp) in record.optimizers.items()}
    return dataclasses.replace(record, hp_proven=frozen, hp_masked=masked)


@functools.cache
def _install_optimizer_hook():
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_optimizer_pre_hook)
    register_optimizer_step_post_hook(_optimizer_post_hook)


_LEAF_TYPES = (int, float, bool, str, type(None))
_FLAT_SPECS = caches.bounded("lazy.compiled.flat_specs", maxsize=256)  # argument count -> TreeSpec


def _flatten(args, kwargs):
    """``(leaves, TreeSpec, key of the structure)`` of a call's arguments.

    The common call, ``step(x, y)`` with tensors or plain numbers, skips torch's
    pytree walk (a Python walk that costs as much as all the other guards together).
    """
    if not kwargs and all(isinstance(a, torch.Tensor) or type(a) in _LEAF_TYPES for a in args):
        n = len(args)
        spec = _FLAT_SPECS.get(n)
        if spec is None:
            spec = pytree.tree_flatten((tuple(range(n)), {}))[1]
            _FLAT_SPECS.put(n, spec)
        return list(args), spec, n
    flat, spec = pytree.tree_flatten((args, kwargs))
    return flat, spec, spec


# Where a signature's per-argument entries start: ``_signature``'s header is
# the arguments' structure, matmul precision, grad mode and autocast.
_SIG_ARGS = 4


def _signature(flat_args, spec):
    # torch's float32 matmul precision is built into the program (lazy/_precision.py),
    # and grad mode and autocast decide what torch code records. The header
    # is _SIG_ARGS entries long; one entry per argument leaf follows.
    autocast = torch.is_autocast_enabled("xla")
    sig: list[Any] = [
        spec,
        precision.current(),
        torch.is_grad_enabled(),
        torch.get_autocast_dtype("xla") if autocast else None,
    ]
    storages: list[Storage] = []
    for a in flat_args:
        if isinstance(a, XlaTensor):
            st = storage_of(a)
            alias = next((i for i, s in enumerate(storages) if s is st), -1)
            storages.append(st)
            base = st.value
            sig.append(
                (
                    "T",
                    a._mk,
                    a.requires_grad,
                    alias,  # _mk: (shape, stride, offset, dtype)
                    tuple(base.shape),
                    getattr(base, "sharding", None),
                    len(view_chain(a)),
                )
            )
        elif isinstance(a, torch.Tensor):
            sig.append(("cpu", tuple(a.shape), a.dtype))
        else:
            try:
                hash(a)
                # -0.0 == 0.0, but fn may branch on the sign (copysign, 1 / x).
                sig.append(("V", type(a), a.hex() if type(a) is float else a))
            except TypeError:
                sig.append(("R", type(a), repr(a)))
    return tuple(sig)


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    """What one trace computed: the program and the role of each input/output (``_make_record``).

    Attributes:
        prog: the program (``executor._Program``), or None when the trace computed nothing.
        plan_key: its ``executor.PlanKey`` (None without a program).
        leaf_roles: per program leaf, where it comes from on the next call.
        out_targets: per program output, where it goes.
        result_spec: the ``TreeSpec`` of the returned value.
        result_leaves: per leaf of the returned value, how to rebuild it.
        scalars: ``(type, value)`` of each frozen Python scalar.
        optimizers: ``id(optimizer)`` -> ``(weakref to it, its hyper-parameters)``.
        modes: per module fn called, its plain attributes (``training``
            among them), its own parameters' ``requires_grad`` and its hooks
            after the trace (a replay needs the same: ``model.eval()``, a
            layer frozen with ``requires_grad_(False)``, a hook added, an
            attribute such as ``self.scale`` changed, trace again).
        global_hooks: the global module hooks' handles after the trace.
        mutated: ``(module type, attribute names)`` of the called modules whose
            plain attributes ``fn`` changed while traced (a counter: then no
            trace repeats the last, and the step is traced every call).
        compare_key: equal for two traces that recorded the same program and
            roles, Python numbers aside (those are ``scalars``).
        hp_inputs: ``(input index, expression)`` of each lifted number that
            a float optimizer hyperparameter gave (``_hparam_inputs``): a
            replay computes it from the current ``param_groups``. In
            ``scalars`` such a number is ``("hp", expression)``.
        hp_guards: the comparisons of hyperparameters the trace made (a replay
            needs the same results).
        hp_escaped: hyperparameters converted to plain numbers while traced (never proven).
        hp_proven: hyperparameters guarded by type only: their value changed
            between two traces that recorded the same program and recipes.
        hp_masked: per optimizer, its hyperparameters with the proven ones'
            values left out (what a replay compares); None without proven ones.
    """

    prog: Any
    plan_key: Any
    leaf_roles: tuple[InputRole, ...]
    out_targets: tuple[OutputTarget, ...]
    result_spec: Any
    result_leaves: tuple[ResultRecipe, ...]
    scalars: tuple
    optimizers: dict
    modes: tuple[_ModuleMode, ...]
    global_hooks: tuple
    mutated: tuple
    compare_key: tuple
    hp_inputs: tuple[tuple[int, tuple], ...] = ()
    hp_guards: frozenset = frozenset()
    hp_escaped: frozenset = frozenset()
    hp_proven: frozenset = frozenset()
    hp_masked: dict | None = None
    hp_recorded: bool = False

    def same_trace(self, other: _Record) -> bool:
        """Whether ``other`` recorded the same program and roles with the same Python numbers."""
        return self.compare_key == other.compare_key and self.scalars == other.scalars

    def modes_match(self) -> bool:
        """Every module the trace called is alive and as it was: training mode, trainable parameters, hooks."""
        # Runs before every replay: the parameters' requires_grad is read
        # without a trip through XlaTensor.__torch_function__ per parameter.
        with torch._C.DisableTorchFunctionSubclass():
            for ref, attrs, grads, hooks in self.modes:
                m = ref()
                if m is None or not _guards.attributes_unchanged(m, attrs):
                    return False
                if grads is not None and _own_grads(m) != grads:
                    return False
                if _guards.module_hooks(m) != hooks:
                    return False
        return _global_hooks() == self.global_hooks

    def mode_change(self) -> str:
        """Why :meth:`modes_match` fails, in words (for the retrace log only: slower than the check)."""
        with torch._C.DisableTorchFunctionSubclass():
            for ref, attrs, grads, hooks in self.modes:
                m = ref()
                if m is None:
                    return "a module the trace called was freed (a module fn builds on every call never replays)"
                name = type(m).__name__
                if not _guards.attributes_unchanged(m, attrs):
                    changed = [a[0] for a in attrs if not _guards.attributes_unchanged(m, (a,))]
                    return f"attributes {changed} of a {name} changed"
                if grads is not None and _own_grads(m) != grads:
                    return f"the requires_grad of a {name}'s parameters changed"
                if _guards.module_hooks(m) != hooks:
                    return f"the hooks of a {name} changed"
        return "the global module hooks changed"


class _ModuleMode(NamedTuple):
    """A module a trace called, and what of it decides the program besides its tensors."""

    ref: weakref.ref
    attrs: tuple  # its plain attributes, ``training`` among them
    grads: tuple[bool, ...] | None  # its own parameters' requires_grad (None: it has none)
    hooks: _guards.HookKeys | None  # its hooks' handles (None: it has none)

    @classmethod
    def of(cls, m: torch.nn.Module) -> _ModuleMode:
        return cls(weakref.ref(m), _guards.plain_attributes(m), _own_grads(m), _guards.module_hooks(m))


def _global_hooks() -> tuple:
    return _guards.global_forward_hooks() + _guards.global_backward_hooks()


def _own_grads(m: torch.nn.Module) -> tuple[bool, ...] | None:
    """``requires_grad`` of each of ``m``'s own parameters (None: it has none)."""
    params = m._parameters
    if not params:
        return None
    return tuple(p is not None and p.requires_grad for p in params.values())


# Replayable programs kept per input signature (one per set of module modes seen:
# train and eval, say); a new one beyond this drops the oldest.
_MAX_STABLE = 4

# Distinct values of one Python-number argument (the rest of the signature
# equal) after which a compiled function says that each value compiles again.
_WARN_NUMBER_VALUES = 4


@dataclasses.dataclass(slots=True)
class _Entry:
    """One input signature's history: the last trace, how many agreed in a row, the replayable ones."""

    last: _Record | None = None
    streak: int = 0
    stable: list[_Record] = dataclasses.field(default_factory=list)
    ran: _Record | None = None  # the program the last call ran (traced or replayed)
    hp_unsettled: int = 0  # traces after a float hyperparameter changed that gave another program


def _is_number_entry(item) -> bool:
    """Whether a signature entry is a Python int or float argument's ``("V", type, value)``."""
    return type(item) is tuple and len(item) == 3 and item[0] == "V" and item[1] in (int, float)


def _without_numbers(sig: tuple) -> tuple:
    """``sig`` with its Python-number arguments' values left out (their types kept)."""
    return tuple(item[:2] if _is_number_entry(item) else item for item in sig)


class CompiledFunction:
    """A compiled step function; call it like ``fn``. See ``spmdtorch.compile``."""

    def __init__(self, fn):
        self.fn = fn
        # Input signature -> _Entry, bounded by SPMDTORCH_COMPILE_CACHE_SIZE
        # (each holds compiled programs): least recently used evicted.
        self._entries = CompileCache(counter="CompiledSignatureEvictions")
        # Signature without its numbers -> the distinct signatures seen with
        # it (up to _WARN_NUMBER_VALUES), until the warning has been given.
        self._number_sigs: dict | None = {}
        # Trace with Python numbers compiled in as constants (executor._Layout)
        # until two traces differ only in them: then they are program inputs,
        # so that numbers changing every call (a float learning rate under a
        # scheduler) do not compile a program per call.
        self._bake = True
        functools.update_wrapper(self, fn)
        _install_optimizer_hook()

    # -- calling ------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if _TraceState.active:  # nested: just inline
            return self.fn(*args, **kwargs)
        if profiling.STATE.active:
            name = getattr(self.fn, "__qualname__", None) or type(self.fn).__name__
            with jax.profiler.TraceAnnotation(f"spmdtorch.compiled:{name}"):
                return self._call(args, kwargs)
        return self._call(args, kwargs)

    def _call(self, args, kwargs):  # noqa: C901, PLR0915  (why: the dispatch of one compiled call: cache hit, replay, retrace or fallback, in the order they are tried)
        flat, spec, spec_key = _flatten(args, kwargs)
        flat = [_to_xla_arg(a) for a in flat]
        executor.sync()  # inputs and state must be concrete
        sig = _signature(flat, spec_key)
        entry = self._entries.get(sig)
        if entry is None:
            if self._number_sigs is not None:
                self._count_number_arguments(sig, self._number_sigs)
            entry = _Entry()
            self._entries.put(sig, entry)
        for rec in entry.stable:
            if rec.modes_match():
                # Only a drop between two runs of the same program is the user's
                # zero_grad() outside fn: after a switch of modes (a layer frozen,
                # then not), the other program's run dropped it.
                out = self._replay(rec, flat, warn=rec is entry.ran)
                if type(out) is not _Retrace:
                    metrics.inc("CompiledReplay")
                    entry.ran = rec
                    return out
                self._log_retrace(out.reason)
                entry.stable.remove(rec)
                entry.streak = 0
                break
        else:
            self._log_modes_changed(entry.stable)
        if self._bake and entry.last is not None and _float_hparams_changed(entry.last.optimizers):
            # A scheduler changes float hyperparameters (OneCycleLR's lr and
            # betas): numbers become program inputs now, one trace earlier than
            # the rule below would find out, so that they can be recorded.
            self._bake = False
            metrics.inc("CompiledScalarsLifted")
        metrics.inc("CompiledTrace")
        args, kwargs = pytree.tree_unflatten(flat, spec)
        # A trace records and compiles a whole step, as ``spmdtorch.step()``
        # does: the collector is paused for the same reason (``lazy._gc``).
        with paused_gc():
            result, record = self._trace(args, kwargs, flat)
        if record is not None and entry.last is not None:
            same = record.same_trace(entry.last)
            for key, (ref, hp) in record.optimizers.items():
                opt = ref()
                if key in entry.last.optimizers and opt is not None:
                    _, last_hp = entry.last.optimizers[key]
                    if last_hp != hp:
                        # Lifted floats that changed and still gave another program
                        # (a number escaped the recording): counted, then reported.
                        if not same and _changed_floats(key, last_hp, hp):
                            entry.hp_unsettled += 1
                        lifted = _hp.liftable(opt) and entry.hp_unsettled < _WARN_NUMBER_VALUES
                        self._warn_changing_hparams(opt, last_hp, hp, lifted=lifted)
        if (
            self._bake
            and record is not None
            and entry.last is not None
            and record.plan_key is not None
            and record.plan_key == entry.last.plan_key
            and record.scalars != entry.last.scalars
        ):
            # The same program but other numbers (a scheduled float learning
            # rate, a module attribute changed every call): from now on they
            # are inputs, so each new value reuses one program.
            self._bake = False
            metrics.inc("CompiledScalarsLifted")
        if record is not None and entry.last is not None and record.same_trace(entry.last):
            entry.streak += 1
            record = _with_proven_hparams(record, entry.last)
        else:
            entry.streak = 1
            if record is not None and entry.last is not None and record.mutated:
                self._warn_mutated_modules(record.mutated)
        entry.last = entry.ran = record
        if record is not None and entry.streak >= _STABLE_AFTER:
            kept = [r for r in entry.stable if not r.same_trace(record)]
            entry.stable = [*kept[-(_MAX_STABLE - 1) :], record]
        return result

    def _count_number_arguments(self, sig: tuple, number_sigs: dict) -> None:
        """Warn once when one Python-number argument keeps taking new values (a step counter).

        A Python number argument is part of the input signature, as a
        static argument of ``jax.jit`` (``fn`` may branch on it, and a
        branch must not be frozen), so each new value traces and compiles
        ``fn`` again: a value that changes every call compiles every call.
        """
        if not any(_is_number_entry(item) for item in sig[_SIG_ARGS:]):
            return
        if len(number_sigs) >= config.settings().compile_cache_size:
            number_sigs.clear()  # bounded as the signatures are (new shapes every call, say)
        seen = number_sigs.setdefault(_without_numbers(sig), [])
        seen.append(sig)
        if len(seen) < _WARN_NUMBER_VALUES:
            return
        self._number_sigs = None  # said once; nothing more to count
        changing = [
            i for i in range(_SIG_ARGS, len(sig)) if _is_number_entry(sig[i]) and len({s[i][2] for s in seen}) > 1
        ]
        flat = isinstance(sig[0], int)  # positional arguments only: leaf k is argument k
        where = ", ".join(
            f"{'argument' if flat else 'leaf'} {i - _SIG_ARGS} ({sig[i][1].__name__}: "
            + ", ".join(repr(float.fromhex(s[i][2]) if sig[i][1] is float else s[i][2]) for s in seen)
            + ")"
            for i in changing
        )
        warnings.warn(
            f"spmdtorch.compile({getattr(self.fn, '__qualname__', self.fn)!r}): Python number arguments took "
            f"{len(seen)} values so far, {where}{'' if flat else ' of the flattened arguments'}; a Python "
            "number argument is part of the input signature, like a static argument of jax.jit (the "
            "function may branch on it), so each new value traces and compiles the function again. Pass "
            "a number that changes every call as a 0-d tensor on the xla device, e.g. "
            "torch.tensor(step, device='xla'): then it is an input and the step replays.",
            RuntimeWarning,
            stacklevel=5,
        )

    def executable(self):
        """The XLA executable (``jax.stages.Compiled``) of the latest call, or None before one.

        It is the stable program once there is one (else the last traced), e.g.
        for ``executable().memory_analysis()`` (see ``spmdtorch.partition.memory_plan``).
        """
        records = [e.stable[-1] if e.stable else e.last for e in self._entries.values()]
        progs = [r.prog for r in records if r is not None and r.prog is not None]
        return progs[-1].compiled if progs else None

    # -- tracing ------------------------------------------------------------
    def _trace(self, args, kwargs, flat_in):
        begin_trace()
        _TraceState.created = []
        _TraceState.replaced = {}
        _TraceState.optimizers = {}
        _TraceState.modules = {}
        TRACE_HOOK[0] = _storage_hook
        captured = {}
        collector = register_module_forward_pre_hook(_collect_module)
        # Float hyperparameters are recorded only when numbers are program
        # inputs: a baked number could not take a new value at replay.
        recording = None if self._bake else _hp.Recording()
        _HP_RECORDING.current = recording
        try:
            arg_arrays: dict[int, int] = {}  # id(jax.Array) -> flat argument index
            for i, a in enumerate(flat_in):
                if isinstance(a, XlaTensor):
                    arg_arrays.setdefault(id(storage_of(a).value), i)
            result = self.fn(*args, **kwargs)
            res_flat, res_spec = pytree.tree_flatten(result)
            # A replay returns tensors without autograd history; so does a trace.
            # Dropping the history here also frees what autograd saved for a
            # backward that fn did not run (a forward under grad mode): those
            # tensors are then no outputs of the program, whose next replay
            # would find them dropped and trace again.
            if any(isinstance(r, torch.Tensor) and r.grad_fn is not None for r in res_flat):
                res_flat = [
                    r.detach() if isinstance(r, torch.Tensor) and r.grad_fn is not None else r for r in res_flat
                ]
                result = pytree.tree_unflatten(res_flat, res_spec)
            # Cyclic garbage fn made (a custom autograd Function that keeps its
            # output on ctx, which the output's grad_fn holds) outlives fn while
            # the collector is paused: a tensor in it would look like state fn
            # kept, so the program would write it, and every replay after the
            # next collection would find it gone and trace again. It is all in
            # the youngest generation (nothing was collected since it was made).
            gc.collect(0)
            created = {id(r()) for r in _TraceState.created if r() is not None}
            replaced = dict(_TraceState.replaced)
            TRACE_HOOK[0] = None

            def on_plan(plan, storages, prog):
                captured["plan"], captured["storages"], captured["prog"] = plan, storages, prog

            # What fn made and kept without returning it (gradients, new optimizer
            # state) and the state it overwrote: a replay overwrites them again,
            # so their old buffers can take the new values (executor.Recycled).
            returned = {id(storage_of(r)) for r in res_flat if isinstance(r, XlaTensor)}
            made = frozenset(created - returned)
            _pin_grad_shardings(made)
            recycle: dict[int, Any] = dict.fromkeys(made)
            for old, first, more in replaced.values():
                for st in (first, *more):
                    recycle.setdefault(id(st), old)
            executor.sync(_on_plan=on_plan, _recycle=recycle, _bake=self._bake)
        finally:
            collector.remove()
            _HP_RECORDING.current = None
            if recording is not None:
                recording.restore()  # step() raised before its post-hook
            # Each called module's state after the trace, against its attributes when first called.
            seen = [(_ModuleMode.of(m), type(m).__name__, before) for m, before in _TraceState.modules.values()]
            _TraceState.modules = {}  # weak from here: no module outlives its use because a trace failed
            end_trace()
            TRACE_HOOK[0] = None
        modes = tuple(mode for mode, _, _ in seen)
        mutated = tuple(
            (kind, tuple(sorted({a[0] for a in set(before) ^ set(mode.attrs)})))
            for mode, kind, before in seen
            if mode.attrs != before
        )
        record = self._make_record(
            captured, res_flat, res_spec, created, replaced, arg_arrays, flat_in, modes, mutated, recording
        )
        return result, record

    def _make_record(  # noqa: C901, PLR0915  (why: assembles one _Record from everything a trace captured; each field is one step)
        self, captured, res_flat, res_spec, created, replaced, arg_arrays, flat_in, modes, mutated, recording
    ):
        plan = captured.get("plan")
        storages = captured.get("storages", [])
        arg_storages: dict[int, int] = {}  # id(Storage) -> flat argument index
        for i, a in enumerate(flat_in):
            if isinstance(a, XlaTensor):
                arg_storages.setdefault(id(storage_of(a)), i)
        returned: dict[int, int] = {}  # id(Storage) -> result leaf index
        for i, r in enumerate(res_flat):
            if isinstance(r, XlaTensor):
                returned.setdefault(id(storage_of(r)), i)
        # Inputs: where each leaf of the program comes from on the next call.
        roles: list[InputRole] = []
        scalars: list[tuple[Any, Any]] = []
        hp_inputs: list[tuple[int, tuple]] = []
        if plan is not None:
            for leaf in plan.leaves:
                if type(leaf) is Scalar:
                    # A float that exactly one hyperparameter expression gave, bit for
                    # bit, is computed from the param groups at each replay.
                    recipe = recording.recipe(leaf.value) if recording and type(leaf.value) is float else None
                    if recipe is not None:
                        hp_inputs.append((len(roles), recipe))
                        scalars.append(("hp", recipe))
                    else:
                        scalars.append((type(leaf.value), leaf.value))
                    roles.append(ScalarInput(leaf))  # packed with the others at each call
                    continue
                if id(leaf) in arg_arrays:
                    roles.append(ArgInput(arg_arrays[id(leaf)]))
                    continue
                # Every storage that held this array when fn started: the
                # program read them all through this one input, so a replay
                # is only valid while they still hold one array.
                holders = holders_of(leaf)
                moved = next((arg_storages[id(h)] for h in holders if id(h) in arg_storages), None)
                if moved is not None and id(holders[0]) not in created and leaf.is_fully_replicated:
                    # An argument on the default placement that the program
                    # re-homed onto the mesh of sharded state: an argument still.
                    roles.append(ArgInput(moved, leaf.sharding))
                    continue
                if id(leaf) in replaced:
                    _, first, more = replaced[id(leaf)]
                    holders += [h for h in (first, *more) if all(h is not o for o in holders)]
                holders = [h for h in holders if id(h) not in created]
                if holders:
                    roles.append(StorageInput(weakref.ref(holders[0]), tuple(weakref.ref(h) for h in holders[1:])))
                else:
                    # Data made inside fn from host values: frozen like a jit constant.
                    roles.append(ConstInput(leaf))
        # Outputs: which storage each program output goes to.
        targets: list[OutputTarget] = []
        for st in storages:
            if id(st) in returned and id(st) in created:
                targets.append(FreshOutput(returned[id(st)]))
            else:
                targets.append(StorageOutput(weakref.ref(st), id(st) in created))
        # Returned values: rebuilt per call.
        res_leaves: list[ResultRecipe] = []
        out_pos = {id(st): k for k, st in enumerate(storages)}
        for r in res_flat:
            if isinstance(r, XlaTensor):
                k = out_pos.get(id(storage_of(r)))
                meta = TensorMeta(tuple(r.shape), r.stride(), int(r.storage_offset()), r.dtype, view_chain(r))
                if k is not None and type(targets[k]) is FreshOutput:
                    res_leaves.append(FreshResult(k, meta))
                elif id(storage_of(r)) in arg_storages:
                    res_leaves.append(ArgResult(arg_storages[id(storage_of(r))], meta))
                else:
                    res_leaves.append(AliasResult(weakref.ref(storage_of(r)), meta))
            elif isinstance(r, torch.Tensor):
                res_leaves.append(ConstResult(r))
            else:
                res_leaves.append(ValueResult(r))
        plan_key = None if plan is None else plan.key
        frozen_scalars = tuple(scalars)
        global_hooks = _global_hooks()
        return _Record(
            prog=captured.get("prog"),
            plan_key=plan_key,
            leaf_roles=tuple(roles),
            out_targets=tuple(targets),
            result_spec=res_spec,
            result_leaves=tuple(res_leaves),
            scalars=frozen_scalars,
            optimizers=dict(_TraceState.optimizers),
            modes=modes,
            global_hooks=global_hooks,
            mutated=mutated,
            compare_key=(
                tuple((id(mode.ref()), *mode[1:]) for mode in modes),
                global_hooks,
                plan_key,
                tuple(_role_key(r) for r in roles),
                tuple(_target_key(t) for t in targets),
                res_spec,
                tuple(_res_key(r) for r in res_leaves),
            ),
            hp_inputs=tuple(hp_inputs),
            hp_guards=frozenset(recording.guards) if recording else frozenset(),
            hp_escaped=frozenset(recording.escaped) if recording else frozenset(),
            hp_recorded=recording is not None,
        )

    # -- replaying -----------------------------------------------------------
    def _warn_dropped_state(self):
        if getattr(self, "_warned_dropped", False):
            return
        self._warned_dropped = True
        warnings.warn(
            f"spmdtorch.compile({getattr(self.fn, '__qualname__', self.fn)!r}): a tensor the function created "
            "and kept outside its result (e.g. a gradient in p.grad) was dropped between calls, typically by "
            "optimizer.zero_grad() outside the function; it is traced again on such calls instead of being "
            "replayed (correct, but lazy-mode speed). Call zero_grad() inside the compiled function, or "
            "zero_grad(set_to_none=False), so that it replays.",
            RuntimeWarning,
            stacklevel=3,
        )

    @staticmethod
    def _logs_retraces() -> bool:
        return _log.isEnabledFor(logging.INFO) or config.settings().log_recompiles

    def _log_modes_changed(self, stable: list[_Record]) -> None:
        """Log why none of the replayable programs fits the modules as they are now (when retraces are logged)."""
        if stable and self._logs_retraces():
            self._log_retrace(stable[-1].mode_change())

    def _log_retrace(self, reason: str) -> None:
        """With ``SPMDTORCH_LOG_RECOMPILES`` (or INFO on ``spmdtorch.compile``): why a replayable step traces again."""
        if self._logs_retraces():
            _log.warning(f"spmdtorch.compile({getattr(self.fn, '__qualname__', self.fn)!r}): traced again ({reason})")

    def _warn_mutated_modules(self, mutated: tuple) -> None:
        """Warn once when fn changes a called module's attribute while traced, so no trace repeats the last."""
        if getattr(self, "_warned_modules", False):
            return
        self._warned_modules = True
        kind, names = mutated[0]
        warnings.warn(
            f"spmdtorch.compile({getattr(self.fn, '__qualname__', self.fn)!r}): it changes the attribute(s) "
            f"{', '.join(map(repr, names))} of a {kind} it calls; a module's plain attributes are part of the "
            "traced program, so a value changed on every call (a counter) traces the step every call "
            "(lazy-mode speed). Keep such state in a buffer (a tensor) or outside the modules the function calls.",
            RuntimeWarning,
            stacklevel=3,
        )

    def _warn_changing_hparams(self, opt, before, now, lifted: bool):
        """Warn once when a changing hyperparameter forces calls to trace.

        Float hyperparameters of torch's optimizers are program inputs
        (``_hparam_inputs``): with ``lifted``, changes of floats are not
        reported (they trace at most once more). Other changes are: a number
        is part of the traced program's recipe, so the step is traced again
        whenever it changes; a 0-d tensor on the xla device is an input,
        which schedulers update in place.
        """
        if getattr(self, "_warned_hparams", False):
            return
        changed = [
            (key, a, b)
            for group_before, group_now in zip(before, now)
            for (key, a), (_, b) in zip(group_before, group_now)
            if a != b and _is_number_or_numbers(a) and not (lifted and _is_floats(a) and _is_floats(b))
        ]
        if not changed:
            return
        self._warned_hparams = True
        key, a, b = changed[0]
        name = type(opt).__name__
        if _hp.liftable(opt) and _is_floats(a) and _is_floats(b):
            why = (
                f"each value traces the step again: it settled into no program (over {_WARN_NUMBER_VALUES} "
                "calls), so some number computed from it reaches the program as a constant rather than as an "
                "input (torch's optimizers' floats are inputs only through their arithmetic)"
            )
        elif _is_floats(a) and _is_floats(b):
            why = (
                f"{name}.step is not torch.optim's, so its float hyperparameters stay part of the traced step "
                "(spmdtorch makes those of torch.optim's optimizers program inputs): every change traces the "
                "step again"
            )
        else:
            why = "a Python number that is no float is part of the traced step: every change traces it again"
        fix = (
            f"Make it a tensor on the xla device, e.g. {name}(params, lr=torch.tensor({a!r}, device='xla')), "
            "which schedulers update in place, or keep it fixed."
            if key == "lr"
            else "Keep it fixed between calls, or use a torch.optim optimizer."
        )
        warnings.warn(
            f"spmdtorch.compile({getattr(self.fn, '__qualname__', self.fn)!r}): the {name} hyperparameter "
            f"{key!r} changed between calls ({a!r} -> {b!r}, e.g. by a scheduler); {why}. {fix}",
            RuntimeWarning,
            stacklevel=3,
        )

    def _replay(self, rec: _Record, flat_in, warn: bool = True):  # noqa: C901, PLR0915  (why: the replay fast path: every guard, then the run, inline so a hit costs no extra frames)
        for key, (ref, hp) in rec.optimizers.items():
            opt = ref()
            if opt is None:
                return _Retrace("the optimizer the trace ran was deleted")
            now = _hparams(opt)
            # Proven float hyperparameters by type (their values are inputs), the rest by value.
            if now != hp if rec.hp_masked is None else _masked(now, rec.hp_proven, key) != rec.hp_masked[key]:
                self._warn_changing_hparams(opt, hp, now, lifted=_hp.liftable(opt))
                return _Retrace(f"a hyperparameter of {type(opt).__name__} changed")
        if rec.hp_masked is not None:  # else every hyperparameter is as traced

            def lookup(leaf):
                return _hp.read_leaf(rec.optimizers, leaf)

            if not _hp.guards_hold(rec.hp_guards, lookup):
                return _Retrace("a hyperparameter crossed a branch the trace took")
            hp_values = [(pos, Scalar(_hp.evaluate(expr, lookup))) for pos, expr in rec.hp_inputs]
        else:
            hp_values = []
        if any(type(leaf) is AliasResult and leaf.storage() is None for leaf in rec.result_leaves):
            # Checked first: a re-trace after running would run the step twice.
            return _Retrace("a tensor the traced result aliases was freed")
        args: list[Any] = []
        outs: list[Any] = []
        targets: list[Storage | None] = []  # None: a fresh output (FreshOutput)
        if rec.prog is not None:
            # The per-step path: type tests rather than ``match`` class patterns
            # (a pattern is an isinstance plus a __match_args__ lookup per field),
            # over ~100 inputs and outputs per call.
            for role in rec.leaf_roles:
                if type(role) is StorageInput:
                    st = role.storage()
                    if st is None or isinstance(st.value, LazyRef):
                        return _Retrace(
                            "state the program reads (a parameter, buffer or optimizer state) was freed or holds a pending value"
                        )
                    value = st.value
                    for other in role.co_holders:  # storages that shared this input when traced
                        o = other()
                        if o is not None and o.value is not value:
                            return _Retrace("tensors that shared one array when traced hold different ones now")
                    args.append(value)
                elif type(role) is ArgInput:
                    # Concrete: a call's pending inputs are synced before its signature is taken.
                    value = cast(jax.Array, storage_of(flat_in[role.index]).value)
                    if role.placement is not None and value.sharding != role.placement:
                        value = executor.rehome(value, role.placement)
                    args.append(value)
                elif type(role) is ScalarInput:
                    args.append(role.leaf)
                elif type(role) is ConstInput:
                    args.append(role.array)
            for t in rec.out_targets:
                if type(t) is StorageOutput:
                    st = t.storage()
                    if st is None and t.created:
                        # fn made this tensor and stored it outside its result (a
                        # gradient in p.grad, new optimizer state); the holder has
                        # since dropped it (zero_grad() outside fn): replaying would
                        # write the value nowhere, so fn must run again.
                        if warn:
                            self._warn_dropped_state()
                        return _Retrace("a tensor fn made and kept outside its result (a gradient) was dropped")
                    targets.append(st)  # a dead pre-existing storage just drops its output
                else:  # FreshOutput
                    targets.append(None)
            for pos, scalar in hp_values:  # this call's hyperparameters, by the trace's recipes
                args[pos] = scalar
            if rec.prog.has_random:
                args.append(rng.next_key_data())
            try:
                recycled = executor.recycled_buffers(rec.prog, targets, args) if rec.prog.recycle else ()
                outs = executor.execute(rec.prog, args, recycled)
            except (ValueError, TypeError) as e:
                # Placement/shape of some state changed outside fn: trace again.
                return _Retrace(f"the program rejected its inputs ({type(e).__name__}: {e})")
        for target, arr in zip(targets, outs):
            if target is not None:
                target.set(arr)
        res: list[Any] = []
        for leaf in rec.result_leaves:
            match leaf:
                case FreshResult(k, m):
                    st = Storage(outs[k])
                    res.append(XlaTensor(st, m.chain, m.shape, m.stride, m.offset, m.dtype))
                case ArgResult(index, m):
                    st = storage_of(flat_in[index])
                    res.append(XlaTensor(st, m.chain, m.shape, m.stride, m.offset, m.dtype))
                case AliasResult(ref, m):
                    alias = cast(Storage, ref())  # alive: checked before running
                    res.append(XlaTensor(alias, m.chain, m.shape, m.stride, m.offset, m.dtype))
                case ConstResult(tensor):
                    res.append(tensor)
                case ValueResult(value):
                    res.append(value)
        return pytree.tree_unflatten(res, rec.result_spec)


class _Retrace:
    """What ``_replay`` returns when the program cannot run for this call: why (logged), then fn is traced."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _role_key(role: InputRole) -> tuple | InputRole:
    """What must be equal between two traces for an input (``_Record.compare_key``)."""
    match role:
        case ScalarInput():  # values are compared through ``_Record.scalars``
            return ("scalar",)
        case StorageInput(ref, co_holders):
            return ("storage", id(ref()), tuple(id(r()) for r in co_holders))
        case ConstInput(array):
            return ("const",) + _const_key(array)
        case ArgInput():
            return role


def _target_key(target: OutputTarget) -> str | OutputTarget:
    """Same, for an output: its storage is identified through the plan's key."""
    match target:
        case StorageOutput():
            return "storage"
        case FreshOutput():
            return target


def _const_key(arr) -> tuple:
    """What makes two host-made constants of two traces the same: placement and contents.

    Each trace makes its own array from the same host values (a rope table, a
    mask built on the CPU): by identity no two traces would ever agree, and
    ``fn`` would never replay. Read back only while tracing (a few calls).
    """
    if arr.is_deleted() or not arr.is_fully_addressable:
        # Donated by the program itself (then the next trace makes another one
        # anyway), or another host holds part of it: keep it distinct.
        return (id(arr),)
    data = np.asarray(arr)
    return (data.shape, str(data.dtype), arr.sharding, hashlib.blake2b(data.tobytes(), digest_size=16).digest())


def _res_key(leaf: ResultRecipe) -> tuple:
    """Same, for a returned value."""
    match leaf:
        case AliasResult(ref, meta):
            return ("alias", id(ref()), meta.layout())
        case FreshResult(k, meta):
            return ("fresh", k, meta.layout())
        case ArgResult(index, meta):
            return ("arg", index, meta.layout())
        case ConstResult(tensor):
            return ("const", id(tensor))
        case ValueResult(value):
            try:
                hash(value)
                return ("value", value)
            except TypeError:
                return ("value", repr(value))


class CompiledArgumentTypeError(ArgumentTypeError):
    """A compiled function was called with an argument it cannot take as a program input."""


def _to_xla_arg(a):
    if isinstance(a, torch.Tensor) and not isinstance(a, XlaTensor):
        if _on_xla(a):
            # A wrapper subclass (a DTensor over an xla mesh) is not a pytree of
            # tensors the program can take as inputs; its xla tensor is.
            raise CompiledArgumentTypeError(
                f"a compiled function got a {type(a).__name__} over xla tensors as an argument; it takes plain "
                "xla or CPU tensors as inputs: pass the wrapped tensor (a DTensor's to_local()) and rebuild the "
                "wrapper inside the function (DTensor.from_local(x, mesh, placements)), or keep the DTensor in "
                "a module or closure the function reads"
            )
        return to_xla(a)
    return a


def compile(fn=None):
    """Compile a step function: traced while it settles, then replayed with no Python.

    Args:
        fn: the function; its tensor arguments may be xla or CPU tensors (CPU
            tensors are transferred each call). Mutations it makes to module
            parameters, buffers, gradients and optimizer state are captured.
            While it is traced, Python's cyclic garbage collector is paused,
            as in ``spmdtorch.step()`` (a replay runs no Python of ``fn``).

    Returns:
        A ``CompiledFunction`` to call like ``fn``.

    Raises:
        CompileContractError: when ``fn`` reads a tensor value in Python.

    Example:
        >>> import torch, spmdtorch
        >>> w = torch.zeros(3, device="xla")
        >>> @spmdtorch.compile
        ... def step(x):
        ...     w.add_(x)
        ...     return w.sum()
        >>> for _ in range(4):
        ...     s = step(torch.ones(3, device="xla"))
        >>> s.item()
        12.0
    """
    if fn is None:
        return compile
    return CompiledFunction(fn)
