"""``spmdtorch.call_jax``: run a JAX function on xla tensors as one node of the traced program.

PyTorch/XLA's ``torch_xla.core.xla_builder.call_jax`` on spmdtorch. An xla
tensor's value is a JAX array (or a pending node that computes one), so a
JAX function is just another op: ``call_jax(f, (a, b))`` records ONE node
whose function is ``f`` applied to the arguments' values. Nothing runs when
it is called; ``f`` is traced with the rest of the step when the step's
program is built (lazily, or inside :func:`spmdtorch.compile`), so XLA fuses
and shards it with the surrounding torch ops.

* Arguments: ``args``/``kwargs`` are pytrees (tuples, lists, dicts) whose xla
  tensors (and JAX/numpy arrays) become the node's inputs, passed to ``f`` as
  JAX arrays; other leaves (numbers, strings, None...) are passed as they are
  and are part of the node's identity, as static arguments of ``jax.jit`` are.
* The mesh: ``f`` runs with the active mesh as JAX's abstract mesh (the one
  ``jax.sharding.get_abstract_mesh()`` answers), so a bare
  ``jax.lax.with_sharding_constraint(x, PartitionSpec('fsdp'))`` inside
  ``f`` refers to it. The active mesh is JAX's own when the caller set one
  (``with jax.set_mesh(...)``), else spmdtorch's global mesh
  (``spmdtorch.mesh.set_global_mesh``, which PyTorch/XLA's
  ``xs.set_global_mesh`` sets under compat).
* Autograd: differentiable in every floating-point tensor argument through
  ``jax.vjp``; the backward node recomputes ``f``'s forward (as
  ``jax.checkpoint`` would) rather than keeping its residuals.
* Identity: the node is named by ``f`` itself (or ``override_hash``), the
  arguments' structure and static leaves, and the mesh, so a step that calls
  it the same way records the same program. Defining ``f`` anew every step
  makes every step a new program: pass ``override_hash`` (PyTorch/XLA's
  advice too) or define it once.

Example:
    >>> import torch, jax.numpy as jnp, spmdtorch
    >>> a = torch.ones(2, 2, device="xla")
    >>> spmdtorch.call_jax(lambda x, y: x + jnp.sin(y), (a, a * 0)).cpu().tolist()
    [[1.0, 1.0], [1.0, 1.0]]
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from spmdtorch import _checks, _dtypes
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.mesh import get_global_mesh
from spmdtorch.programs._vjp_nodes import aval_of, slot_template
from spmdtorch.tensor.dispatch import read_value, record
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["CallJaxError", "call_jax"]


class CallJaxError(ValueError):
    """``call_jax`` cannot run this JAX function on these arguments."""


class CallJaxTypeError(CallJaxError, ArgumentTypeError):
    """An argument of ``call_jax`` of the wrong type (a ``TypeError`` too)."""


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)  # jax.eval_shape holds it weakly
class _Call:
    """How to rebuild ``f``'s arguments from the node's inputs.

    Attributes:
        func: the JAX function.
        treedef: the structure of ``(args, kwargs)``.
        statics: every leaf, with ``None`` where a dynamic input goes.
        dynamic: the leaf positions of the node's inputs, in order.
        mesh: the abstract mesh ``func`` runs under (None: none active).
    """

    func: Callable[..., Any]
    treedef: Any
    statics: tuple[Any, ...]
    dynamic: tuple[int, ...]
    mesh: jax.sharding.AbstractMesh | None

    def __call__(self, *vals: Any) -> Any:
        """``func``'s output pytree, for the node's input values."""
        leaves = list(self.statics)
        for pos, v in zip(self.dynamic, vals):
            leaves[pos] = v
        args, kwargs = jax.tree_util.tree_unflatten(self.treedef, leaves)
        with self.mesh_context():
            return self.func(*args, **kwargs)

    @contextlib.contextmanager
    def mesh_context(self) -> Iterator[None]:
        if self.mesh is None:
            yield
            return
        with jax.sharding.use_abstract_mesh(self.mesh):
            yield


class _Forward:
    """The forward node: ``f``'s output leaves as a flat tuple."""

    __slots__ = ("call", "__weakref__")

    def __init__(self, call: _Call) -> None:
        self.call = call

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        return tuple(jax.tree_util.tree_leaves(self.call(*vals)))


