"""Cheap, collision-free graph keys: node signatures and bounded caches.

A graph key must compare a whole step's structure (op names, static
arguments, wiring) on every ``sync()``. Hashing and comparing ~1,000 nested
templates, with Python-level ``OpOverload.__hash__`` inside, cost
milliseconds per step. Instead each distinct ``(name, static_key)`` is
*interned* once into a small int, its signature; a graph key is then a tuple
of ints, hashed and compared in C.

Why this cannot return a wrong program: a signature is handed out once, from
a counter that never goes back, for one exact ``(name, static_key)`` (found by
full equality, never by hash alone, and with each number's type: Python finds
``2 == 2.0 == True`` and ``0.0 == -0.0``, which are different arguments to
``torch.full`` or ``arange``). Equal signatures therefore mean equal content.
When the intern table is full its oldest quarter is forgotten; content seen
again then gets a *new* signature, which can only cause a cache miss (a recompile),
never a hit on another program.
"""

from __future__ import annotations

import itertools
from typing import Any

from spmdtorch.lazy import caches

__all__ = ["SIG_TABLE_MAX", "fresh_sig", "node_sig"]

# Distinct (name, static_key) pairs kept interned. A training step has a few
# thousand; the bound only matters for programs whose static arguments never
# repeat (each such program compiles anyway).
SIG_TABLE_MAX = 1 << 16

_SIGS = caches.bounded("lazy.keys.signatures", maxsize=SIG_TABLE_MAX)
_NEXT = itertools.count()


def _typed(x: Any) -> Any:
    """``x`` with every float and bool made distinct from the ints (and -0.0 from 0.0) it equals.

    Returns ``x`` itself when it holds none (the common case: no allocation).
    """
    t = type(x)
    if t is float:
        return (float, x.hex())
    if t is bool or t is complex:
        return (t, repr(x))
    if t is not tuple and t is not list:
        return x
    out: list[Any] | None = None
    for i, v in enumerate(x):
        tv = _typed(v) if type(v) in _NOT_PLAIN else v  # skip the call for ints, Slots, names...
        if out is None and tv is not v:
            out = list(x[:i])
        if out is not None:
            out.append(tv)
    return x if out is None else t(out)


_NOT_PLAIN = (tuple, list, float, bool, complex)


def node_sig(name: Any, static_key: Any) -> int:
    """The signature of a node with this name and static key.

    Unhashable static keys get a fresh signature each time (the node then
    never matches a cached program, which is correct, only slow).

    Example:
        >>> from spmdtorch.lazy.keys import node_sig
        >>> node_sig("add", (1, 2)) == node_sig("add", (1, 2))
        True
        >>> node_sig("add", (1, 2)) == node_sig("add", (1, 3))
        False
        >>> node_sig("full", (2,)) == node_sig("full", (2.0,))
        False
    """
    key = (name, _typed(static_key))
    try:
        sig = _SIGS.get(key)
    except TypeError:
        _SIGS.bypasses += 1
        return next(_NEXT)
    if sig is None:
        # A key forgotten when the table was full gets a new number when seen
        # again: a cache miss at worst, never another content's signature.
        sig = next(_NEXT)
        _SIGS.put(key, sig)
    return sig


def fresh_sig() -> int:
    """A signature equal to no other (for nodes that must never share a program)."""
    return next(_NEXT)
