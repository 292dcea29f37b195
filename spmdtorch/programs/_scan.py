"""``spmdtorch.scan`` and ``scan_layers``: a loop that compiles once, as one ``jax.lax.scan``.

PyTorch/XLA's ``torch_xla.experimental.scan.scan(fn, init, xs)`` and
``torch_xla.experimental.scan_layers.scan_layers(layers, input_data)`` on
spmdtorch. A model with N identical decoder layers, written as a Python loop,
records N copies of the layer and XLA compiles all of them: first-step time
grows with depth. ``scan_layers`` records the layer once and runs it as one
``jax.lax.scan`` (an XLA ``while`` loop) over the layers' weights stacked
along a new leading dim, so compile time stays flat in depth.

How it is built:

* the body is recorded once on placeholder tensors
  (``spmdtorch.tensor.subgraph``), which gives one JAX function; tensors the
  body reads from outside are captured inputs;
* the scan is ONE node of the enclosing lazy graph: it takes the carry, the
  scanned inputs, every layer's own parameter arrays (stacked inside the
  program with ``jnp.stack``, so each layer keeps its own torch ``Parameter``
  that optimizers, FSDPv2 and checkpoints see; the stacked array is sharded
  like one layer's parameter, plus a replicated leading dim) and the captured
  values;
* a ``torch.autograd.Function`` makes it differentiable: with grad enabled the
  forward node runs ``jax.vjp`` of the scan and also returns its residuals;
  the backward node applies the VJP (JAX differentiates a scan as a reverse
  scan), so the forward is not run twice, and each layer's gradient lands in
  that layer's ``.grad``;
* rematerialisation: with ``partition_fn=min_cut_rematerialization_partition``
  (PyTorch/XLA's spelling), ``remat=True``, or layers wrapped by
  ``checkpoint_module``, the body is ``jax.checkpoint``-ed: only the carries
  are kept across the loop, each layer's activations are recomputed in backward.

``scan``'s body may update its carry or its ``x`` in place (``acc += x;
return acc, acc``), as PyTorch/XLA's may: it runs on copies, the returned
carry is what flows, and the caller's ``init``/``xs`` are never written.

Limits (each a named :class:`ScanError`): the body may not draw random numbers
(dropout with ``p > 0``), branch on tensor values (``.item()``, ``if t:``),
update buffers in place (BatchNorm's running statistics), or close over a
tensor that requires grad (pass it in ``init``/``xs``, or as ``layer_args``).

Example:
    >>> import torch, spmdtorch
    >>> def step(carry, x):
    ...     carry = carry + x
    ...     return carry, carry * 2
    >>> final, ys = spmdtorch.scan(step, torch.zeros(2, device="xla"), torch.ones(3, 2, device="xla"))
    >>> final.cpu().tolist(), ys.cpu()[:, 0].tolist()
    ([3.0, 3.0], [2.0, 4.0, 6.0])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from spmdtorch import _checks, _dtypes
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import caches
from spmdtorch.lazy.constraint import record_constraint
from spmdtorch.lazy.graph import LazyRef, Scalar
from spmdtorch.programs import _guards
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

__all__ = ["SCAN_LAYERS_HOOK", "ScanError", "scan", "scan_layers"]

# A layer list may define this method to tell ``scan_layers`` what it holds:
# ``list._spmdtorch_scan_layers() -> (layers, stacked, remat)``: the layer
# modules; when their parameters were replaced by stacked ones
# (``spmdtorch.models.scan_decoder_layers(stack_parameters=True)``), a dict
# ``per-layer tensor name -> stacked Parameter`` (else None); and the list's
# rematerialisation choice (None: decide as for any layers), which a
# ``remat``/``partition_fn`` given to ``scan_layers`` overrides. Such a list's
# own iteration yields one callable standing for every layer, not the modules.
SCAN_LAYERS_HOOK = "_spmdtorch_scan_layers"


class ScanError(ValueError):
    """``scan``/``scan_layers`` cannot run this body or these layers as one loop, or got a bad argument."""


class ScanTypeError(ScanError, ArgumentTypeError):
    """An argument of ``scan``/``scan_layers`` of the wrong type (a ``TypeError`` too)."""


def _check_options(partition_fn: Any, pure: Any, pure_name: str, remat: Any, func: str) -> None:
    """The options ``scan`` and ``scan_layers`` share (``is_*_pure`` is accepted and unused)."""
    if partition_fn is not None:
        _checks.check_callable(partition_fn, func, "partition_fn", ScanTypeError)
    _checks.check_bool(pure, func, pure_name, ScanTypeError)
    if remat is not None:
        _checks.check_bool(remat, func, "remat", ScanTypeError)


# -- the core: one scan node ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Layout:
    """How the scan node's flat inputs split (counts, in order).

    Attributes:
        n_carry: carry leaves.
        n_xs: scanned input leaves (stacked by the caller, leading dim = length).
        n_params: per-layer tensors per layer (stacked inside the program).
        length: iterations (layers).
        n_consts: explicit broadcast inputs (the same every iteration, differentiable).
        n_captured: values the body captured from outside (not differentiated).
        n_ys: per-iteration outputs (stacked).
        remat: ``jax.checkpoint`` the body.
        param_specs: per stacked parameter, the partition spec of its stacked
            array (None: no constraint) and the mesh it refers to.
    """

    n_carry: int
    n_xs: int
    n_params: int
    length: int
    n_consts: int
    n_captured: int
    n_ys: int
    remat: bool
    param_specs: tuple[tuple[Any, Any] | None, ...]

    @property
    def n_inputs(self) -> int:
        return self.n_carry + self.n_xs + self.n_params * self.length + self.n_consts + self.n_captured


class _ScanFn:
    """The scan as a JAX function of the node's flat inputs: ``(*carry, *ys)``."""

    __slots__ = ("body", "lay")

    def __init__(self, body: Callable[..., tuple[Any, ...]], lay: _Layout) -> None:
        self.body = body
        self.lay = lay

    def split(self, vals: Sequence[Any]) -> tuple[tuple[Any, ...], tuple[Any, ...], list[Any], tuple[Any, ...]]:
        """``(carry, xs, flat per-layer params (layer-major), consts + captured)`` of the flat inputs."""
        lay = self.lay
        a = lay.n_carry
        b = a + lay.n_xs
        c = b + lay.n_params * lay.length
        return tuple(vals[:a]), tuple(vals[a:b]), list(vals[b:c]), tuple(vals[c:])

    def stack(self, flat_params: Sequence[Any]) -> list[Any]:
        """One array per parameter kind, the layers along a new leading dim (sharded like one layer)."""
        lay = self.lay
        stacked = []
        for j in range(lay.n_params):
            s = jnp.stack([flat_params[layer * lay.n_params + j] for layer in range(lay.length)])
            spec = lay.param_specs[j]
            if spec is not None:
                mesh, pspec = spec
                s = jax.lax.with_sharding_constraint(s, jax.sharding.NamedSharding(mesh, pspec))
            stacked.append(s)
        return stacked

    def run(self, carry: Sequence[Any], xs: Sequence[Any], stacked: Sequence[Any], consts: Sequence[Any]) -> tuple:
        """The loop over stacked parameters: ``(*final carry, *ys)``."""
        lay = self.lay
        body = self.body
        n_carry = lay.n_carry
        consts = tuple(consts)

        def step(c: tuple[Any, ...], x: tuple[tuple[Any, ...], tuple[Any, ...]]) -> tuple[Any, Any]:
            out = body(*c, *x[0], *x[1], *consts)
            # The body's carry must keep its input types exactly (lax.scan checks).
            new_c = tuple(o.astype(ci.dtype) for o, ci in zip(out[:n_carry], c))
            return new_c, tuple(out[n_carry:])

        if lay.remat:
            step = jax.checkpoint(step)
        c, ys = jax.lax.scan(step, tuple(carry), (tuple(xs), tuple(stacked)), length=lay.length)
        return (*c, *ys)

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        carry, xs, flat_params, consts = self.split(vals)
        return self.run(carry, xs, self.stack(flat_params), consts)


