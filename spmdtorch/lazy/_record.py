"""Node recording: the one function that adds an op to the lazy graph.

Every op that reaches the graph goes through ``record`` (the dispatcher's
lowered ops, view replays and inverse views, padding, manual regions), so the
two graph-wide transformations happen here once: a keyed random region
(``checkpoint_module``) makes random draws replayable, and the peephole rules
of ``spmdtorch.lazy.rewrite`` fold known patterns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from spmdtorch.lazy import caches, keys, rng
from spmdtorch.lazy.graph import LazyRef, Node, Slot, fill
from spmdtorch.lazy.rewrite import RULES as _REWRITES

__all__ = ["Batched", "Part", "Select", "record", "record_batch"]


def record(
    fn: Callable[..., Any],
    name: Any,
    template: Any,
    inputs: Sequence[Any],
    out_avals: Sequence[Any],
    *,
    random: bool = False,
    out_index: int | None = None,
    sig: int | None = None,
) -> Any:
    """Record one node; return its LazyRef (or a list of LazyRefs for several outputs).

    Typed ``Any``: which of the two depends on ``len(out_avals)``; callers know it.

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
        node.fn = Select(fn, out_index)
        node.name = (name, "select", out_index)
    if len(out_avals) == 1:
        return LazyRef(node, 0)
    return [LazyRef(node, i) for i in range(len(out_avals))]


class Select:
    """``fn(...)[index]`` as a picklable-ish callable with a stable identity."""

    __slots__ = ("fn", "index")

    def __init__(self, fn: Callable[..., Any], index: int) -> None:
        self.fn = fn
        self.index = index

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)[self.index]


class Part(NamedTuple):
    """One single-output op of a :func:`record_batch` (what :func:`record` would take for it)."""

    fn: Callable[..., Any]
    name: Any
    template: Any
    inputs: Sequence[Any]
    out_aval: Any
    sig: int | None = None


class Batched:
    """Several single-output ops as one node's function: ``fn(*their inputs, in order)`` -> their outputs.

    ``parts`` holds, per op, ``(fn, (args, kwargs) template, first input, number of inputs)``.
    """

    __slots__ = ("parts",)

    def __init__(self, parts: tuple[tuple[Callable[..., Any], Any, int, int], ...]) -> None:
        self.parts = parts

    def __call__(self, *vals: Any) -> list[Any]:
        outs = []
        for fn, (a_t, kw_t), start, n in self.parts:
            v = vals[start : start + n]
            outs.append(fn(*fill(a_t, v), **{k: fill(x, v) for k, x in kw_t}))
        return outs


@caches.memoize("lazy.record.slot_templates", maxsize=64)
def _all_slots(n: int) -> tuple[tuple[Slot, ...], tuple[()]]:
    return (tuple(Slot(i) for i in range(n)), ())


def record_batch(parts: Sequence[Part]) -> list[LazyRef]:
    """Record several independent single-output ops as ONE node; their LazyRefs, in order.

    For a ``_foreach_*`` op of an optimizer: one node per op instead of one
    per parameter keeps the graph (and the per-step walk and key over it)
    small; the program computes the same ops. The node's name is the parts'
    signatures, so equal batches share one compiled program. No rewrite
    rule applies to a batch (none matches the elementwise ops batched).
    """
    inputs: list[Any] = []
    fparts = []
    sigs = []
    avals = []
    for p in parts:
        sig = p.sig if p.sig is not None else keys.node_sig(p.name, p.template)
        fparts.append((p.fn, p.template, len(inputs), len(p.inputs)))
        inputs.extend(p.inputs)
        sigs.append(sig)
        avals.append(p.out_aval)
    template = _all_slots(len(inputs))
    # The static key is empty: the signatures fix each part's template, hence the slots.
    node = Node(Batched(tuple(fparts)), ("batch", tuple(sigs)), template, inputs, (), tuple(avals))
    return [LazyRef(node, j) for j in range(len(avals))]
