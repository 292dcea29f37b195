"""Barriers: ``sync``/``mark_step`` and the ``step()`` context manager; step closures."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from spmdtorch._checks import ArgumentTypeError, check_bool, check_callable, check_instance
from spmdtorch.lazy import executor, paused_gc, profiling

__all__ = ["add_step_closure", "mark_step", "step", "sync", "wait_device_ops"]


class _Closure(NamedTuple):
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    run_async: bool


# Closures queued by add_step_closure, run (in order) after the next
# mark_step()/step() barrier. The list is swapped out before running, so a
# closure may queue closures for the following step.
_CLOSURES: list[_Closure] = []
_CLOSURES_LOCK = threading.Lock()
# One worker: asynchronous closures run in the order they were queued.
_ASYNC: list[concurrent.futures.ThreadPoolExecutor] = []


def add_step_closure(closure: Callable[..., Any], args: Sequence[Any] = (), run_async: bool = False) -> None:
    """Run ``closure(*args)`` after the next barrier, once the step's tensors are computed.

    PyTorch/XLA's ``xm.add_step_closure``: reading tensors (logging a loss)
    inside a step would run part of the graph early; a closure reads them
    after ``mark_step()`` / leaving ``with spmdtorch.step():`` /
    ``MpDeviceLoader``'s per-batch barrier, when they are concrete. Closures
    run in the order they were added; ``run_async=True`` ones run on one
    background thread (in order among themselves) so the next step can start.

    Args:
        closure: the function to call.
        args: its positional arguments (tensors among them stay alive until it runs).
        run_async: run on a background thread instead of in the barrier's caller.

    Raises:
        ArgumentTypeError: ``closure`` is not callable, ``args`` not a tuple or
            list, or ``run_async`` not a bool (a ``TypeError``).

    Example:
        >>> import torch, spmdtorch
        >>> seen = []
        >>> loss = torch.ones(2, device="xla").sum()
        >>> spmdtorch.add_step_closure(lambda t: seen.append(t.item()), (loss,))
        >>> spmdtorch.mark_step()
        >>> seen
        [2.0]
    """
    check_callable(closure, "add_step_closure", "closure", ArgumentTypeError)
    check_instance(
        args,
        (tuple, list),
        "add_step_closure",
        "args",
        ArgumentTypeError,
        "a tuple or list of positional arguments",
        "e.g. args=(loss,)",
    )
    run_async = check_bool(run_async, "add_step_closure", "run_async", ArgumentTypeError)
    with _CLOSURES_LOCK:
        _CLOSURES.append(_Closure(closure, tuple(args), run_async))


def _run_closures() -> None:
    if not _CLOSURES:
        return
    with _CLOSURES_LOCK:
        todo = list(_CLOSURES)
        _CLOSURES.clear()
    for c in todo:
        if c.run_async:
            if not _ASYNC:
                _ASYNC.append(concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="spmdtorch-step-closure"))
            _ASYNC[0].submit(c.fn, *c.args)
        else:
            c.fn(*c.args)


# Debug hooks around each barrier (spmdtorch.compat's XLA_SAVE_TENSORS_FILE /
# XLA_METRICS_FILE): called with "before" (the step's graph still pending)
# and "after". Empty unless a debugging option registered one.
BARRIER_HOOKS: list[Callable[[str], None]] = []


def sync(wait: bool = False) -> None:
    """Compute every pending live tensor in one compiled program, then run the step closures.

    Args:
        wait: block until the results are ready (otherwise execution is async).

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(2, device="xla") + 1
        >>> spmdtorch.sync(wait=True)
    """
    wait = check_bool(wait, "sync", "wait", ArgumentTypeError)
    if BARRIER_HOOKS:
        for hook in list(BARRIER_HOOKS):
            hook("before")
    executor.sync(wait=wait)
    if BARRIER_HOOKS:
        for hook in list(BARRIER_HOOKS):
            hook("after")
    _run_closures()


def mark_step(wait: bool = False) -> None:
    """PyTorch/XLA's name for :func:`sync`: run everything recorded so far, then the step closures."""
    sync(wait=check_bool(wait, "mark_step", "wait", ArgumentTypeError))


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
            during the step find them alive and promote them, which then
            triggers full collections of every object torch and JAX created
            (hundreds of thousands, 0.2 s or more each). Paused, they die
            before any collection sees them. Measured on the tiny Llama of
            ``benchmarks/step_gc.py`` (variants alternating in blocks of 150
            steps; a 2-core machine other work loaded): with the collector
            on, a full collection in 7 of 16 blocks (its step 0.25-0.88 s)
            and 0.4-0.9 ms/step more CPU; paused, none in 32 blocks (the
            wall time per step moved more with the load than between them).
            Reference counting still frees everything acyclic at once;
            cyclic garbage made inside the step is freed by a collection of
            the young generation just before the sync (0.4 ms on that
            model), so it never becomes an output of the step's program
            (which would compute it and keep its buffer). Pass False to
            leave the collector alone (a collection then runs, or not,
            before the sync: garbage cycles may become outputs).

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


#: Open ``step()`` blocks that paused the collector (a nested block finds it paused by an outer one).
_PAUSING_STEPS = [0]


@contextlib.contextmanager
def _step(pause_gc: bool) -> Iterator[None]:
    # Ours to collect only if a step paused it: a collector the user disabled stays untouched.
    pausing = pause_gc and (gc.isenabled() or _PAUSING_STEPS[0] > 0)
    _PAUSING_STEPS[0] += pausing
    try:
        with paused_gc(pause_gc):
            # While profiling, each block is one step on the trace ("spmdtorch.step", step_num);
            # otherwise no annotation object is made at all (one flag test per step).
            number = next(_STEP_NUMBERS)
            annotation = profiling.step_annotation("spmdtorch.step", number) if profiling.STATE.active else None
            if annotation is not None:
                annotation.__enter__()
            try:
                yield
            finally:
                try:
                    if pausing:
                        # Everything made since the collector was paused is in the young generation, so
                        # collecting it frees the step's garbage cycles: their pending storages leave the
                        # (weakly held) pending set before the sync makes them program outputs.
                        gc.collect(0)
                    sync()
                finally:
                    if annotation is not None:
                        annotation.__exit__(None, None, None)
    finally:
        _PAUSING_STEPS[0] -= pausing


#: Numbers the ``step()`` blocks of this process (``step_num`` on profiles).
_STEP_NUMBERS = itertools.count()