class _Backward:
    """The backward node: gradients of the differentiated inputs by ``jax.vjp`` (forward recomputed)."""

    __slots__ = ("fwd", "n_in", "diff", "out_avals", "present", "__weakref__")

    def __init__(
        self, fwd: _Forward, n_in: int, diff: tuple[int, ...], out_avals: tuple[Any, ...], present: tuple[bool, ...]
    ) -> None:
        self.fwd = fwd
        self.n_in = n_in
        self.diff = diff  # input positions differentiated
        self.out_avals = out_avals  # (shape, dtype) per output
        self.present = present  # per output: a cotangent is among the node's inputs

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        primals, given = list(vals[: self.n_in]), iter(vals[self.n_in :])

        def of_diff(*d: Any) -> tuple[Any, ...]:
            full = list(primals)
            for i, v in zip(self.diff, d):
                full[i] = v
            return self.fwd(*full)

        _, vjp = jax.vjp(of_diff, *(primals[i] for i in self.diff))
        cts: list[Any] = []
        for (shape, dt), p in zip(self.out_avals, self.present):
            if not jnp.issubdtype(dt, jnp.inexact):
                cts.append(np.zeros(shape, jax.dtypes.float0))
            else:
                cts.append(next(given) if p else jnp.zeros(shape, dt))
        return tuple(vjp(tuple(cts)))


def _node_name(key: Hashable, call: _Call) -> Hashable:
    statics = tuple((type(v), v) for i, v in enumerate(call.statics) if i not in call.dynamic)
    return ("call_jax", key, call.treedef, statics, call.dynamic, call.mesh)


