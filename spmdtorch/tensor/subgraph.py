"""Recording a torch function once into a JAX function: a sub-graph of the lazy graph.

Higher-order constructs (``shard_map`` regions, ``spmdtorch.scan``) run torch
code once on *placeholder* xla tensors, then turn what was recorded into one
JAX callable that becomes a single node of the enclosing lazy graph (the body
of a ``jax.shard_map``, of a ``jax.lax.scan``...). This module is that shared
step:

* :func:`begin` makes the placeholders (fresh xla tensors whose values are
  marker leaves, so the recorded ops read them like ordinary tensors);
* the caller runs the torch code on them;
* :func:`end` cuts the recorded graph out of the enclosing one and returns a
  :class:`Subgraph`: ``fn(*args, *captured)`` plus the captured values.

The cut: a node belongs to the body exactly when it depends on a placeholder.
Everything else the body reads (tensors captured from outside, constants,
ops recorded inside the region that read only outside values) is a
*captured* input: computed once by the enclosing program and passed in, so a
scan does not recompute it per iteration and nothing outside is duplicated.

Example:
    >>> import torch, spmdtorch
    >>> from spmdtorch.tensor import subgraph
    >>> rec = subgraph.begin([((2,), torch.float32)])
    >>> sub = subgraph.end(rec, [rec.placeholders[0] * 2 + 1])
    >>> sub.out_avals
    (((2,), dtype('float32')),)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from spmdtorch import _dtypes, lazy
from spmdtorch.lazy import executor, graph
from spmdtorch.lazy.graph import LazyRef, Node, Slot
from spmdtorch.tensor._values import read_value
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["Recording", "Subgraph", "SubgraphError", "abort", "begin", "end"]


class SubgraphError(RuntimeError):
    """A recorded body (scan, shard_map region) was used in a way it cannot be."""


class _ArgLeaf:
    """Stands for argument ``i`` of the body inside the recorded graph.

    Only the body's JAX function ever sees it. If the executor meets it, a
    tensor computed from a placeholder is being evaluated on its own:
    ``.item()``/``bool()``/``.cpu()`` inside the body (data-dependent control
    flow), or a body tensor that escaped (kept, or written into an outside tensor).
    """

    __slots__ = ("i", "what")

    def __init__(self, i: int, what: str) -> None:
        self.i = i
        self.what = what

    @property
    def shape(self) -> Any:
        raise SubgraphError(
            f"a value computed inside {self.what} was needed outside it: either the body reads a value "
            "on the host (.item(), bool(t), .tolist(), .cpu(), Python `if` on a tensor: data-dependent "
            "control flow, which a compiled body cannot have), or a tensor computed in the body escaped "
            "(stored on a module/list, or written in place into a tensor from outside). Make the body "
            "branch-free with torch.where, and return every tensor you need from it"
        )

    sharding = dtype = shape


class _Captured:
    """Stands for captured input ``k`` (an outside value) inside the cut body graph."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


def _identity(x: Any) -> Any:
    return x


@dataclasses.dataclass(slots=True)
class Recording:
    """An open recording: the placeholders the torch code runs on.

    Attributes:
        placeholders: one fresh xla tensor per argument.
        what: how errors name the construct ("the body of spmdtorch.scan").
        nodes: the placeholders' marker nodes (by position).
        refs: the placeholders' initial values (a body that writes into a
            placeholder in place is refused at :func:`end`).
        start_seq: pending values set after this were set inside the region.
        start_draw: random nodes drawn after this were recorded inside the region.
        pinned: nodes that belong to the body whatever they read (see :meth:`pin`).
    """

    placeholders: list[XlaTensor]
    what: str
    nodes: list[Node]
    refs: list[LazyRef]
    start_seq: int
    start_draw: int
    pinned: list[Node] = dataclasses.field(default_factory=list)

    def pin(self, ref: LazyRef) -> None:
        """Keep ``ref``'s node in the body even if it reads no placeholder.

        For ops whose meaning depends on where they run (a collective or
        ``axis_index`` inside a shard_map body): hoisted out, they would run
        outside the region.
        """
        self.pinned.append(ref.node)