class _VjpForward:
    """Forward node with grad: ``(*outputs, *residuals)`` of ``jax.vjp`` over the float inputs.

    The VJP is taken with respect to the *stacked* parameters (one array per
    parameter kind), not each layer's: the backward then gives one stacked
    gradient per kind, which :class:`_VjpBackward` cuts into the layers' with
    a ``dynamic_slice`` at a runtime index. Differentiating through
    ``jnp.stack`` instead would cut it with one static ``slice`` per layer and
    parameter, and XLA compiles each of those (fused into the optimizer's
    update of that parameter) as its own kernel: hundreds of kernels at 32
    layers, which is what dominated the first step's compile.
    """

    __slots__ = ("scan_fn", "diff", "float_out", "avals", "tree", "space_diff", "__weakref__")  # eval_shape: weakly

    def __init__(self, scan_fn: _ScanFn, diff: tuple[bool, ...], float_out: tuple[bool, ...], avals: tuple) -> None:
        self.scan_fn = scan_fn
        self.diff = diff  # per input: differentiated
        self.float_out = float_out  # per output: has a cotangent
        self.avals = avals
        self.tree: Any = None  # the VJP's tree structure, set by the shape pass
        lay = scan_fn.lay
        lead = lay.n_carry + lay.n_xs
        first_const = lead + lay.n_params * lay.length
        # Positions differentiated in the "stacked space" (carry, xs, stacked params, consts).
        space = [diff[i] for i in range(lead)]
        space += [
            any(diff[lead + layer * lay.n_params + j] for layer in range(lay.length)) for j in range(lay.n_params)
        ]
        space += list(diff[first_const:])
        self.space_diff = tuple(i for i, d in enumerate(space) if d)

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        vals = tuple(strong(vals, self.avals))
        sf = self.scan_fn
        lay = sf.lay
        carry, xs, flat_params, consts = sf.split(vals)
        space = [*carry, *xs, *sf.stack(flat_params), *consts]
        lead, n_p = lay.n_carry + lay.n_xs, lay.n_params

        def run(*a: Any) -> tuple[Any, ...]:
            return sf.run(a[: lay.n_carry], a[lay.n_carry : lead], a[lead : lead + n_p], a[lead + n_p :])

        out, res, tree = vjp_with_residuals(run, space, self.space_diff, self.float_out)
        if self.tree is None:
            self.tree = tree
        return (*out, *res)

    def gradients(self, space_grads: Sequence[Any], layer_index: Sequence[Any]) -> list[Any]:
        """The differentiated inputs' gradients (in input order) from the stacked-space ones.

        A layer's parameter gradient is ``dynamic_slice`` of its kind's stacked
        gradient at ``layer_index[layer]``, a runtime input: the same kernel for
        every layer (with a constant index XLA would fold it into a static slice).
        """
        lay = self.scan_fn.lay
        lead, n_p = lay.n_carry + lay.n_xs, lay.n_params
        first_const = lead + n_p * lay.length
        by_pos = dict(zip(self.space_diff, space_grads))
        grads: list[Any] = []
        for i, d in enumerate(self.diff):
            if not d:
                continue
            if i < lead:
                grads.append(by_pos[i])
            elif i < first_const:
                layer, j = divmod(i - lead, n_p)
                grads.append(jax.lax.dynamic_index_in_dim(by_pos[lead + j], layer_index[layer], keepdims=False))
            else:
                grads.append(by_pos[i - first_const + lead + n_p])
        return grads

    @property
    def needs_layer_index(self) -> bool:
        """Some layer parameter is differentiated (the backward then takes the layer indices)."""
        lay = self.scan_fn.lay
        lead = lay.n_carry + lay.n_xs
        return any(lead <= i < lead + lay.n_params for i in self.space_diff)


