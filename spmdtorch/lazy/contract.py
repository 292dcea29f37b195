"""The ``spmdtorch.compile`` contract: no tensor value may steer Python while tracing."""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import jax
    import torch

# lazy._storage.Storage: _storage imports this module (it checks the trace
# contract on writes), so the storages recorded here are typed through an
# alias, not an import (which would be an import cycle, typing-only or not).
Storage = Any

__all__ = [
    "TRACE_OWNER",
    "CompileContractError",
    "TraceState",
    "begin_trace",
    "check_not_tracing",
    "end_trace",
    "tracing",
    "wait_turn",
]


class CompileContractError(RuntimeError):
    """A compiled function broke the ``spmdtorch.compile`` contract."""


class _TraceState(threading.local):
    """The trace under way in *this thread* (``spmdtorch.compile`` traces one function at a time per thread).

    Thread-local so that another thread's tensors, syncs and value reads
    during a trace are that thread's own lazy work: they are neither recorded
    into the trace nor refused as the compiled function's.

    Attributes:
        active: a trace is under way in this thread.
        created: weak references to the storages the trace created.
        replaced: ``id(old value) -> (old value, storage, other storages)``
            for the concrete values the trace replaced.
        optimizers: ``id(optimizer) -> (weakref, hyperparameters)`` stepped in the trace.
        modules: ``id(module) -> (module, its plain attributes when first called)``.
    """

    def __init__(self) -> None:
        self.active = False
        self.created: list[weakref.ref[Storage]] = []
        self.replaced: dict[int, tuple[jax.Array, Storage, list[Storage]]] = {}
        # Any: what spmdtorch.compile records of each (a layer above this one).
        self.optimizers: dict[int, tuple[weakref.ref[torch.optim.Optimizer], Any]] = {}
        self.modules: dict[int, tuple[torch.nn.Module, Any]] = {}


TraceState = _TraceState()

# The thread whose trace is under way, or None. A trace ends with a sync of
# every pending value, so it is exclusive: another thread that would add a
# node or run a sync meanwhile waits for it to end (wait_turn), instead of
# having its lazy work compiled into the trace's program or refused as the
# compiled function's. Read without the lock on the hot path (Node creation):
# a stale read only sends a thread to wait_turn, which re-checks under it.
TRACE_OWNER: list[int | None] = [None]
_TURN = threading.Condition()


def begin_trace() -> None:
    """This thread starts a trace: another thread's trace first ends; others' lazy work waits for this one."""
    me = threading.get_ident()
    with _TURN:
        while TRACE_OWNER[0] not in (None, me):
            _TURN.wait()
        TRACE_OWNER[0] = me
    TraceState.active = True


def end_trace() -> None:
    """This thread's trace ended (returned or raised): waiting threads go on."""
    TraceState.active = False
    with _TURN:
        if TRACE_OWNER[0] == threading.get_ident():
            TRACE_OWNER[0] = None
        _TURN.notify_all()


def wait_turn() -> None:
    """Returns once no other thread is tracing (at once in the tracing thread itself)."""
    me = threading.get_ident()
    if TRACE_OWNER[0] in (None, me):
        return
    with _TURN:
        while TRACE_OWNER[0] not in (None, me):
            _TURN.wait()


def tracing() -> bool:
    """True while ``spmdtorch.compile`` is tracing a function body."""
    return TraceState.active


def check_not_tracing(what: str) -> None:
    """Raise ``CompileContractError`` when ``what`` happens during a trace."""
    if TraceState.active:
        raise CompileContractError(
            f"spmdtorch.compile: the compiled function {what}. Like jax.jit, its Python "
            "control flow must not depend on tensor values: move .item()/.cpu()/print()/"
            "bool(), data-dependent ops (nonzero, boolean masks) and spmdtorch.sync() out "
            "of the compiled function, or run it in lazy mode."
        )