def begin(avals: Sequence[tuple[Sequence[int], torch.dtype]], what: str = "a recorded body") -> Recording:
    """Open a recording: placeholder xla tensors of the given shapes and dtypes.

    Args:
        avals: ``(shape, torch dtype)`` per argument.
        what: names the construct in errors.
    """
    start_seq = next(lazy.SEQ)  # before the placeholders: they are body-local pending values too
    placeholders, nodes, refs = [], [], []
    for i, (shape, dtype) in enumerate(avals):
        aval = (tuple(shape), _dtypes.to_jax_dtype(dtype))
        node = Node(_identity, ("subgraph_arg", i), ((Slot(0),), ()), [_ArgLeaf(i, what)], ((Slot(0),), ()), (aval,))
        ref = LazyRef(node, 0)
        nodes.append(node)
        refs.append(ref)
        placeholders.append(new_base(ref, dtype))
    # Peeking the draw counter consumes one number: draw ranks are relative, so that is harmless.
    return Recording(placeholders, what, nodes, refs, start_seq, next(graph._DRAWS))


def abort(rec: Recording) -> None:
    """Drop an open recording whose body raised: its pending values leave the pending set."""
    for st in list(lazy.PENDING):
        if st.pseq > rec.start_seq:
            lazy.PENDING.discard(st)


@dataclasses.dataclass(frozen=True, slots=True)
class Subgraph:
    """A recorded body as one JAX function.

    Attributes:
        fn: ``fn(*args, *captured_values) -> tuple`` of the outputs (JAX values).
        captured: the outside values the body reads, in order: ``LazyRef``,
            ``jax.Array`` or ``graph.Scalar`` (inputs of the node that runs it).
        key: a hashable structural identity (equal keys: equal functions).
        out_avals: ``((shape, jax dtype), ...)`` per output.
        out_dtypes: the outputs' torch dtypes.
        has_random: the body itself draws random numbers.
    """

    fn: Callable[..., tuple[Any, ...]]
    captured: tuple[Any, ...]
    key: Hashable
    out_avals: tuple[tuple[tuple[int, ...], Any], ...]
    out_dtypes: tuple[torch.dtype, ...]
    has_random: bool


def _inside_nodes(rec: Recording, roots: Sequence[Node]) -> dict[int, bool]:
    """``id(node) -> whether it depends on a placeholder`` for every node reachable from ``roots``."""
    inside: dict[int, bool] = {id(n): True for n in rec.nodes}
    pinned = {id(n) for n in rec.pinned}
    for root in roots:
        if id(root) in inside:
            continue
        stack = [(root, iter(root.inputs))]
        while stack:
            n, it = stack[-1]
            for i in it:
                if type(i) is LazyRef and id(i.node) not in inside:
                    stack.append((i.node, iter(i.node.inputs)))
                    break
            else:
                stack.pop()
                inside[id(n)] = id(n) in pinned or any(type(i) is LazyRef and inside[id(i.node)] for i in n.inputs)
    return inside


