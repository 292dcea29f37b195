"""``spmdtorch.assume_pure``: record a pure function or module once, reuse the recording every step.

PyTorch/XLA's ``torch_xla.experimental.assume_pure`` on spmdtorch. In lazy
mode every ATen op of every step is recorded on the host (tens of
microseconds each), so a deep model's step pays for recording its layers
again each time, although they do the same thing. A function (or module)
marked pure is recorded once per *signature* (the shapes, dtypes and
``requires_grad`` of its tensor arguments and of the module's parameters and
buffers, its non-tensor arguments, grad mode, autocast, matmul precision, and
per submodule its training flag, plain attributes such as ``self.scale = 0.5``
and forward hooks); later calls with that signature record ONE node that runs
the cached recording as a JAX function, and, with grad, one backward node
that applies its ``jax.vjp``. A 32-layer decoder's step then records about 64
nodes for its layers instead of about 7,000.

How it is built: the function runs once on placeholder tensors
(``spmdtorch.tensor.subgraph``), which cuts the recorded ops into one JAX
function of the arguments (the same machinery as ``spmdtorch.scan``); a
module's parameters and buffers are swapped for placeholders too, so they are
arguments of that function (each step's values are read, not the first
step's). With grad the forward node returns ``jax.vjp``'s outputs and
residuals and the backward node applies the VJP (``jax.checkpoint``-ed, so
activations are recomputed, when the module is ``checkpoint_module``-wrapped).

The promise the caller makes ("pure"): for the same signature the function
records the same ops, and its only effects are its outputs. What can be
checked is checked at the first call of a signature, each a named
:class:`AssumePureError`: random numbers (dropout with ``p > 0``), in-place
updates of an argument or buffer (BatchNorm's running statistics), host reads
(``.item()``), a tensor computed outside the function and read from a closure
(pass it as an argument), a closed-over tensor that requires grad; and at every
call, a backward hook on a submodule (it could never run inside a backward
that ``jax.vjp`` computes). What cannot be checked (Python side effects,
a forward hook's included: they run when a signature is recorded; branching on
Python state outside the signature) is the caller's promise: as with
``jax.jit``, a concrete tensor read from a closure is a constant of the
recording.

Example:
    >>> import torch, spmdtorch
    >>> @spmdtorch.assume_pure
    ... def affine(x, w, shift: float):
    ...     return x @ w + shift
    >>> x, w = torch.ones(2, 3, device="xla"), torch.ones(3, 2, device="xla")
    >>> [affine(x, w, 1.0).cpu().tolist() for _ in range(2)][1]
    [[4.0, 4.0], [4.0, 4.0]]
    >>> affine.cache_size()
    1
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import warnings
import weakref
from collections.abc import Callable, Hashable
from typing import Any, cast

import jax
import torch
from torch import nn
from torch.nn.utils import stateless
from torch.utils import _pytree as pytree

from spmdtorch import _checks, _dtypes, lazy
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import caches
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.programs import _guards
from spmdtorch.programs._scan import is_checkpointed
from spmdtorch.programs._vjp_nodes import (
    apply_vjp,
    aval_of,
    captured_grad_origin,
    sequence_nr_now,
    slot_template,
    strong,
    vjp_with_residuals,
)
from spmdtorch.tensor import storage_of, subgraph, view_chain
from spmdtorch.tensor.dispatch import read_value, record
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["AssumePureError", "PureFunction", "assume_pure"]


# Signatures kept per function: a function called with ever-new shapes or
# constants would otherwise grow without bound (a new one beyond this drops the oldest).
_MAX_ENTRIES = 64
# Recordings after which a function whose signature keeps changing is reported (once).
_WARN_AFTER = 16
# Every marked function alive, so that spmdtorch.debug.clear_caches() drops their recordings too.
_LIVE: weakref.WeakSet[PureFunction] = weakref.WeakSet()


def _clear_all() -> None:
    for f in list(_LIVE):
        f.cache_clear()


caches.register(
    "programs.pure.recordings",
    _clear_all,
    size=lambda: sum(f.cache_size() for f in list(_LIVE)),
    bound=f"at most {_MAX_ENTRIES} recordings per live assume_pure function, dropped with it",
)


class AssumePureError(ValueError):
    """A function or module marked with ``assume_pure`` cannot be recorded once and reused."""


class AssumePureTypeError(AssumePureError, ArgumentTypeError):
    """An argument of ``assume_pure`` or of the marked function of the wrong type (a ``TypeError`` too)."""


# -- one recorded signature -----------------------------------------------------------


class _VjpForward:
    """Forward node with grad: ``(*outputs, *residuals)`` of ``jax.vjp`` of the body over the differentiated inputs."""

    __slots__ = ("body", "diff", "float_out", "avals", "remat", "tree", "__weakref__")  # eval_shape: weakly

    def __init__(
        self,
        body: Callable[..., tuple[Any, ...]],
        diff: tuple[int, ...],
        float_out: tuple[bool, ...],
        avals: tuple[jax.ShapeDtypeStruct, ...],
        remat: bool,
    ) -> None:
        self.body = body
        self.diff = diff  # input positions differentiated
        self.float_out = float_out  # per output: has a cotangent
        self.avals = avals
        self.remat = remat
        self.tree: Any = None  # the VJP's tree structure, set by the shape pass

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        full = strong(vals, self.avals)
        out, res, tree = vjp_with_residuals(self.body, full, self.diff, self.float_out, self.remat)
        if self.tree is None:
            self.tree = tree
        return (*out, *res)


class _VjpBackward:
    """Backward node: the differentiated inputs' gradients from the residuals and the given cotangents."""

    __slots__ = ("fwd", "n_res", "ct_avals", "present")

    def __init__(self, fwd: _VjpForward, n_res: int, ct_avals: tuple, present: tuple[bool, ...]) -> None:
        self.fwd = fwd
        self.n_res = n_res
        self.ct_avals = ct_avals  # (shape, dtype) per float output
        self.present = present  # per float output: a cotangent was given (else zeros)

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        n = self.n_res
        return apply_vjp(self.fwd.tree, vals[:n], vals[n:], self.ct_avals, self.present)


