"""``torch_xla.debug.profiler`` (``xp``) as thin adapters over ``jax.profiler``.

The traces are JAX's (TensorBoard's profile plugin and Perfetto open them).
Where :mod:`spmdtorch.debug` provides a name of its own (a profiler built on
``jax.profiler`` with spmdtorch's step and program names), that one is used.

* ``start_server(port)``: JAX's profiler server (for TensorBoard's capture
  button or ``xp.trace``); returns it.
* ``trace(service_addr, logdir, duration_ms)``: captures ``duration_ms`` of
  this process into ``logdir`` (blocking). spmdtorch captures in process:
  ``service_addr`` must be this process's server (``localhost:<port>``).
* ``trace_detached(...)``: the same on a background thread.
* ``Trace(name)``: a named host range; ``StepTrace(name, step_num=...)`` a
  step range, and leaving it is a barrier (``mark_step``), as in PyTorch/XLA.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import jax

import spmdtorch
from spmdtorch import debug

__all__ = ["StepTrace", "Trace", "start_server", "stop_server", "trace", "trace_detached"]

_SERVER: list[Any] = []


def _native(name: str) -> Any:
    return getattr(debug, name, None)


def start_server(port: int) -> Any:
    """Starts JAX's profiler server on ``port`` (once per process) and returns it."""
    native = _native("start_server")
    if native is not None:
        return native(port)
    if not _SERVER:
        _SERVER.append(jax.profiler.start_server(port))
    return _SERVER[0]


def stop_server() -> None:
    if _SERVER:
        jax.profiler.stop_server()
        _SERVER.clear()


def trace(
    service_addr: str,
    logdir: str,
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    **kwargs: Any,
) -> None:
    """Captures ``duration_ms`` of this process's activity into ``logdir`` (see the module docstring)."""
    native = _native("trace")
    if native is not None:
        return native(service_addr, logdir, duration_ms=duration_ms)
    if delay_ms:
        time.sleep(delay_ms / 1000)
    jax.profiler.start_trace(logdir)
    try:
        time.sleep(duration_ms / 1000)
    finally:
        jax.profiler.stop_trace()
    return None


def trace_detached(*args: Any, **kwargs: Any) -> threading.Thread:
    """:func:`trace` on a daemon thread (returned, so a script can ``join()`` it)."""
    t = threading.Thread(target=trace, args=args, kwargs=kwargs, daemon=True, name="spmdtorch-xp-trace")
    t.start()
    return t


class Trace:
    """A named range on the host timeline (``jax.profiler.TraceAnnotation``)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self._annotation = jax.profiler.TraceAnnotation(name, **kwargs)

    def __enter__(self) -> Trace:
        self._annotation.__enter__()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self._annotation.__exit__(et, ev, tb)


class StepTrace(Trace):
    """A training step's range (``jax.profiler.StepTraceAnnotation``); leaving it runs the step (a barrier)."""

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = name
        self._annotation = jax.profiler.StepTraceAnnotation(name, **kwargs)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if et is None:
                spmdtorch.mark_step()
        finally:
            self._annotation.__exit__(et, ev, tb)