class _VjpBackward:
    """Backward node: ``vjp(cotangents)`` from the forward's residuals (then the layer indices, if any)."""

    __slots__ = ("fwd", "n_res", "ct_avals", "present")

    def __init__(self, fwd: _VjpForward, n_res: int, ct_avals: tuple, present: tuple[bool, ...]) -> None:
        self.fwd = fwd
        self.n_res = n_res
        self.ct_avals = ct_avals  # (shape, dtype) per float output
        self.present = present  # per float output: a cotangent was given (else zeros)

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        n_given = sum(self.present)
        res = vals[: self.n_res]
        given = vals[self.n_res : self.n_res + n_given]
        layer_index = vals[self.n_res + n_given :]
        grads = apply_vjp(self.fwd.tree, res, given, self.ct_avals, self.present)
        return tuple(self.fwd.gradients(grads, layer_index))


def _layer_index(length: int) -> list[Scalar]:
    """The layer numbers as runtime inputs (numpy ints: each its own 0-d argument, not packed in a vector).

    A packed vector would be read with a static slice inside each consumer's
    fusion, making every layer's kernel different again.
    """
    return [Scalar(np.int32(i)) for i in range(length)]


# (scan key, input avals) -> (residual avals, VJP tree): the shape pass traces the whole scan once.
_RESIDUALS = caches.bounded("_scan.residual_shapes", maxsize=256)