@dataclasses.dataclass(slots=True)
class _Entry:
    """One signature's recording, ready to become a node each call.

    Attributes:
        sub: the recorded body (``fn(*tensor args, *captured)``).
        name: the node's structural identity in graph keys.
        out_spec: the output pytree's structure.
        out_leaves: per output leaf, the index of its tensor among the body's
            outputs, or ``None`` for a non-tensor leaf kept in ``consts``.
        consts: the non-tensor output leaves (by leaf position).
        out_shardings: per tensor output, the sharding the body annotated it
            with (``mark_sharding`` inside, e.g. FSDPv2's output), else None.
        fwd: the VJP forward node's function (None until a call with grad).
        res_avals: its residuals' ``(shape, dtype)``.
    """

    sub: subgraph.Subgraph
    name: Hashable
    out_spec: pytree.TreeSpec
    out_leaves: tuple[int | None, ...]
    consts: dict[int, Any]
    out_shardings: tuple[Any, ...]
    remat: bool
    fwd: _VjpForward | None = None
    res_avals: tuple[tuple[tuple[int, ...], Any], ...] = ()


class _PureAutograd(torch.autograd.Function):
    """The recorded body as one node, with a backward node that applies its VJP."""

    @staticmethod
    def forward(ctx: Any, entry: _Entry, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        sub = entry.sub
        inputs = [read_value(t) for t in tensors] + list(sub.captured)
        fwd = entry.fwd
        if fwd is None:  # the first call with grad: trace the VJP's shapes once
            avals = tuple(aval_of(v) for v in inputs)
            diff = tuple(i for i, t in enumerate(tensors) if t.requires_grad and t.is_floating_point())
            float_out = tuple(dt.is_floating_point for dt in sub.out_dtypes)
            fwd = _VjpForward(sub.fn, diff, float_out, avals, entry.remat)
            shapes = jax.eval_shape(fwd, *avals)
            entry.res_avals = tuple((tuple(s.shape), s.dtype) for s in shapes[len(float_out) :])
            entry.fwd = fwd
        out_avals = sub.out_avals + entry.res_avals
        refs = record(fwd, ("assume_pure_vjp_fwd", entry.name), slot_template(len(inputs)), inputs, out_avals)
        refs = [refs] if len(out_avals) == 1 else refs
        n_out = len(sub.out_avals)
        outs = _outputs(entry, refs[:n_out])
        ctx.res = refs[n_out:]
        ctx.entry = entry
        ctx.n_in = len(tensors)
        ctx.in_meta = [(tuple(t.shape), t.dtype) for t in tensors]
        ctx.mark_non_differentiable(*(o for o, fl in zip(outs, fwd.float_out) if not fl))
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        entry: _Entry = ctx.entry
        fwd = cast(_VjpForward, entry.fwd)  # set by forward
        fgrads = [g for g, fl in zip(grads, fwd.float_out) if fl]
        present = tuple(g is not None for g in fgrads)
        given = [read_value(g) for g in fgrads if g is not None]
        result: list[torch.Tensor | None] = [None] * ctx.n_in
        if not given or not fwd.diff:
            return (None, *result)
        ct_avals = tuple(av for av, fl in zip(entry.sub.out_avals, fwd.float_out) if fl)
        out_avals = tuple((ctx.in_meta[i][0], _dtypes.to_jax_dtype(ctx.in_meta[i][1])) for i in fwd.diff)
        bwd = _VjpBackward(fwd, len(ctx.res), ct_avals, present)
        inputs = list(ctx.res) + given
        name = ("assume_pure_vjp_bwd", entry.name, present)
        refs = record(bwd, name, slot_template(len(inputs)), inputs, out_avals)
        refs = [refs] if len(out_avals) == 1 else refs
        for i, r in zip(fwd.diff, refs):
            result[i] = new_base(r, ctx.in_meta[i][1])
        return (None, *result)


def _outputs(entry: _Entry, refs: list[Any]) -> list[XlaTensor]:
    """Fresh tensors for the node's outputs, with the annotations the body gave them."""
    outs = []
    for r, dt, sh in zip(refs, entry.sub.out_dtypes, entry.out_shardings):
        t = new_base(r, dt, sharding=sh)
        if sh is not None:
            storage_of(t).annotated = True
        outs.append(t)
    return outs


# -- the marked function --------------------------------------------------------------


def _global_state() -> tuple[Any, ...]:
    """What decides how torch code records, besides its arguments."""
    autocast = torch.is_autocast_enabled("xla")
    return (
        torch.is_grad_enabled(),
        autocast,
        torch.get_autocast_dtype("xla") if autocast else None,
        torch.get_float32_matmul_precision(),
    )


# Errors name the argument with ``where(*where_args)``, built only when raising (these run on every call).


def _tensor_sig(t: torch.Tensor, what: str, where: Callable[..., str], *where_args: Any) -> tuple[Any, ...]:
    if not isinstance(t, XlaTensor):
        raise AssumePureTypeError(
            f"{what} got a tensor on {t.device} as {where(*where_args)}; every tensor it reads must be an xla tensor: "
            "move it with .to('xla')"
        )
    mk = t._mk  # shape and dtype as the tensor was made (no property reads)
    return (mk.shape, mk.dtype, t.requires_grad)


# Non-tensor arguments are keyed by value: only immutable constants may be one.
_CONSTANTS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
    enum.Enum,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    slice,
    type(Ellipsis),
)


