"""Node recording: the one function that adds an op to the lazy graph.

Every op that reaches the graph goes through ``record`` (the dispatcher's
lowered ops, view replays and inverse views, padding, manual regions), so the
two graph-wide transformations happen here once: a keyed random region
(``checkpoint_module``) makes random draws replayable, and the peephole rules
of ``spmdtorch.lazy.rewrite`` fold known patterns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from spmdtorch.lazy import rng
from spmdtorch.lazy.graph import LazyRef, Node
from spmdtorch.lazy.rewrite import RULES as _REWRITES

__all__ = ["Select", "record"]


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

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)[self.index]