class _ScanAutograd(torch.autograd.Function):
    """The scan node with a backward node that applies its VJP."""

    @staticmethod
    def forward(ctx: Any, call: _Call, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = [read_value(t) for t in tensors] + list(call.captured)
        avals = tuple(aval_of(v) for v in inputs)
        diff = tuple(
            i < len(tensors) and tensors[i].is_floating_point() and tensors[i].requires_grad for i in range(len(inputs))
        )
        float_out = tuple(dt.is_floating_point for dt in call.out_dtypes)
        fwd = _VjpForward(call.scan_fn, diff, float_out, avals)
        key = (call.name, avals)
        hit = _RESIDUALS.get(key)
        if hit is None:
            shapes = jax.eval_shape(fwd, *avals)
            hit = (tuple((s.shape, s.dtype) for s in shapes[len(float_out) :]), fwd.tree)
            _RESIDUALS.put(key, hit)
        res_avals, fwd.tree = hit
        out_avals = call.out_avals + res_avals
        refs = record(fwd, ("scan_vjp_fwd", call.name), slot_template(len(inputs)), inputs, out_avals)
        refs = [refs] if len(out_avals) == 1 else refs
        n_out = len(call.out_avals)
        outs = [new_base(r, dt) for r, dt in zip(refs[:n_out], call.out_dtypes)]
        ctx.res = refs[n_out:]
        ctx.fwd = fwd
        ctx.call = call
        ctx.diff = diff[: len(tensors)]
        ctx.in_dtypes = [t.dtype for t in tensors]
        ctx.in_shapes = [tuple(t.shape) for t in tensors]
        ctx.mark_non_differentiable(*(o for o, fl in zip(outs, float_out) if not fl))
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        call: _Call = ctx.call
        float_out = ctx.fwd.float_out
        ct_avals = tuple(av for av, fl in zip(call.out_avals, float_out) if fl)
        fgrads = [g for g, fl in zip(grads, float_out) if fl]
        present = tuple(g is not None for g in fgrads)
        given = [read_value(g) for g in fgrads if g is not None]
        if not given:
            return (None,) * (len(ctx.diff) + 1)
        diff_idx = [i for i, d in enumerate(ctx.diff) if d]
        out_avals = tuple((ctx.in_shapes[i], _dtypes.to_jax_dtype(ctx.in_dtypes[i])) for i in diff_idx)
        bwd = _VjpBackward(ctx.fwd, len(ctx.res), ct_avals, present)
        inputs = list(ctx.res) + given
        if ctx.fwd.needs_layer_index:
            inputs += _layer_index(call.scan_fn.lay.length)
        refs = record(bwd, ("scan_vjp_bwd", call.name, present), slot_template(len(inputs)), inputs, out_avals)
        refs = [refs] if len(out_avals) == 1 else refs
        result: list[torch.Tensor | None] = [None] * len(ctx.diff)
        for i, r in zip(diff_idx, refs):
            result[i] = new_base(r, ctx.in_dtypes[i])
        return (None, *result)


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """One recorded scan, ready to become a node."""

    scan_fn: _ScanFn
    name: Any
    captured: tuple[Any, ...]
    out_avals: tuple[tuple[tuple[int, ...], Any], ...]
    out_dtypes: tuple[torch.dtype, ...]


def _param_spec(t: torch.Tensor) -> tuple[Any, Any] | None:
    """``(mesh, spec of the stacked array)`` when ``t``'s value is sharded over a named mesh."""
    if not isinstance(t, XlaTensor) or view_chain(t):
        return None
    st = storage_of(t)
    sh = st.sharding
    if sh is None and not isinstance(st.value, LazyRef):
        sh = getattr(st.value, "sharding", None)
    if not isinstance(sh, jax.sharding.NamedSharding) or all(p is None for p in sh.spec):
        return None
    spec = tuple(sh.spec) + (None,) * (t.dim() - len(sh.spec))
    return (sh.mesh, jax.sharding.PartitionSpec(None, *spec))


def _annotate(t: torch.Tensor, sharding: jax.sharding.NamedSharding) -> None:
    """Give the fresh (pending) tensor ``t`` a sharding it keeps, as ``mark_sharding`` does for a pending value."""
    st = storage_of(_check_tensor(t, "a stacked layer tensor"))
    st.set(record_constraint(read_value(t), sharding))
    st.sharding = sharding
    st.annotated = True


def stack_layer_tensors(per_layer: Sequence[torch.Tensor]) -> torch.Tensor:
    """The layers' tensors stacked along a new leading dim, sharded like one layer's plus a replicated layer dim.

    A new (pending) tensor that does not require grad; the callers make it a ``Parameter``.
    """
    spec = _param_spec(per_layer[0])
    with torch.no_grad():
        out = torch.stack([t.detach() for t in per_layer])
    if spec is not None:
        _annotate(out, jax.sharding.NamedSharding(*spec))
    return out


def unstack_layer_tensor(stacked: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s tensor of a stacked one, a new tensor sharded like the stacked one less its layer dim."""
    spec = _param_spec(stacked)
    with torch.no_grad():
        out = stacked.detach()[layer].clone()
    if spec is not None:
        mesh, pspec = spec
        _annotate(out, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*tuple(pspec)[2:])))
    return out


def _check_no_captured_grad(outs: Sequence[torch.Tensor], placeholders: Sequence[torch.Tensor], start: int) -> None:
    """Refuse a body whose outputs depend, through autograd, on a tensor from outside that requires grad."""
    origin = captured_grad_origin(outs, placeholders, start)
    if origin is not None:
        raise ScanError(
            f"the scan body reads {origin} from outside that requires grad; it would get no gradient. "
            "Pass it through `init`/`xs` (scan), as a parameter of each layer or in "
            "`layer_args`/`layer_kwargs` (scan_layers)"
        )


def _check_tensor(t: Any, what: str) -> XlaTensor:
    if not isinstance(t, XlaTensor):
        device = getattr(t, "device", None)
        raise ScanError(f"{what} must be an xla tensor, got {type(t).__name__} on {device}; move it with .to('xla')")
    return t


def _scan_core(
    body: Callable[[list[XlaTensor], list[XlaTensor], list[XlaTensor], list[XlaTensor]], tuple[list[Any], list[Any]]],
    init: Sequence[torch.Tensor],
    xs: Sequence[torch.Tensor],
    layer_params: Sequence[Sequence[torch.Tensor]],
    consts: Sequence[torch.Tensor],
    *,
    length: int,
    remat: bool,
    names: Sequence[str],
    what: str,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run ``body(carry, x, params, consts) -> (carry, ys)`` as one ``lax.scan`` node.

    ``layer_params[l]`` holds layer ``l``'s tensors (same shapes for every l);
    ``xs`` are stacked already (leading dim ``length``).
    """
    n_params = len(layer_params[0]) if layer_params else 0
    flat_params = [t for layer in layer_params for t in layer]
    tensors = [*init, *xs, *flat_params, *consts]
    nc, nx = len(init), len(xs)
    for t, n in zip([*init, *xs, *consts], [*names[: nc + nx], *names[nc + nx :]]):
        _check_tensor(t, n)
    for t in flat_params:
        _check_tensor(t, f"layer tensor of shape {tuple(t.shape)}")
    avals = (
        [(t.shape, t.dtype) for t in init]
        + [(t.shape[1:], t.dtype) for t in xs]
        + [(t.shape, t.dtype) for t in (layer_params[0] if layer_params else ())]
        + [(t.shape, t.dtype) for t in consts]
    )
    # With grad enabled the body is recorded under autograd even when no input
    # requires grad: that is how a closed-over tensor that requires grad is found.
    record_grad = torch.is_grad_enabled()
    grad_on = record_grad and any(t.requires_grad for t in tensors)
    rec = subgraph.begin(avals, what)
    ph = rec.placeholders
    if record_grad:
        sources = [*init, *xs, *(layer_params[0] if layer_params else ()), *consts]
        for p, src in zip(ph, sources):
            if src.requires_grad:
                p.requires_grad_(True)
    start_nr = sequence_nr_now() if record_grad else 0
    try:
        with torch.set_grad_enabled(record_grad):
            new_carry, ys = body(ph[:nc], ph[nc : nc + nx], ph[nc + nx : nc + nx + n_params], ph[nc + nx + n_params :])
        if len(new_carry) != nc:
            raise ScanError(f"{what} returned {len(new_carry)} carry tensors; `init` has {nc}")
        for i, (o, c) in enumerate(zip(new_carry, init)):
            _check_tensor(o, f"carry output {i} of {what}")
            if tuple(o.shape) != tuple(c.shape) or o.dtype != c.dtype:
                raise ScanError(
                    f"{what} must return a carry shaped like `init`: carry {i} is {tuple(o.shape)} {o.dtype}, "
                    f"`init` has {tuple(c.shape)} {c.dtype}"
                )
        for i, y in enumerate(ys):
            _check_tensor(y, f"per-iteration output {i} of {what}")
        if record_grad:
            _check_no_captured_grad([*new_carry, *ys], ph, start_nr)
        arg_names = [*names[: nc + nx], *(f"layer tensor {j}" for j in range(n_params)), *names[nc + nx :]]
        sub = subgraph.end(rec, [*new_carry, *ys], arg_names)
    except subgraph.SubgraphError as e:
        subgraph.abort(rec)
        raise ScanError(f"{what}: {e}") from e
    except BaseException:
        subgraph.abort(rec)
        raise
    if sub.has_random:
        raise ScanError(
            f"{what} draws random numbers (dropout with p > 0, torch.rand...); a scan body cannot yet. "
            "Run it in eval mode or with dropout p=0, or unrolled"
        )
    lay = _Layout(
        n_carry=nc,
        n_xs=nx,
        n_params=n_params,
        length=length,
        n_consts=len(consts),
        n_captured=len(sub.captured),
        n_ys=len(ys),
        remat=remat,
        param_specs=tuple(_param_spec(t) for t in (layer_params[0] if layer_params else ())),
    )
    scan_fn = _ScanFn(sub.fn, lay)
    out_avals = sub.out_avals[:nc] + tuple(((length, *shape), dt) for shape, dt in sub.out_avals[nc:])
    call = _Call(scan_fn, ("scan", sub.key, lay), sub.captured, out_avals, sub.out_dtypes)
    if grad_on:
        outs = list(_ScanAutograd.apply(call, *tensors))
    else:
        inputs = [read_value(t) for t in tensors] + list(sub.captured)
        refs = record(scan_fn, call.name, slot_template(len(inputs)), inputs, out_avals)
        refs = [refs] if len(out_avals) == 1 else refs
        outs = [new_base(r, dt) for r, dt in zip(refs, sub.out_dtypes)]
    return outs[:nc], outs[nc:]


# -- PyTorch/XLA's surface --------------------------------------------------------------


def _private(placeholders: Sequence[XlaTensor]) -> list[torch.Tensor]:
    """Copies of the body's placeholders that the body may update in place.

    A copy is not an autograd leaf (an in-place update of a placeholder that
    requires grad would be refused by autograd) and leaves the placeholder
    itself unwritten; the copy costs nothing once XLA compiles the loop.
    """
    return [p.clone() for p in placeholders]


def _wants_remat(partition_fn: Any) -> bool:
    """PyTorch/XLA picks remat by AOTAutograd partitioner; the min-cut one means rematerialise."""
    if partition_fn is None:
        return False
    name = getattr(partition_fn, "__name__", type(partition_fn).__name__)
    return "min_cut" in name or "remat" in name


def scan(
    fn: Callable[[Any, Any], tuple[Any, Any]],
    init: Any,
    xs: Any,
    partition_fn: Callable[..., Any] | None = None,
    is_fn_pure: bool = True,
    *,
    remat: bool | None = None,
) -> tuple[Any, Any]:
    """Loop ``fn`` over the leading dim of ``xs``, carrying state: one ``jax.lax.scan``.

    Equivalent to::

        carry, ys = init, []
        for i in range(len(xs)):
            carry, y = fn(carry, xs[i])
            ys.append(y)
        return carry, torch.stack(ys)

    with ``init``/``xs``/``y`` any pytrees of xla tensors (every leaf of ``xs``
    has the same leading dim). ``fn`` is recorded once. Differentiable with
    respect to ``init`` and ``xs``.

    Args:
        fn: ``fn(carry, x) -> (new_carry, y)``; ``new_carry`` has ``init``'s structure, shapes and dtypes.
        init: the first carry.
        xs: the scanned inputs.
        partition_fn: PyTorch/XLA's knob: ``functorch.compile.min_cut_rematerialization_partition``
            rematerialises the body in backward; ``default_partition`` (or None) does not.
        is_fn_pure: accepted for PyTorch/XLA compatibility (``fn`` is always recorded once per call).
        remat: rematerialise the body in backward (``jax.checkpoint``); overrides ``partition_fn``.

    Returns:
        ``(final carry, ys)``, ``ys`` with each leaf of ``y`` stacked along a new leading dim.

    Raises:
        ScanError: leaves of ``xs`` of different lengths, a carry that changes
            shape/dtype, or a body that cannot be one loop (see the module docstring).
    """
    _checks.check_callable(fn, "scan", "fn", ScanTypeError)
    _check_options(partition_fn, is_fn_pure, "is_fn_pure", remat, "scan")
    init_flat, init_spec = pytree.tree_flatten(init)
    xs_flat, xs_spec = pytree.tree_flatten(xs)
    if not xs_flat:
        raise ScanError("scan: `xs` has no tensors; pass at least one tensor to scan over")
    for i, t in enumerate(xs_flat):
        _check_tensor(t, f"scan: xs leaf {i}")
        if t.dim() == 0:
            raise ScanError(f"scan: xs leaf {i} is 0-dimensional; scanned tensors need a leading dim")
    for i, t in enumerate(init_flat):
        _check_tensor(t, f"scan: init leaf {i}")
    length = xs_flat[0].shape[0]
    for i, t in enumerate(xs_flat):
        if t.shape[0] != length:
            raise ScanError(f"scan: xs leaves have different leading dims: leaf 0 has {length}, leaf {i} {t.shape[0]}")
    y_spec: list[Any] = [None]

    def body(carry: list[XlaTensor], x: list[XlaTensor], _p: list[XlaTensor], _c: list[XlaTensor]) -> Any:
        # fn sees copies, so a body that updates its carry (or x) in place
        # (``acc += x; return acc, acc``) works as in PyTorch/XLA: the returned
        # carry is what flows, and the caller's tensors are never written.
        new_carry, y = fn(
            pytree.tree_unflatten(_private(carry), init_spec), pytree.tree_unflatten(_private(x), xs_spec)
        )
        c_flat, c_spec = pytree.tree_flatten(new_carry)
        if c_spec != init_spec:
            raise ScanError(f"scan: fn returned a carry structured as {c_spec}, `init` is {init_spec}")
        y_flat, y_spec[0] = pytree.tree_flatten(y)
        return c_flat, y_flat

    names = [f"init leaf {i}" for i in range(len(init_flat))] + [f"xs leaf {i}" for i in range(len(xs_flat))]
    carry, ys = _scan_core(
        body,
        init_flat,
        xs_flat,
        [],
        [],
        length=length,
        remat=_wants_remat(partition_fn) if remat is None else remat,
        names=names,
        what="the body of spmdtorch.scan",
    )
    return pytree.tree_unflatten(carry, init_spec), pytree.tree_unflatten(ys, y_spec[0])


# Plain Python values in a module's __dict__ that decide what its forward computes.
_PLAIN = (bool, int, float, str, type(None), tuple)


def _module_facts(module: nn.Module, ignore: frozenset[str]) -> dict[str, Any]:
    """What must agree between layers for one recorded layer to stand for all of them."""
    facts: dict[str, Any] = {}
    for path, m in module.named_modules():
        where = path or "(the layer itself)"
        facts[f"{where}: module type"] = type(m).__qualname__
        facts[f"{where}: own forward"] = "forward" in m.__dict__
        hooks = _guards.module_hooks(m)
        if hooks is not None and hooks.any_backward:
            raise ScanError(
                f"scan_layers: {where} of a layer has a backward hook, which would never run: the loop's "
                "backward is computed by jax.vjp of the recorded layer. Remove the hook or run the layers unrolled"
            )
        # Layer 0 is recorded with its hooks and stands for every layer: the
        # others must have the same hook functions (by identity), not only as many.
        facts[f"{where}: forward hooks"] = (tuple(m._forward_pre_hooks.values()), tuple(m._forward_hooks.values()))
        for k, v in m.__dict__.items():
            if k.startswith("_") or k in ignore or not isinstance(v, _PLAIN):
                continue
            facts[f"{where}: attribute {k!r}"] = v
    for kind, items in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for n, t in items:
            facts[f"{kind} {n!r}"] = (tuple(t.shape), t.dtype, t.requires_grad)
    return facts


def check_same_structure(layers: Sequence[nn.Module], ignore: frozenset[str]) -> None:
    ref = _module_facts(layers[0], ignore)
    for i, layer in enumerate(layers[1:], start=1):
        facts = _module_facts(layer, ignore)
        for k in ref.keys() | facts.keys():
            a, b = ref.get(k, "(absent)"), facts.get(k, "(absent)")
            if a != b:
                raise ScanError(
                    f"scan_layers: layer {i} differs from layer 0 in {k}: layer 0 has {a!r}, layer {i} has {b!r}. "
                    "Every layer must compute the same function of its own weights; run differing layers "
                    "unrolled, or name a harmless attribute in ignore_attributes"
                )


def is_checkpointed(module: nn.Module) -> bool:
    """``checkpoint_module`` wrapped it, or Hugging Face gradient checkpointing is on (in training)."""
    return any(
        getattr(m, "_spmdtorch_checkpointed", False)
        or (getattr(m, "gradient_checkpointing", False) is True and m.training)
        for m in module.modules()
    )


def scan_layers(
    layers: Iterable[nn.Module],
    input_data: Any,
    partition_fn: Callable[..., Any] | None = None,
    is_layer_pure: bool = False,
    *,
    layer_args: Sequence[Any] = (),
    layer_kwargs: dict[str, Any] | None = None,
    remat: bool | None = None,
    ignore_attributes: Iterable[str] = ("layer_idx",),
) -> Any:
    """Run ``layers`` one after another on ``input_data`` as one ``jax.lax.scan``.

    Equivalent to ``for layer in layers: input_data = layer(input_data,
    *layer_args, **layer_kwargs)``, but the layer is recorded and compiled once
    whatever the depth. Every layer must have the same structure (module
    types, parameter names/shapes/dtypes, configuration attributes); layer 0
    is recorded and run with each layer's weights in turn. Gradients land in
    each layer's own parameters.

    Args:
        layers: identical modules (an ``nn.ModuleList``).
        input_data: the first layer's input (the carry): a tensor or a pytree of tensors.
        partition_fn: as in :func:`scan` (``min_cut_rematerialization_partition`` rematerialises).
        is_layer_pure: accepted for PyTorch/XLA compatibility.
        layer_args: extra positional arguments for every layer (tensors in
            them are inputs of the loop, the same each iteration, differentiable).
        layer_kwargs: extra keyword arguments for every layer (as ``layer_args``).
        remat: rematerialise each layer in backward; default: when the layers
            are wrapped by ``checkpoint_module`` or ``partition_fn`` asks for it.
        ignore_attributes: attribute names that may differ between layers
            without changing what they compute (HF's ``layer_idx``, used only by caches).

    ``layers`` may be a list made by ``spmdtorch.models.scan_decoder_layers``;
    with ``stack_parameters=True`` the loop runs over its stacked parameters
    (one per weight kind, the layers along the leading dim), so a model written
    with ``scan_layers`` gets the stacked form's small optimizer step too.

    Returns:
        The last layer's output. A layer returning a tuple whose first element
        is the hidden state (older Hugging Face layers) has that element carried.

    Raises:
        ScanError: layers that differ (the message names the layer and what
            differs) or a layer that cannot run as a loop body.

    Example:
        >>> import torch, spmdtorch
        >>> layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3)).to("xla")
        >>> tuple(spmdtorch.scan_layers(layers, torch.ones(2, 4, device="xla")).shape)
        (2, 4)
    """
    _check_options(partition_fn, is_layer_pure, "is_layer_pure", remat, "scan_layers")
    if isinstance(layers, nn.Module) and not isinstance(layers, (nn.ModuleList, nn.Sequential)):
        _checks.fail(ScanTypeError, "scan_layers", "layers", "an iterable of identical modules (nn.ModuleList)", layers)
    if not isinstance(layers, Iterable):
        _checks.fail(ScanTypeError, "scan_layers", "layers", "an iterable of identical modules (nn.ModuleList)", layers)
    hook = getattr(layers, SCAN_LAYERS_HOOK, None)
    stacked: dict[str, torch.Tensor] | None = None
    list_remat: bool | None = None
    if hook is not None:  # a list scan_decoder_layers made: its iteration yields no modules
        layers, stacked, list_remat = hook()
    layers = list(layers)
    for i, layer in enumerate(layers):
        if not isinstance(layer, nn.Module):
            _checks.fail(ScanTypeError, "scan_layers", f"layers[{i}]", "an nn.Module", layer)
    if not all(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(input_data)) or not pytree.tree_leaves(
        input_data
    ):
        _checks.fail(ScanTypeError, "scan_layers", "input_data", "an xla tensor or a pytree of xla tensors", input_data)
    if isinstance(layer_args, (str, bytes)) or not isinstance(layer_args, Sequence):
        _checks.fail(
            ScanTypeError, "scan_layers", "layer_args", "a sequence (tuple/list) of extra arguments", layer_args
        )
    if layer_kwargs is not None and not isinstance(layer_kwargs, dict):
        _checks.fail(
            ScanTypeError, "scan_layers", "layer_kwargs", "a dict of extra keyword arguments or None", layer_kwargs
        )
    if isinstance(ignore_attributes, (str, bytes)) or not isinstance(ignore_attributes, Iterable):
        _checks.fail(
            ScanTypeError, "scan_layers", "ignore_attributes", "an iterable of attribute names", ignore_attributes
        )
    ignore_attributes = tuple(ignore_attributes)
    for name in ignore_attributes:
        _checks.check_str(name, "scan_layers", "ignore_attributes", ScanTypeError)
    if remat is None:
        remat = True if _wants_remat(partition_fn) else list_remat
    if not layers:
        return input_data
    if stacked is not None:
        # Their structure was checked when the parameters were stacked; the layers hold none now.
        return run_layers(
            layers[0],
            list(stacked),
            input_data,
            stacked=list(stacked.values()),
            layer_args=layer_args,
            layer_kwargs=layer_kwargs,
            remat=is_checkpointed(layers[0]) if remat is None else remat,
        )
    check_same_structure(layers, frozenset(ignore_attributes))
    template = layers[0]
    pnames = [n for n, _ in template.named_parameters()]
    bnames = [n for n, _ in template.named_buffers()]
    per_layer = []
    for layer in layers:
        params, buffers = dict(layer.named_parameters()), dict(layer.named_buffers())
        per_layer.append([params[n] for n in pnames] + [buffers[n] for n in bnames])
    return run_layers(
        template,
        pnames + bnames,
        input_data,
        per_layer=per_layer,
        layer_args=layer_args,
        layer_kwargs=layer_kwargs,
        remat=is_checkpointed(template) if remat is None else remat,
    )


def run_layers(
    template: nn.Module,
    names: Sequence[str],
    input_data: Any,
    *,
    per_layer: Sequence[Sequence[torch.Tensor]] | None = None,
    stacked: Sequence[torch.Tensor] | None = None,
    layer_args: Sequence[Any] = (),
    layer_kwargs: dict[str, Any] | None = None,
    remat: bool = False,
) -> Any:
    """Run ``template`` once per layer as one scan, with the layers' tensors ``names`` swapped in.

    The layers' tensors come either per layer (``per_layer[l][k]`` is layer
    ``l``'s tensor ``names[k]``: stacked inside the program, gradients cut per
    layer) or already stacked (``stacked[k]`` holds every layer's ``names[k]``
    along its leading dim: scanned directly, its gradient stays stacked).
    Arguments are checked by the callers (:func:`scan_layers`,
    ``spmdtorch.models.scan_decoder_layers``).
    """
    carry_flat, carry_spec = pytree.tree_flatten(input_data)
    extra_flat, extra_spec = pytree.tree_flatten((tuple(layer_args), dict(layer_kwargs or {})))
    const_pos = [i for i, v in enumerate(extra_flat) if isinstance(v, torch.Tensor)]
    unwrap_tuple: list[bool] = [False]
    # Stacked: the tensors are no longer the template's own (strict would refuse the names).
    strict = stacked is None

    def body(carry: list[XlaTensor], x: list[XlaTensor], params: list[XlaTensor], consts: list[XlaTensor]) -> Any:
        leaves = list(extra_flat)
        for i, c in zip(const_pos, consts):
            leaves[i] = c
        args, kwargs = pytree.tree_unflatten(leaves, extra_spec)
        state: dict[str, torch.Tensor] = dict(zip(names, params if stacked is None else x))
        out = torch.func.functional_call(
            template, state, (pytree.tree_unflatten(carry, carry_spec), *args), kwargs, strict=strict
        )
        out_flat, out_spec = pytree.tree_flatten(out)
        if out_spec != carry_spec:
            if isinstance(out, (tuple, list)) and out and len(carry_flat) == 1 and isinstance(out[0], torch.Tensor):
                unwrap_tuple[0] = True
                return [out[0]], []
            raise ScanError(
                f"scan_layers: a layer's output is structured as {out_spec} but its input as {carry_spec}; "
                "a layer must return what it takes (the next layer's input)"
            )
        return out_flat, []

    arg_names = [f"input leaf {i}" for i in range(len(carry_flat))]
    if stacked is not None:
        arg_names += [f"stacked {n}" for n in names]
    arg_names += [f"layer argument {i}" for i in const_pos]
    length = len(per_layer) if per_layer is not None else (stacked[0].shape[0] if stacked else 0)
    carry, _ = _scan_core(
        body,
        carry_flat,
        list(stacked) if stacked is not None else [],
        per_layer if per_layer is not None else [],
        [extra_flat[i] for i in const_pos],
        length=length,
        remat=remat,
        names=arg_names,
        what=f"scan_layers' layer ({type(template).__name__})",
    )
    return pytree.tree_unflatten(carry, carry_spec)