def _constant_key(v: Any, what: str, where: Callable[..., str], *where_args: Any) -> Hashable:
    if isinstance(v, float):
        return (float, v.hex())  # 0.0 and -0.0 stay apart, a NaN equals itself
    if isinstance(v, _CONSTANTS) or (isinstance(v, tuple) and _hashable(v)):
        return (type(v), v)
    raise AssumePureTypeError(
        f"{what} got a {type(v).__name__} as {where(*where_args)}. A non-tensor argument of a function marked pure is "
        "part of its recording's signature, so it must be an immutable constant (None, a number, a string, "
        "a dtype, an enum); an object such as a cache or a mutable container would be read at the first call "
        "only. Pass tensors and constants; for Hugging Face models, train with use_cache=False"
    )


def _hashable(v: Any) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _leaf_name(args: tuple[Any, ...], kwargs: dict[str, Any], i: int) -> str:
    """How an error names leaf ``i`` of ``(args, kwargs)``: ``argument 0``, ``keyword 'mask'[1]``."""
    path = pytree.tree_flatten_with_path((args, kwargs))[0][i][0]
    head, rest = path[0], pytree.keystr(path[2:])
    first = path[1]
    if getattr(head, "idx", 0) == 0:
        return f"argument {getattr(first, 'idx', first)}{rest}"
    return f"keyword {getattr(first, 'key', first)!r}{rest}"