def end(rec: Recording, outs: Sequence[torch.Tensor], arg_names: Sequence[str] | None = None) -> Subgraph:  # noqa: C901, PLR0915  (why: cuts one recording into a Subgraph in a single pass over its nodes; the pass shares its tables)
    """Close ``rec``: cut the graph behind ``outs`` into a :class:`Subgraph`.

    Args:
        rec: the open recording.
        outs: the body's result tensors (xla tensors).
        arg_names: names of the placeholders for errors (default ``argument i``).

    Raises:
        SubgraphError: an output is not an xla tensor, or the body wrote into a
            placeholder in place (a buffer update: its value would be lost).
    """
    names = list(arg_names) if arg_names is not None else [f"argument {i}" for i in range(len(rec.placeholders))]
    for k, o in enumerate(outs):
        if not isinstance(o, XlaTensor):
            raise SubgraphError(f"{rec.what} returned a {type(o).__name__} as output {k}; it must return xla tensors")
    for i, (p, ref) in enumerate(zip(rec.placeholders, rec.refs)):
        if p._st.value is not ref:
            raise SubgraphError(
                f"{rec.what} modified {names[i]} in place (e.g. a running-statistics buffer update); the update "
                "would be lost. Return the new value from the body instead, or run this module unrolled"
            )
    refs = [read_value(o) for o in outs]
    # Tensors computed inside the region are body-local: they must not join
    # the enclosing program as outputs of their own.
    abort(rec)
    roots = [r.node for r in refs if type(r) is LazyRef]
    inside = _inside_nodes(rec, roots)
    arg_of = {id(n): i for i, n in enumerate(rec.nodes)}
    arg_leaves = [_ArgLeaf(i, rec.what) for i in range(len(rec.nodes))]

    captured: list[Any] = []
    cap_index: dict[tuple[int, int], int] = {}  # (id(outer node), output) -> k

    def capture(r: LazyRef) -> _Captured:
        key = (id(r.node), r.index)
        k = cap_index.get(key)
        if k is None:
            k = cap_index[key] = len(captured)
            captured.append(r)
        return _Captured(k)

    # Clone the body's nodes with their inputs re-pointed: placeholders become
    # argument leaves, outside nodes captured leaves. Post-order from the roots.
    clones: dict[int, Node] = {}
    has_random = False

    def mapped(i: Any) -> Any:
        if type(i) is not LazyRef:
            return i  # a concrete array or Scalar: a leaf of the body plan
        n = i.node
        a = arg_of.get(id(n))
        if a is not None:
            return arg_leaves[a]
        if inside[id(n)]:
            return LazyRef(clones[id(n)], i.index)
        return capture(i)

    for root in roots:
        if not inside[id(root)] or id(root) in clones or id(root) in arg_of:
            continue
        stack = [(root, iter(root.inputs))]
        while stack:
            n, it = stack[-1]
            for i in it:
                if type(i) is LazyRef:
                    m = i.node
                    if inside[id(m)] and id(m) not in clones and id(m) not in arg_of:
                        stack.append((m, iter(m.inputs)))
                        break
            else:
                stack.pop()
                if n.random and n.draw > rec.start_draw:
                    has_random = True
                c = Node(n.fn, n.name, n.template, [mapped(i) for i in n.inputs], n.static_key, n.out_avals, sig=n.sig)
                c.random, c.draw = n.random, n.draw
                clones[id(n)] = c
    # A random node recorded in the region that reads only outside values was
    # cut out as a captured input; it is still the body's own draw.
    for r in captured:
        if r.node.random and r.node.draw > rec.start_draw:
            has_random = True

    # Each output: ("body", j) the plan's j-th output, ("arg", i), or ("cap", k).
    body_refs: list[LazyRef] = []
    out_src: list[tuple[str, int]] = []
    for r in refs:
        m = mapped(r)
        if type(m) is LazyRef:
            out_src.append(("body", len(body_refs)))
            body_refs.append(m)
        elif type(m) is _ArgLeaf:
            out_src.append(("arg", m.i))
        elif type(m) is _Captured:
            out_src.append(("cap", m.k))
        else:  # a concrete value returned as is
            out_src.append(("cap", len(captured)))
            captured.append(m)
    leaf_src: list[tuple[str, int]] = []
    inner: Callable[..., Any] | None = None
    plan_key: Any = None
    if body_refs:
        plan = executor._Plan(body_refs)
        for leaf in plan.leaves:
            if type(leaf) is _ArgLeaf:
                leaf_src.append(("arg", leaf.i))
            elif type(leaf) is _Captured:
                leaf_src.append(("cap", leaf.k))
            else:
                leaf_src.append(("cap", len(captured)))
                captured.append(leaf)
        inner = executor._make_fn(plan)
        plan_key = plan.key
    n_args = len(rec.placeholders)
    key = ("subgraph", plan_key, tuple(leaf_src), tuple(out_src), n_args, len(captured))
    fn = _Body(inner, tuple(leaf_src), tuple(out_src), n_args)
    out_avals = tuple((tuple(o.shape), _dtypes.to_jax_dtype(o.dtype)) for o in outs)
    return Subgraph(fn, tuple(captured), key, out_avals, tuple(o.dtype for o in outs), has_random)


class _Body:
    """The cut body as ``fn(*args, *captured) -> tuple`` (picks leaves and outputs by source)."""

    __slots__ = ("inner", "leaf_src", "out_src", "n_args")

    def __init__(
        self,
        inner: Callable[..., Any] | None,
        leaf_src: tuple[tuple[str, int], ...],
        out_src: tuple[tuple[str, int], ...],
        n_args: int,
    ) -> None:
        self.inner = inner
        self.leaf_src = leaf_src
        self.out_src = out_src
        self.n_args = n_args

    def __call__(self, *vals: Any) -> tuple[Any, ...]:
        args, caps = vals[: self.n_args], vals[self.n_args :]
        src: dict[str, Sequence[Any]] = {"arg": args, "cap": caps}
        res: Sequence[Any] = ()
        if self.inner is not None:
            res = self.inner(*[src[kind][i] for kind, i in self.leaf_src])
        src["body"] = res
        return tuple(src[kind][i] for kind, i in self.out_src)
