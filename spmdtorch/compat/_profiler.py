"""``torch_xla.debug.profiler`` (``xp``): :mod:`spmdtorch.debug.profiler`, built on ``jax.profiler``.

The traces are JAX's (TensorBoard's profile plugin and Perfetto open them),
with spmdtorch's step and program names on them. As in PyTorch/XLA,
``xp.trace(addr, logdir)`` captures from a profiler server: start one with
``xp.start_server(port)`` first (spmdtorch captures its own process's server
in process; another process's needs the ``xprof`` package).
"""

from __future__ import annotations

from spmdtorch.debug.profiler import (
    ProfilerError,
    StepTrace,
    Trace,
    start_server,
    start_trace,
    stop_server,
    stop_trace,
    trace,
    trace_detached,
    trace_me,
)

__all__ = [
    "ProfilerError",
    "StepTrace",
    "Trace",
    "start_server",
    "start_trace",
    "stop_server",
    "stop_trace",
    "trace",
    "trace_detached",
    "trace_me",
]