class PureFunction:
    """A function marked with :func:`assume_pure`: recorded once per signature.

    Calling it returns what the function returns (tensors become fresh xla
    tensors computed by one node); :meth:`cache_size` and
    :meth:`cache_clear` inspect and reset the recordings.
    """

    def __init__(self, fn: Callable[..., Any], module: nn.Module | None, what: str) -> None:
        self._fn = fn
        self._module = module
        self._what = what
        self._cache: dict[Hashable, _Entry] = {}
        self._recordings = 0  # signatures recorded, evicted ones included
        functools.update_wrapper(self, fn)
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:
        # Copies and pickles (copy.deepcopy(model), torch.save(model)) take
        # no recordings; a module's own bound forward travels as its function,
        # re-bound to the (copied) module, never as a reference back to it.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_cache", "__wrapped__")}
        fn = state["_fn"]
        if self._module is not None and getattr(fn, "__self__", None) is self._module:
            state["_fn"], state["_func"] = None, fn.__func__
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        func = state.pop("_func", None)
        self.__dict__.update(state)
        if func is not None:
            self._fn = types.MethodType(func, self._module)
        self.__wrapped__ = self._fn
        self._cache = {}
        self._recordings = 0
        _LIVE.add(self)

    def cache_size(self) -> int:
        """How many signatures have a recording."""
        return len(self._cache)

    def cache_clear(self) -> None:
        """Drop every recording (the next call of each signature records again)."""
        self._cache.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = pytree.tree_flatten((args, kwargs))
        tensors: list[torch.Tensor] = []
        tensor_pos: list[int] = []
        names: list[str] = []
        module = self._module
        what = self._what
        # Every call builds the signature: read the tensors' requires_grad
        # without a trip through XlaTensor.__torch_function__ (a property
        # read costs ~1.4 us that way, ~0.1 us here; a layer has ~10 tensors).
        with torch._C.DisableTorchFunctionSubclass():
            key: list[Hashable] = [spec, _global_state()]
            for i, v in enumerate(leaves):
                if isinstance(v, torch.Tensor):
                    key.append(_tensor_sig(v, what, _leaf_name, args, kwargs, i))
                    tensors.append(v)
                    tensor_pos.append(i)
                else:
                    key.append(_constant_key(v, what, _leaf_name, args, kwargs, i))
            if module is not None:
                for n, t in _named_state(module):
                    key.append((n, _tensor_sig(t, what, "its {!r}".format, n)))
                    names.append(n)
                    tensors.append(t)
                key.append(_module_state(module, what))
        k = tuple(key)
        entry = self._cache.get(k)
        if entry is None:
            entry = self._record(leaves, spec, tensors, tensor_pos, names)
            self._recordings += 1
            if self._recordings == _WARN_AFTER and self._cache:
                _warn_churn(what, cast(tuple, next(reversed(self._cache))), k, module is not None)
            if len(self._cache) >= _MAX_ENTRIES:
                del self._cache[next(iter(self._cache))]
            self._cache[k] = entry
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            outs = list(_PureAutograd.apply(entry, *tensors))
        else:
            sub = entry.sub
            inputs = [read_value(t) for t in tensors] + list(sub.captured)
            refs = record(sub.fn, ("assume_pure", entry.name), slot_template(len(inputs)), inputs, sub.out_avals)
            outs = _outputs(entry, [refs] if len(sub.out_avals) == 1 else refs)
        out_leaves = [entry.consts[j] if src is None else outs[src] for j, src in enumerate(entry.out_leaves)]
        return pytree.tree_unflatten(out_leaves, entry.out_spec)

    def _record(  # noqa: PLR0915  (why: one trace on placeholders cut into an entry; the steps share the recording state)
        self,
        leaves: list[Any],
        spec: pytree.TreeSpec,
        tensors: list[torch.Tensor],
        tensor_pos: list[int],
        names: list[str],
    ) -> _Entry:
        """Run the function once on placeholders; cut what it recorded into an entry."""
        what = self._what
        # Nodes of values pending outside: a body that reads one from a closure
        # would replay this step's value at every later step (refused below).
        outside = {id(st.value.node) for st in lazy.PENDING if type(st.value) is LazyRef}
        record_grad = torch.is_grad_enabled()
        rec = subgraph.begin([(t.shape, t.dtype) for t in tensors], what)
        ph = rec.placeholders
        if record_grad:
            for p, src in zip(ph, tensors):
                if src.requires_grad:
                    p.requires_grad_(True)
        start_nr = sequence_nr_now() if record_grad else 0
        n_args = len(tensor_pos)
        orig_args, orig_kwargs = pytree.tree_unflatten(leaves, spec)
        arg_names = [_leaf_name(orig_args, orig_kwargs, i) for i in tensor_pos] + [f"its {n!r}" for n in names]
        try:
            body_leaves = list(leaves)
            for i, p in zip(tensor_pos, ph):
                body_leaves[i] = p
            args, kwargs = pytree.tree_unflatten(body_leaves, spec)
            with torch.set_grad_enabled(record_grad):
                if self._module is None:
                    out = self._fn(*args, **kwargs)
                else:
                    state: dict[str, torch.Tensor] = dict(zip(names, ph[n_args:]))
                    with stateless._reparametrize_module(self._module, state, tie_weights=True):
                        out = self._fn(*args, **kwargs)
            out_flat, out_spec = pytree.tree_flatten(out)
            out_leaves: list[int | None] = []
            consts: dict[int, Any] = {}
            out_tensors: list[XlaTensor] = []
            for j, o in enumerate(out_flat):
                if isinstance(o, torch.Tensor):
                    if not isinstance(o, XlaTensor):
                        raise AssumePureError(f"{what} returned a tensor on {o.device} as output leaf {j}")
                    out_leaves.append(len(out_tensors))
                    out_tensors.append(o)
                else:
                    out_leaves.append(None)
                    consts[j] = o
            if record_grad:
                origin = captured_grad_origin(out_tensors, ph, start_nr)
                if origin is not None:
                    raise AssumePureError(
                        f"{what} reads {origin} that requires grad and is not one of its arguments: it would "
                        "get no gradient. Pass it as an argument (a module's own parameters are arguments already)"
                    )
            shardings = tuple(
                storage_of(o).sharding if not view_chain(o) and storage_of(o).annotated else None for o in out_tensors
            )
            sub = subgraph.end(rec, out_tensors, arg_names)
        except subgraph.SubgraphError as e:
            subgraph.abort(rec)
            raise AssumePureError(f"{what}: {e}") from e
        except BaseException:
            subgraph.abort(rec)
            raise
        if sub.has_random:
            raise AssumePureError(
                f"{what} draws random numbers (dropout with p > 0, torch.rand...), so reusing its recording "
                "would reuse its random numbers. Run it in eval mode or with dropout p=0, or do not mark it pure"
            )
        _check_captured(sub, outside, what)
        remat = self._module is not None and is_checkpointed(self._module)
        name = (sub.key, remat)
        return _Entry(sub, name, out_spec, tuple(out_leaves), consts, shardings, remat)


