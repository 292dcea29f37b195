"""What a recorded body that becomes one differentiable node needs, shared by ``scan`` and ``assume_pure``.

Both record torch code once on placeholders (``spmdtorch.tensor.subgraph``)
and run it as ONE node of the lazy graph; with grad, a forward node returns
``jax.vjp``'s outputs and residuals and a backward node applies the VJP. This
module holds the parts that do not depend on what the body is: the abstract
value of a node input, the weak-type fix both traces need, the all-slots
template, and the check that the body did not close over a tensor that
requires grad (it would silently get no gradient).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from spmdtorch.lazy.graph import Scalar, Slot

__all__ = [
    "apply_vjp",
    "aval_of",
    "captured_grad_origin",
    "sequence_nr_now",
    "slot_template",
    "strong",
    "vjp_with_residuals",
]


def aval_of(v: Any) -> jax.ShapeDtypeStruct:
    """The abstract value a node input (array, ``LazyRef`` or ``Scalar``) has inside the program.

    A Python ``int``/``float`` ``Scalar`` is weakly typed, as when it is traced.
    """
    if type(v) is Scalar:
        t = type(v.value)
        if t is bool:
            return jax.ShapeDtypeStruct((), np.dtype(np.bool_))
        if t is int:
            return jax.ShapeDtypeStruct((), np.dtype(np.int32), weak_type=True)
        if isinstance(v.value, np.generic):
            return jax.ShapeDtypeStruct((), v.value.dtype)
        return jax.ShapeDtypeStruct((), np.dtype(np.float32), weak_type=True)
    return jax.ShapeDtypeStruct(tuple(v.shape), v.dtype)


def strong(vals: Sequence[Any], avals: Sequence[jax.ShapeDtypeStruct]) -> list[Any]:
    """Inputs with the weak-typedness the residuals were shaped for (so the shape pass and the program agree)."""
    return [v if a.weak_type else jax.lax.convert_element_type(v, a.dtype) for v, a in zip(vals, avals)]


def slot_template(n: int) -> tuple[tuple[Slot, ...], tuple[()]]:
    """The template of a node whose ``n`` inputs are all positional and dynamic."""
    return (tuple(Slot(i) for i in range(n)), ())


def sequence_nr_now() -> int:
    """The autograd sequence number the next recorded node gets (nodes made later have larger ones)."""
    probe = torch.zeros((), requires_grad=True)
    nr: int = (probe * 1).grad_fn._sequence_nr()  # type: ignore[union-attr]
    return nr + 1


def captured_grad_origin(outs: Sequence[torch.Tensor], placeholders: Sequence[torch.Tensor], start: int) -> str | None:
    """What the body's outputs depend on, through autograd, from outside that requires grad (None: nothing).

    Such a tensor would be captured as a constant and get no gradient:
    silently wrong, so the callers refuse the body. ``start`` is
    :func:`sequence_nr_now` taken before the body ran.
    """
    own = {id(p) for p in placeholders}
    # id -> the node object, held: torch may hand out a new Python object for
    # a graph node at each access (torch 2.11 does), and a freed one's id
    # can be reused by the next, which would then be skipped as seen.
    seen: dict[int, Any] = {}
    stack: list[Any] = [o.grad_fn for o in outs if o.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = fn
        var = getattr(fn, "variable", None)
        if var is not None:
            if id(var) not in own:
                return f"a tensor of shape {tuple(var.shape)}, dtype {var.dtype}"
            continue
        if fn._sequence_nr() < start:
            return f"a tensor computed before it by {fn.name()}"
        stack.extend(nf for nf, _ in fn.next_functions)
    return None


def vjp_with_residuals(
    run: Callable[..., Sequence[Any]],
    full: Sequence[Any],
    diff: Sequence[int],
    float_out: Sequence[bool],
    remat: bool = False,
) -> tuple[list[Any], list[Any], Any]:
    """The forward node's work: ``jax.vjp`` of ``run(*full)`` with respect to the positions ``diff``.

    Only the outputs marked in ``float_out`` get cotangents (the others are
    carried as auxiliary outputs). ``remat``: ``jax.checkpoint`` the function,
    so backward recomputes its activations.

    Returns:
        ``(outputs in order, residual leaves, the VJP's tree structure)``:
        the residuals are the node's extra outputs, the tree rebuilds the VJP
        from them in :func:`apply_vjp`.
    """

    def f(*dv: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        args = list(full)
        for i, v in zip(diff, dv):
            args[i] = v
        out = run(*args)
        return (
            tuple(o for o, fl in zip(out, float_out) if fl),
            tuple(o for o, fl in zip(out, float_out) if not fl),
        )

    g = jax.checkpoint(f) if remat else f
    prim, vjp_fn, aux = jax.vjp(g, *(full[i] for i in diff), has_aux=True)
    res, tree = jax.tree_util.tree_flatten(vjp_fn)
    pi, ai = iter(prim), iter(aux)
    return [next(pi) if fl else next(ai) for fl in float_out], res, tree


def apply_vjp(
    tree: Any, res: Sequence[Any], given: Sequence[Any], ct_avals: Sequence[Any], present: Sequence[bool]
) -> tuple[Any, ...]:
    """The backward node's work: the VJP rebuilt from its residuals, applied to the cotangents.

    ``given`` holds the cotangents that exist, in order; a float output
    without one (``present`` False) gets zeros of its ``ct_avals`` shape and dtype.
    """
    vjp_fn = jax.tree_util.tree_unflatten(tree, res)
    it = iter(given)
    cts = tuple(
        jax.lax.convert_element_type(next(it), dt) if p else jnp.zeros(shape, dt)
        for (shape, dt), p in zip(ct_avals, present)
    )
    return tuple(vjp_fn(cts))
