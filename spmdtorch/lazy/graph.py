"""The lazy graph: nodes recorded per ATen op, values that point into them.

A ``Node`` is one recorded op: its lowering, a hashable *template* of its
static arguments, and its dynamic inputs (``LazyRef`` to other nodes, concrete
``jax.Array`` data, or ``Scalar`` runtime scalars). Nothing here runs JAX; the
executor turns a set of nodes into one ``jax.jit`` program.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["Node", "LazyRef", "Scalar", "Slot"]


class Slot:
    """Placeholder for input ``i`` inside a node's argument template."""

    __slots__ = ("i",)

    def __init__(self, i: int):
        self.i = i

    def __eq__(self, other):
        return type(other) is Slot and other.i == self.i

    def __hash__(self):
        return hash(("slot", self.i))

    def __repr__(self):
        return f"${self.i}"


class Scalar:
    """A Python number passed as a runtime input (so its value is not baked in).

    The graph key holds only its type, so a learning rate that changes every
    step reuses one compiled program, as in PyTorch/XLA.
    """

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return f"Scalar({self.value!r})"


_DRAWS = itertools.count()


class Node:
    """One recorded op.

    Attributes:
        fn: ``fn(*args, **kwargs)`` on JAX values (a lowering or a helper).
        name: a stable hashable identity for the graph key (the OpOverload or a
            helper name).
        template: ``(args, kwargs)`` with dynamic inputs replaced by ``Slot``.
        inputs: dynamic inputs: ``LazyRef`` | ``jax.Array`` | ``Scalar``.
        static_key: hashable form of ``template`` (part of the graph key).
        out_avals: ``((shape, jax dtype), ...)`` of each output.
        random: the node draws random numbers (it gets ``key=``).
        draw: for a random node, its place in recording order (else -1).
    """

    __slots__ = ("fn", "name", "template", "inputs", "static_key", "out_avals", "random", "draw",
                 "__weakref__")

    def __init__(self, fn, name, template, inputs, static_key, out_avals, random=False):
        self.fn = fn
        self.name = name
        self.template = template
        self.inputs = inputs
        self.static_key = static_key
        self.out_avals = out_avals
        self.random = random
        # The executor keys each random node by its rank in recording order
        # among the program's random nodes, so the numbers drawn do not depend
        # on the non-random nodes beside them (sharding constraints, padding)
        # or on the order of the program's outputs: the same seed gives the
        # same values whatever the mesh and the annotations.
        self.draw = next(_DRAWS) if random else -1

    def __repr__(self):
        return f"Node({self.name}, inputs={len(self.inputs)})"


class LazyRef:
    """Output ``index`` of ``node``: a pending value with a known shape/dtype."""

    __slots__ = ("node", "index")

    def __init__(self, node: Node, index: int):
        self.node = node
        self.index = index

    @property
    def shape(self) -> tuple:
        return self.node.out_avals[self.index][0]

    @property
    def dtype(self) -> Any:
        return self.node.out_avals[self.index][1]

    def __repr__(self):
        return f"LazyRef({self.node.name}[{self.index}])"