def _module_state(module: nn.Module, what: str) -> tuple[Hashable, ...]:
    """What a marked module's recording depends on besides its tensors (part of the signature).

    Per submodule: its training flag, its plain attributes (``self.scale =
    0.5``, ``self.causal = True``: a forward may branch on them) and the
    forward hooks registered on it, plus the global module forward hooks: a
    change records again instead of replaying a recording made without it.
    The marked module's own hooks run around its forward, outside the
    recording, so they are not part of it. Backward hooks inside would never
    run (the recorded body is differentiated by ``jax.vjp``): refused.
    """
    state: list[Hashable] = list(_guards.global_forward_hooks())
    if any(_guards.global_backward_hooks()):
        raise AssumePureError(
            f"{what}: a global module backward hook is registered "
            "(torch.nn.modules.module.register_module_full_backward_hook); it would never run inside the "
            "recorded backward of a module marked pure. Remove the hook or do not mark the module pure"
        )
    for i, m in enumerate(module.modules()):
        hooks = _guards.module_hooks(m) if i else None
        if hooks is not None and hooks.any_backward:
            raise AssumePureError(
                f"{what}: its submodule {type(m).__name__} has a backward hook, which would never run inside "
                "the recorded backward of a module marked pure (it is differentiated as one function). Register "
                "the hook on the marked module itself, or do not mark the module pure"
            )
        state.append((_guards.plain_attributes(m), hooks))
    return tuple(state)


