"""Barriers: ``sync``/``mark_step`` and the ``step()`` context manager."""

from __future__ import annotations

import contextlib
import gc
import itertools

from spmdtorch.lazy import _profiling
from spmdtorch.lazy.executor import sync

__all__ = ["mark_step", "step", "sync", "wait_device_ops"]


def mark_step(wait: bool = False) -> None:
    """PyTorch/XLA's name for ``sync``: run everything recorded so far."""
    sync(wait=wait)


def wait_device_ops() -> None:
    """Block until every queued execution has finished."""
    sync(wait=True)


@contextlib.contextmanager
def step(*, pause_gc: bool = True):
    """Run the body as one training step: leaving the block syncs.

    Args:
        pause_gc: pause Python's cyclic garbage collector while the step
            records and syncs; it is re-enabled when the block exits (if it
            was enabled on entry). Why: a lazy step allocates thousands of
            short-lived graph objects that all die at the sync. Collections
            during the step find them alive and promote them to the oldest
            generation, which then triggers full collections of every object
            torch and JAX created (hundreds of thousands, 0.2 s or more each)
            every few dozen steps. Paused, they die before any collection
            sees them. Reference counting still frees everything acyclic at
            once; cyclic garbage made inside the step waits for the next
            collection after it. Pass False to leave the collector alone.

    Example:
        >>> import torch, spmdtorch
        >>> w = torch.ones(3, device="xla")
        >>> with spmdtorch.step():
        ...     _ = w.mul_(2)
        >>> w.cpu()
        tensor([2., 2., 2.])
    """
    paused = pause_gc and gc.isenabled()
    if paused:
        gc.disable()
    # While profiling, each block is one step on the trace ("spmdtorch.step", step_num);
    # otherwise no annotation object is made at all (one flag test per step).
    number = next(_STEP_NUMBERS)
    annotation = _profiling.step_annotation("spmdtorch.step", number) if _profiling.STATE.active else None
    if annotation is not None:
        annotation.__enter__()
    try:
        yield
    finally:
        try:
            sync()
        finally:
            if paused:
                gc.enable()
            if annotation is not None:
                annotation.__exit__(None, None, None)


#: Numbers the ``step()`` blocks of this process (``step_num`` on profiles).
_STEP_NUMBERS = itertools.count()
