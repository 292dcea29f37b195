"""Pausing Python's cyclic garbage collector while a step is recorded and compiled.

Why: recording a step allocates thousands of short-lived graph objects (nodes,
storages, JAX tracers while the program is traced) that all die when the step
has been compiled. A collection in the middle finds them alive and promotes
them, and the promotions trigger full collections of every object torch and
JAX made (hundreds of thousands: 0.1-0.2 s each, measured on a first compiled
step of a tiny decoder). Paused, they die before any collection sees them;
reference counting still frees everything acyclic at once, and cyclic garbage
made meanwhile waits for the next collection after the pause.

Used by ``spmdtorch.step()`` (its ``pause_gc`` argument) and by
``spmdtorch.compile`` while it traces.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc(pause: bool = True) -> Iterator[None]:
    """Disable the cyclic collector for the block, re-enabling it only if it was enabled.

    Nests: an inner pause leaves the collector to the outer one.

    Example:
        >>> import gc
        >>> from spmdtorch.lazy import paused_gc
        >>> with paused_gc():
        ...     gc.isenabled()
        False
        >>> gc.isenabled()
        True
    """
    paused = pause and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()