def _warn_churn(what: str, old: tuple[Hashable, ...], new: tuple[Hashable, ...], module: bool) -> None:
    """Say that ``what`` keeps recording, and what differs between its last two signatures."""
    diff = "the structure of its arguments"
    if len(old) == len(new):
        i = next((j for j, (a, b) in enumerate(zip(old, new)) if a != b), None)
        if i == 1:
            diff = "grad mode, autocast or matmul precision"
        elif module and i == len(new) - 1 and len(cast(tuple, old[i])) == len(cast(tuple, new[i])):
            # _module_state: the global hooks, then per submodule (plain attributes, forward hooks).
            a, b = cast(tuple, old[i]), cast(tuple, new[i])
            j = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
            if j < 2:
                diff = "the global module forward hooks"
            else:
                attrs_a, attrs_b = a[j][0], b[j][0]
                changed = sorted({a[0] for a in set(attrs_a) ^ set(attrs_b)})
                diff = f"submodule #{j - 2} (in .modules() order): " + (
                    f"attribute(s) {', '.join(map(repr, changed))}" if changed else "its forward hooks"
                )
        elif i is not None:
            diff = "a tensor's shape, dtype or requires_grad, or a non-tensor argument's value"
    fix = (
        "An attribute that changes on every call (a counter) belongs outside the marked module, or in a buffer"
        if "attribute" in diff
        else "A number that changes between calls can be passed as a 0-d tensor instead"
    )
    warnings.warn(
        f"{what} has recorded {_WARN_AFTER} signatures: each new one records the body again (at full "
        f"tracing cost). The last two differ in {diff}. {fix}",
        RuntimeWarning,
        stacklevel=3,
    )


def _named_state(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The module's parameters, then its buffers (each tensor once), by name."""
    return [*module.named_parameters(), *module.named_buffers()]


def _check_captured(sub: subgraph.Subgraph, outside: set[int], what: str) -> None:
    """Refuse a body that reads a value pending outside it (it would be this step's value forever)."""
    seen: set[int] = set()
    stack = [c.node for c in sub.captured if type(c) is LazyRef]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        if id(n) in outside:
            raise AssumePureError(
                f"{what} reads a tensor computed outside it (shape {tuple(n.out_avals[0][0])}) that is not "
                "one of its arguments; its value at the first call would be reused at every later call. "
                "Pass it as an argument"
            )
        seen.add(id(n))
        stack.extend(i.node for i in n.inputs if type(i) is LazyRef)


def assume_pure(fn: Any) -> Any:
    """Record ``fn`` once per signature and reuse the recording (PyTorch/XLA's ``assume_pure``).

    Args:
        fn: a function of xla tensors (and hashable non-tensor values) whose
            recording depends only on its arguments' shapes, dtypes and values
            of its non-tensor arguments, and which has no effect other than
            its result; or an ``nn.Module`` whose ``forward`` is that, given
            its parameters and buffers (then the module is changed in place:
            its ``forward`` becomes the recorded one, its parameters, state
            dict, hooks and wrappers stay as they are).

    Returns:
        A :class:`PureFunction` for a function; the module itself for a module.

    Raises:
        AssumePureTypeError: ``fn`` is not callable, or a call passes a CPU
            tensor or an unhashable non-tensor argument.
        AssumePureError: at the first call of a signature, if the body cannot
            be reused (see the module docstring).

    Example:
        >>> import torch, spmdtorch
        >>> layer = spmdtorch.assume_pure(torch.nn.Linear(4, 4).to("xla"))
        >>> y = layer(torch.ones(2, 4, device="xla")).sum()
        >>> y.backward()
        >>> layer.weight.grad.shape
        torch.Size([4, 4])
    """
    if isinstance(fn, nn.Module):
        module = fn
        if isinstance(module.__dict__.get("forward"), PureFunction):
            return module  # marked already
        forward = module.forward
        module.forward = PureFunction(forward, module, f"assume_pure({type(module).__name__})")
        return module
    _checks.check_callable(fn, "assume_pure", "fn", AssumePureTypeError)
    if isinstance(fn, PureFunction):
        return fn
    return PureFunction(fn, None, f"assume_pure({getattr(fn, '__qualname__', type(fn).__name__)})")
