"""Peephole rewrites of the lazy graph, applied as each node is recorded.

Why: torch's autograd reaches a weight through views re-derived from its base.
``F.linear`` computes ``mm(x, t(W))``; its backward computes
``mm(grad, t(t(W)))``, replayed from ``W``'s storage as two fresh transposes.
Recorded literally, the forward and backward products read two different
values, so XLA's SPMD partitioner all-gathers an FSDP-sharded weight twice,
where ``jax.grad`` of ``x @ W.T`` reads ``W.T`` in both products and gathers
it once. Three rewrites give the program the shape ``jax.grad`` gives it:

* a view of a program input (a parameter) is recorded once per input: every
  ``t(W)`` of a step is the same node (so the backward's ``t(t(W))`` starts
  from the forward's ``t(W)``);
* ``mm``/``addmm`` with an operand that is a 2-D transpose of a computed value
  read that value and contract the other dim instead
  (``ops.linalg.matmul_transposed``): ``mm(g, t(t(W)))`` reads the forward's
  ``t(W)``, and ``mm(t(x), g)`` needs no transpose of ``x``;
* a permutation of a computed value's permutation that cancels
  (``t(t(y))``, inverse ``transpose``/``permute`` pairs) is ``y`` itself.

A transpose of a program input itself is left as the one shared node (the
forward's product reads it as before, so its arithmetic is unchanged).
Each rule returns the replacement value, or None to record the node as is.
The rewrites are exact in real arithmetic; a product that reads its operand
through another layout may round differently in the last bits, as any change
of XLA's layouts may.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spmdtorch.lazy._engine import ENGINE
from spmdtorch.lazy.graph import Aval, LazyRef, Node, Slot
from spmdtorch.ops import linalg
from spmdtorch.ops.registry import get_lowering

__all__ = ["RULES", "rewrite"]

aten = torch.ops.aten

#: ``rule(name, template, inputs, out_avals)``: the value to use instead of the node, or None.
Rule = Callable[[Any, Any, Sequence[Any], Sequence[Aval]], "LazyRef | None"]


def _ndim(value: Any) -> int:  # a node input: jax.Array or LazyRef
    return len(value.shape)


def _static_args(node: Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args, kwargs = node.template
    return args[1:], dict(kwargs)


def _perm_of(name: Any, args: tuple[Any, ...], kwargs: dict[str, Any], ndim: int) -> tuple[int, ...] | None:
    """The permutation a ``t``/``transpose``/``permute`` view applies (None for other ops)."""
    ident = list(range(ndim))
    if name is aten.t.default:
        return (1, 0) if ndim == 2 else tuple(ident)
    if name is aten.transpose.int:
        if ndim < 2:
            return tuple(ident)
        d0 = kwargs.get("dim0", args[0] if args else None)
        d1 = kwargs.get("dim1", args[1] if len(args) > 1 else None)
        if d0 is None or d1 is None:
            return None
        d0, d1 = d0 % ndim, d1 % ndim
        ident[d0], ident[d1] = ident[d1], ident[d0]
        return tuple(ident)
    if name is aten.permute.default:
        dims = kwargs.get("dims", args[0] if args else None)
        if dims is None or ndim == 0 or len(dims) != ndim:
            return None
        return tuple(d % ndim for d in dims)
    return None


def _node_perm(ref: object) -> tuple[int, ...] | None:
    """The permutation ``ref``'s node applies to its one input, when it is such a view."""
    if type(ref) is not LazyRef or ref.index != 0:
        return None
    node = ref.node
    if id(node.name) not in _PERM_IDS or len(node.inputs) != 1:
        return None
    args, kwargs = _static_args(node)
    return _perm_of(node.name, args, kwargs, _ndim(node.inputs[0]))


def _fold_permutation(name: Any, template: Any, inputs: Sequence[Any], out_avals: Sequence[Aval]) -> LazyRef | None:
    """``perm2(perm1(y))`` that cancels -> ``y``, for a computed ``y``."""
    inner = _node_perm(inputs[0])
    if inner is None or type(inputs[0].node.inputs[0]) is not LazyRef:
        return None
    args, kwargs = template
    outer = _perm_of(name, args[1:], dict(kwargs), _ndim(inputs[0]))
    if outer is None or len(outer) != len(inner):
        return None
    if all(inner[o] == i for i, o in enumerate(outer)):
        return inputs[0].node.inputs[0]
    return None


# id(program input) -> (weakref to it, {(id(op), template): weakref to the view's Node}).
# Weak both ways: the cache must neither keep a replaced parameter's buffer
# alive nor outlive the graph that holds the node.
_INPUT_VIEWS: dict[int, tuple[weakref.ref[Any], dict[tuple[int, Any], weakref.ref[Node]]]] = {}
ENGINE.register_cache(
    "lazy.rewrite.input_views", _INPUT_VIEWS, bound="one entry per live program input, dropped with it (weakly held)"
)