class _CallJaxAutograd(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fwd: _Forward, name: Hashable, out_meta: tuple, extra: tuple, *tensors: torch.Tensor) -> Any:
        outs = _record(fwd, name, out_meta, [read_value(t) for t in tensors] + list(extra))
        ctx.fwd, ctx.name, ctx.out_meta, ctx.extra = fwd, name, out_meta, extra
        ctx.in_meta = [(tuple(t.shape), t.dtype) for t in tensors]
        ctx.diff = tuple(i for i, t in enumerate(tensors) if t.requires_grad and t.is_floating_point())
        ctx.save_for_backward(*tensors)
        ctx.mark_non_differentiable(*(o for o in outs if not o.is_floating_point()))
        return tuple(outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        tensors = ctx.saved_tensors
        result: list[torch.Tensor | None] = [None] * len(tensors)
        float_grads = [g if dt.is_floating_point else None for g, (_, dt) in zip(grads, ctx.out_meta)]
        if not ctx.diff or all(g is None for g in float_grads):
            return (None, None, None, None, *result)
        present = tuple(g is not None for g in float_grads)
        out_avals = tuple((shape, _dtypes.to_jax_dtype(dt)) for shape, dt in ctx.out_meta)
        n_in = len(tensors) + len(ctx.extra)
        bwd = _Backward(ctx.fwd, n_in, ctx.diff, out_avals, present)
        inputs = [read_value(t) for t in tensors] + list(ctx.extra)
        inputs += [read_value(g) for g in float_grads if g is not None]
        grad_avals = [(ctx.in_meta[i][0], _dtypes.to_jax_dtype(ctx.in_meta[i][1])) for i in ctx.diff]
        refs = record(bwd, ("call_jax_vjp", ctx.name, present), slot_template(len(inputs)), inputs, grad_avals)
        refs = [refs] if len(grad_avals) == 1 else refs
        for i, r in zip(ctx.diff, refs):
            result[i] = new_base(r, ctx.in_meta[i][1])
        return (None, None, None, None, *result)


def _record(fwd: _Forward, name: Hashable, out_meta: tuple, inputs: list[Any]) -> list[XlaTensor]:
    avals = [(shape, _dtypes.to_jax_dtype(dt)) for shape, dt in out_meta]
    refs = record(fwd, name, slot_template(len(inputs)), inputs, avals)
    refs = [refs] if len(avals) == 1 else refs
    return [new_base(r, dt) for r, (_, dt) in zip(refs, out_meta)]


def _active_mesh() -> jax.sharding.AbstractMesh | None:
    """JAX's mesh if the caller set one, else spmdtorch's global mesh, else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty:
        return mesh
    gm = get_global_mesh()
    return None if gm is None else gm.jax_mesh.abstract_mesh


def call_jax(
    jax_func: Callable[..., Any],
    args: tuple[Any, ...] | list[Any],
    kwargs: dict[str, Any] | None = None,
    name: str | None = None,
    override_hash: Hashable | None = None,
) -> Any:
    """Call ``jax_func(*args, **kwargs)`` on xla tensors inside the traced program.

    Args:
        jax_func: a pure function of JAX arrays, traceable by ``jax.jit``.
        args: positional arguments (a tuple or list); xla tensors in it
            arrive as JAX arrays.
        kwargs: keyword arguments, the same way.
        name: a label for the computation (PyTorch/XLA names its HLO with
            it); accepted and not part of the node's identity.
        override_hash: the node's identity instead of ``jax_func`` itself
            (for a function re-created every step).

    Returns:
        ``jax_func``'s output pytree with each JAX array an xla tensor.

    Raises:
        CallJaxTypeError: ``jax_func`` not callable, ``args`` not a tuple or
            list, ``kwargs`` not a dict, a torch tensor not on the xla device,
            or a non-tensor leaf that is not hashable.
        CallJaxError: ``jax_func`` failed to trace on the arguments' shapes
            (JAX's error, e.g. an output that is not an array, is in the message).

    Example:
        >>> import torch, jax.numpy as jnp, spmdtorch
        >>> x = torch.arange(4.0, device="xla")
        >>> out = spmdtorch.call_jax(lambda v, k: {"y": v * k}, (x,), {"k": 3})
        >>> out["y"].cpu().tolist()
        [0.0, 3.0, 6.0, 9.0]
    """
    _checks.check_callable(jax_func, "call_jax", "jax_func", CallJaxTypeError)
    if not isinstance(args, (tuple, list)):
        _checks.fail(CallJaxTypeError, "call_jax", "args", "a tuple (or list) of positional arguments", args)
    if kwargs is not None and not isinstance(kwargs, dict):
        _checks.fail(CallJaxTypeError, "call_jax", "kwargs", "a dict of keyword arguments or None", kwargs)
    if name is not None:
        _checks.check_str(name, "call_jax", "name", CallJaxTypeError)
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs or {})))
    statics: list[Any] = list(leaves)
    dynamic: list[int] = []
    tensors: list[torch.Tensor] = []
    arrays: list[Any] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            if not isinstance(leaf, XlaTensor):
                raise CallJaxTypeError(
                    f"call_jax: argument leaf {i} is a torch tensor on {leaf.device}, not an xla tensor; "
                    "move it with .to('xla') (JAX arrays and numpy arrays may also be passed)"
                )
            tensors.append(leaf)
        elif isinstance(leaf, (jax.Array, np.ndarray)):
            arrays.append(jnp.asarray(leaf))
        else:
            try:
                hash(leaf)
            except TypeError:
                raise CallJaxTypeError(
                    f"call_jax: argument leaf {i} ({type(leaf).__name__}) is neither a tensor/array nor "
                    "hashable; non-tensor arguments are static parts of the call's identity. Pass it as a "
                    "tensor, or bind it in jax_func (functools.partial) with override_hash"
                ) from None
            continue
        statics[i] = None
        dynamic.append(i)
    # The node's inputs: the xla tensors first (autograd's), then the concrete arrays.
    order = [i for i in dynamic if isinstance(leaves[i], torch.Tensor)] + [
        i for i in dynamic if not isinstance(leaves[i], torch.Tensor)
    ]
    call = _Call(jax_func, treedef, tuple(statics), tuple(order), _active_mesh())
    fwd = _Forward(call)
    in_vals = [read_value(t) for t in tensors] + arrays
    try:
        out_shapes = jax.eval_shape(call, *(aval_of(v) for v in in_vals))
    except Exception as e:
        raise CallJaxError(
            f"call_jax: {getattr(jax_func, '__name__', jax_func)!r} failed to trace on the arguments' shapes "
            f"({[tuple(aval_of(v).shape) for v in in_vals]}): {type(e).__name__}: {e}"
        ) from e
    out_leaves, out_tree = jax.tree_util.tree_flatten(out_shapes)
    if not out_leaves:
        return jax.tree_util.tree_unflatten(out_tree, [])
    out_meta = tuple((tuple(o.shape), _dtypes.to_torch_dtype(o.dtype)) for o in out_leaves)
    node_name = _node_name(jax_func if override_hash is None else override_hash, call)
    # Concrete arrays are node inputs too (not constants of a cached program), never differentiated.
    extra = tuple(arrays)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        outs = list(_CallJaxAutograd.apply(fwd, node_name, out_meta, extra, *tensors))
    else:
        outs = _record(fwd, node_name, out_meta, [read_value(t) for t in tensors] + list(extra))
    return jax.tree_util.tree_unflatten(out_tree, outs)
