"""The lazy graph: nodes recorded per ATen op, values that point into them.

A ``Node`` is one recorded op: its lowering, a hashable *template* of its
static arguments, and its dynamic inputs (``LazyRef`` to other nodes, concrete
``jax.Array`` data, or ``Scalar`` runtime scalars). Nothing here runs JAX; the
executor turns a set of nodes into one ``jax.jit`` program.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, final

import numpy as np
from jax.typing import DTypeLike

from spmdtorch.lazy import caches
from spmdtorch.lazy.contract import TRACE_OWNER, wait_turn

__all__ = ["Aval", "LazyRef", "Node", "Scalar", "Slot", "fill", "interned_scalar"]

#: An output's abstract value: ``(shape, dtype)``; the dtype as JAX takes it
#: (a ``numpy.dtype`` or a scalar type such as ``jnp.int32``).
Aval = tuple[tuple[int, ...], DTypeLike]


_SLOTS: list[Slot] = []


class Slot:
    """Placeholder for input ``i`` inside a node's argument template.

    Interned: ``Slot(i)`` is always the same object, so a template hashes and
    compares by identity, in C (graph and shape-cache keys hold thousands of
    slots per step; a Python ``__hash__``/``__eq__`` per slot was a visible
    part of tracing). Two slots are equal exactly when their indices are, and a
    slot never equals a number, so ``(Slot(1),)`` and ``(1,)`` stay distinct keys.
    The table holds one object per index up to the widest node recorded.
    """

    __slots__ = ("i",)
    i: int  # set once, when the slot is interned

    def __new__(cls, i: int) -> Slot:
        if type(i) is int and 0 <= i < len(_SLOTS):
            return _SLOTS[i]
        if type(i) is not int or i < 0:
            raise TypeError(f"Slot index must be a non-negative int, got {i!r}")
        while len(_SLOTS) <= i:
            slot = object.__new__(cls)
            slot.i = len(_SLOTS)
            _SLOTS.append(slot)
        return _SLOTS[i]

    def __reduce__(self) -> tuple[type[Slot], tuple[int]]:  # copies and pickles come back as the interned object
        return (Slot, (self.i,))

    def __repr__(self) -> str:
        return f"${self.i}"


def fill(x: Any, vals: Sequence[Any]) -> Any:
    """``x`` (a node template's argument) with each ``Slot(i)``, also inside tuples, replaced by ``vals[i]``.

    Example:
        >>> fill((Slot(1), (2, Slot(0))), ["a", "b"])
        ('b', (2, 'a'))
    """
    t = type(x)
    if t is Slot:
        return vals[x.i]
    if t is tuple:
        return tuple(fill(y, vals) for y in x)
    return x


@final  # no subclasses: ``type(x) is Scalar`` tests then narrow for mypy, both ways
class Scalar:
    """A Python number passed as a runtime input (so its value is not baked in).

    The graph key holds only its type, so a learning rate that changes every
    step reuses one compiled program, as in PyTorch/XLA.
    """

    __slots__ = ("value",)

    def __init__(self, value: complex | np.number[Any]) -> None:
        # A Python number (int, float and bool are complex's subtypes for
        # typing) or a NumPy scalar (scan's step counters).
        self.value = value

    def __repr__(self) -> str:
        return f"Scalar({self.value!r})"


# (context, type, value) -> Scalar. Bounded: lazy-mode values that change every
# step (Adam's bias corrections) would otherwise accumulate.
_INTERNED = caches.bounded("lazy.graph.interned_scalars", maxsize=4096)


def interned_scalar(value: float, context: object) -> Scalar:
    """One shared ``Scalar`` for equal Python numbers passed in the same ``context``.

    Why: a program takes one input per distinct ``Scalar`` object (packed into
    a vector that each use slices). An optimizer passes the same
    hyper-parameters (``1 - beta1``, ``-lr / bias_correction``...) once per
    parameter; as distinct inputs each parameter's update fusion slices its
    own offset, so XLA compiles a separate kernel per parameter where one
    would do, and cannot share the scalar arithmetic. Sharing the object
    makes equal numbers one input. Since the graph key records which inputs
    a node reads, a program that relies on two numbers being equal is only
    reused while they are. ``context`` (the ATen op) keeps numbers that are
    equal by coincidence in unrelated ops apart, so that such a coincidence
    at one step does not change the key at the next.

    Example:
        >>> interned_scalar(0.5, "op") is interned_scalar(0.5, "op")
        True
        >>> interned_scalar(0.5, "op") is interned_scalar(0.5, "other op")
        False
    """
    t = type(value)
    key = (context, t, value.hex() if t is float else value)  # hex: 0.0 and -0.0 stay apart
    s = _INTERNED.get(key)
    if s is None:
        s = Scalar(value)
        _INTERNED.put(key, s)
    return s


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
        sig: an int that stands for ``(name, static_key)`` in graph keys
            (``lazy.keys.node_sig``), or None until one is assigned.
    """

    __slots__ = ("fn", "name", "template", "inputs", "static_key", "out_avals", "random", "draw", "sig", "__weakref__")

    def __init__(
        self,
        fn: Callable[..., Any],
        name: Any,
        template: Any,
        inputs: Sequence[Any],
        static_key: Any,
        out_avals: Sequence[Aval],
        random: bool = False,
        sig: int | None = None,
    ) -> None:
        if TRACE_OWNER[0] is not None:  # a trace is under way; another thread's waits for its end
            wait_turn()
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
        # An int standing for (name, static_key) in graph keys (the executor's
        # interning; the recorder passes it when it already knows it). None: not yet.
        self.sig = sig

    def __repr__(self) -> str:
        return f"Node({self.name}, inputs={len(self.inputs)})"


@final  # no subclasses: ``type(x) is LazyRef`` tests then narrow for mypy, both ways
class LazyRef:
    """Output ``index`` of ``node``: a pending value with a known shape/dtype."""

    __slots__ = ("node", "index")

    def __init__(self, node: Node, index: int) -> None:
        self.node = node
        self.index = index

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.out_avals[self.index][0]

    @property
    def dtype(self) -> DTypeLike:
        return self.node.out_avals[self.index][1]

    def __repr__(self) -> str:

        return f"LazyRef({self.node.name}[{self.index}])"
