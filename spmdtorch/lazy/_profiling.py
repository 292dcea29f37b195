"""Whether a profile is being captured, and the trace annotations spmdtorch adds then.

``spmdtorch.debug.profiler`` turns annotations on while it captures a trace
(or while a profiler server runs); the engine then wraps its work in
``jax.profiler`` annotations named after spmdtorch's steps and programs:

=================================  ====================================================
Name on the trace                  What it spans
=================================  ====================================================
``spmdtorch.step`` (a step)        a ``spmdtorch.step()`` block, with ``step_num``
``spmdtorch.sync``                 a barrier: building, compiling, dispatching the graph
``spmdtorch.compile``              compiling one program (``program=spmdtorch.program_N``)
``spmdtorch.program_N``            dispatching program N (the N-th compiled in this process)
``spmdtorch.compiled:<fn>``        a call of ``spmdtorch.compile(fn)``
``jit_spmdtorch_program``          the XLA module of every program (device side)
=================================  ====================================================

When no profile is being captured, the only cost is reading
:data:`STATE.active` once per barrier / execution (never per op).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax

__all__ = ["STATE", "annotate", "step_annotation"]


class _State:
    """``active``: annotate (a trace is being captured or a server may capture one).

    ``holders`` counts who asked for annotations (a capture, a server):
    annotations stay on until the last one releases them.
    """

    __slots__ = ("active", "holders")

    def __init__(self) -> None:
        self.active = False
        self.holders = 0

    def acquire(self) -> None:
        self.holders += 1
        self.active = True

    def release(self) -> None:
        self.holders = max(0, self.holders - 1)
        self.active = self.holders > 0


STATE = _State()


def annotate(name: str, **metadata: Any) -> contextlib.AbstractContextManager[Any]:
    """A ``jax.profiler.TraceAnnotation`` while profiling, else a no-op context.

    Example:
        >>> with annotate("spmdtorch.sync"):
        ...     pass
    """
    if STATE.active:
        return jax.profiler.TraceAnnotation(name, **metadata)
    return contextlib.nullcontext()


def step_annotation(name: str, step_num: int) -> contextlib.AbstractContextManager[Any]:
    """A ``jax.profiler.StepTraceAnnotation`` (a step on the trace) while profiling."""
    if STATE.active:
        return jax.profiler.StepTraceAnnotation(name, step_num=step_num)
    return contextlib.nullcontext()
