"""Barriers: ``sync``/``mark_step`` and the ``step()`` context manager."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from spmdtorch._checks import ArgumentTypeError, check_bool
from spmdtorch.lazy import executor

__all__ = ["mark_step", "step", "sync", "wait_device_ops"]


def mark_step(wait: bool = False) -> None:
    """PyTorch/XLA's name for ``sync``: run everything recorded so far."""
    sync(wait=check_bool(wait, "mark_step", "wait", ArgumentTypeError))


def sync(wait: bool = False) -> None:
    """Compute every pending live tensor in one compiled program.

    Args:
        wait: block until the results are ready (otherwise execution is async).

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(2, device="xla") + 1
        >>> spmdtorch.sync(wait=True)
    """
    executor.sync(check_bool(wait, "sync", "wait", ArgumentTypeError))


def wait_device_ops() -> None:
    """Block until every queued execution has finished."""
    executor.sync(wait=True)


def step(*, pause_gc: bool = True) -> contextlib.AbstractContextManager[None]:
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
    # Checked on the call, not on entering the block (a generator body would run only then).
    return _step(check_bool(pause_gc, "step", "pause_gc", ArgumentTypeError))


@contextlib.contextmanager
def _step(pause_gc: bool) -> Iterator[None]:
    paused = pause_gc and gc.isenabled()
    if paused:
        gc.disable()
    try:
        yield
    finally:
        try:
            sync()
        finally:
            if paused:
                gc.enable()
