"""Debugging: metrics, counters, HLO of the pending graph.

Mirrors ``torch_xla.debug.metrics``: ``metrics_report()``, ``counter_value``,
``metric_data``; plus ``get_hlo_text``/``get_stablehlo`` for the graph that the
next barrier would run. Set ``SPMDTORCH_LOG_RECOMPILES=1`` (or enable INFO on
the ``spmdtorch.compile`` logger) to get a line on every recompilation saying
which input changed. ``clear_caches()`` empties every cache the library keeps
(compiled programs included); ``cache_sizes()`` says how full each one is.
"""

from __future__ import annotations

import logging

from spmdtorch._checks import ArgumentTypeError, check_bool, check_str
from spmdtorch.lazy import executor, metrics
from spmdtorch.lazy._engine import ENGINE
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor.dispatch import read_value
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = [
    "metrics_report",
    "counter_names",
    "counter_value",
    "metric_names",
    "metric_data",
    "cache_sizes",
    "clear_caches",
    "clear_metrics",
    "get_hlo_text",
    "get_stablehlo",
    "last_executable",
    "log_recompiles",
]


def counter_names() -> list[str]:
    return sorted(metrics.counters)


def counter_value(name: str) -> int:
    """Current value of counter ``name`` (0 if it never fired).

    Example:
        >>> from spmdtorch import debug
        >>> debug.counter_value("UncachedCompile") >= 0
        True
    """
    return metrics.counters.get(check_str(name, "counter_value", "name", ArgumentTypeError), 0)


def metric_names() -> list[str]:
    return sorted(metrics.timers)


def metric_data(name: str):
    """``(count, total_seconds, max_seconds)`` of timer ``name``, or None."""
    entry = metrics.timers.get(check_str(name, "metric_data", "name", ArgumentTypeError))
    return None if entry is None else tuple(entry)


def clear_metrics() -> None:
    metrics.reset()


def clear_caches() -> None:
    """Empties every per-process cache of spmdtorch; results do not change.

    The compile cache, node signatures, interned scalars, the dispatcher's
    meta cache and op facts, device scalars, helper programs... (see
    ``cache_sizes()`` for the list). The next step re-traces its shapes and
    re-compiles. Pending tensors, executions in flight and ``spmdtorch.compile``
    functions (which hold their own programs) are left alone; JAX's own caches
    are JAX's (``jax.clear_caches()``).

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(3, device="xla") * 2
        >>> spmdtorch.sync()
        >>> clear_caches()
        >>> cache_sizes()["lazy.executor.compile_cache"]
        0
        >>> (y + 1).cpu().tolist()
        [3.0, 3.0, 3.0]
    """
    ENGINE.clear_caches()


def cache_sizes() -> dict[str, int]:
    """Entries in each per-process cache, by ``"module.what"`` name (what ``clear_caches()`` empties).

    Example:
        >>> "lazy.executor.compile_cache" in cache_sizes()
        True
    """
    return ENGINE.cache_sizes()


def metrics_report() -> str:
    """A text report of every timer and counter (compiles, executions, transfers…)."""
    lines = []
    for name in sorted(metrics.timers):
        count, total, peak = metrics.timers[name]
        lines.append(
            f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {total * 1e3:.3f}ms\n"
            f"  Mean: {total / count * 1e3:.3f}ms\n  Max: {peak * 1e3:.3f}ms"
        )
    for name in sorted(metrics.counters):
        lines.append(f"Counter: {name}\n  Value: {metrics.counters[name]}")
    return "\n".join(lines) + ("\n" if lines else "")


def _pending_refs(tensors, what: str):
    if isinstance(tensors, XlaTensor):
        tensors = [tensors]
    if not isinstance(tensors, (list, tuple)):
        raise ArgumentTypeError(f"{what}: tensors must be a list of xla tensors, got {type(tensors).__name__}")
    refs = []
    for t in tensors:
        if not isinstance(t, XlaTensor):
            raise ArgumentTypeError(f"{what} expects xla tensors, got {type(t).__name__} in tensors")
        v = read_value(t)
        if isinstance(v, LazyRef):  # concrete tensors have no pending graph
            refs.append(v)
    return refs


def get_hlo_text(tensors) -> str:
    """HLO text of the pending graph computing ``tensors`` (before partitioning)."""
    refs = _pending_refs(tensors, "get_hlo_text")
    if not refs:
        return ""
    return executor.lower(refs).as_text(dialect="hlo")


def get_stablehlo(tensors) -> str:
    """StableHLO (MLIR text) of the pending graph computing ``tensors``."""
    refs = _pending_refs(tensors, "get_stablehlo")
    if not refs:
        return ""
    return executor.lower(refs).as_text()


def log_recompiles(enabled: bool = True) -> None:
    """Log a line on every recompilation saying which input changed."""
    enabled = check_bool(enabled, "log_recompiles", "enabled", ArgumentTypeError)
    logging.getLogger("spmdtorch.compile").setLevel(logging.INFO if enabled else logging.WARNING)


def last_executable():
    """The XLA executable (``jax.stages.Compiled``) spmdtorch compiled last, or None.

    In lazy mode this is the training step's program once the loop has run a
    step, e.g. for its per-device ``memory_analysis()``. (For a
    ``spmdtorch.compile`` function use its ``executable()``.)

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(4, device="xla") * 3
        >>> spmdtorch.sync()
        >>> spmdtorch.debug.last_executable().memory_analysis() is not None
        True
    """
    if ENGINE.last_key is None:
        return None
    prog = ENGINE.compile_cache.peek(ENGINE.last_key)
    return None if prog is None else prog.compiled