def _forget(key: int) -> Callable[[weakref.ref[Any]], None]:
    def callback(_ref: weakref.ref[Any]) -> None:
        _INPUT_VIEWS.pop(key, None)

    return callback


def _shared_input_view(name: Any, template: Any, inputs: Sequence[Any], out_avals: Sequence[Aval]) -> LazyRef | None:
    """The node of this view of a program input, made once per input and view."""
    src = inputs[0]
    if type(src) is LazyRef:
        return None
    k = id(src)
    entry = _INPUT_VIEWS.get(k)
    if entry is None or entry[0]() is not src:
        entry = _INPUT_VIEWS[k] = (weakref.ref(src, _forget(k)), {})
    key = (id(name), template)
    node_ref = entry[1].get(key)
    node = None if node_ref is None else node_ref()
    if node is None or node.out_avals != out_avals:
        lowering = get_lowering(name)
        if lowering is None:  # rules are registered for lowered view ops only
            raise LookupError(f"the view rule of {name} found no lowering registered for it")
        node = Node(lowering.fn, name, template, inputs, template, out_avals)
        entry[1][key] = weakref.ref(node)
    return LazyRef(node, 0)


def _view_rule(name: Any, template: Any, inputs: Sequence[Any], out_avals: Sequence[Aval]) -> LazyRef | None:
    folded = _fold_permutation(name, template, inputs, out_avals)
    if folded is not None:
        return folded
    return _shared_input_view(name, template, inputs, out_avals)


def _is_foldable_transpose(value: Any) -> bool:
    """A 2-D transpose of a computed value (a transpose of a program input stays shared).

    ``value`` is a node input; typed ``Any`` because ``_node_perm`` proves it a
    ``LazyRef`` (a test mypy cannot carry across the call).
    """
    return _node_perm(value) == (1, 0) and type(value.node.inputs[0]) is LazyRef


def _fold_matmul_operands(first: int, fn: Callable[..., Any], fn_name: str) -> Rule:
    """A rule for a product whose matrix operands are the template args ``first``, ``first + 1``."""

    def rule(name: Any, template: Any, inputs: Sequence[Any], out_avals: Sequence[Aval]) -> LazyRef | None:
        args, kwargs = template
        if len(args) < first + 2:
            return None
        flags: list[bool] = []
        new_inputs: list[Any] | None = None
        for k in (first, first + 1):
            slot = args[k]
            value = inputs[slot.i] if type(slot) is Slot else None
            if value is not None and _is_foldable_transpose(value):
                if new_inputs is None:
                    new_inputs = list(inputs)
                new_inputs[slot.i] = value.node.inputs[0]
                flags.append(True)
            else:
                flags.append(False)
        if new_inputs is None:
            return None
        new_template = (args, tuple(kwargs) + (("ta", flags[0]), ("tb", flags[1])))
        node = Node(fn, fn_name, new_template, new_inputs, new_template, out_avals)
        return LazyRef(node, 0)

    return rule


_PERM_OPS = (aten.t.default, aten.transpose.int, aten.permute.default)
_PERM_IDS = frozenset(id(op) for op in _PERM_OPS)

#: ``id(OpOverload) -> rule(name, template, inputs, out_avals) -> value | None``
#: (keyed by id: ``OpOverload.__hash__`` is Python-level and this is looked up per node).
RULES: dict[int, Rule] = {id(op): _view_rule for op in _PERM_OPS}
RULES[id(aten.mm.default)] = _fold_matmul_operands(0, linalg.mm_transposed, "mm_transposed")
RULES[id(aten.addmm.default)] = _fold_matmul_operands(1, linalg.addmm_transposed, "addmm_transposed")


def rewrite(name: Any, template: Any, inputs: Sequence[Any], out_avals: Sequence[Aval]) -> LazyRef | None:
    """The value to use instead of recording ``name`` on ``inputs``, or None.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.tensor.dispatch import read_value
        >>> w, x = torch.randn(4, 3, device="xla"), torch.randn(2, 4, device="xla")
        >>> spmdtorch.sync()                    # w is now a program input, like a parameter
        >>> t_w = read_value(w.t()).node
        >>> t_w is read_value(w.t()).node       # every t(w) is one node
        True
        >>> y = read_value(x @ w.t().t()).node  # mm(x, t(t(w))), as a linear's backward has it
        >>> y.name, y.inputs[1].node is t_w     # reads the shared t(w); no other transpose
        ('mm_transposed', True)
    """
    rule = RULES.get(id(name))
    return None if rule is None else rule(name, template, inputs, out_avals)
