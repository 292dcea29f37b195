"""``torch_xla.debug.metrics`` (``met``) with PyTorch/XLA's return shapes.

Counter and metric names are spmdtorch's (``CompileTime``, ``ExecuteTime``,
``TransferToDeviceTime``, ``TransferFromDeviceTime``, ``UncachedCompile``,
``CachedCompile``, ``MarkStep``, ``aten::_local_scalar_dense``...).
Timer values are in nanoseconds, as PyTorch/XLA's.
"""

from __future__ import annotations

from spmdtorch import debug

__all__ = [
    "clear_all",
    "clear_counters",
    "clear_metrics",
    "counter_names",
    "counter_value",
    "metric_data",
    "metric_names",
    "metrics_report",
    "short_metrics_report",
]

counter_names = debug.counter_names
metric_names = debug.metric_names
metrics_report = debug.metrics_report
short_metrics_report = debug.short_metrics_report
clear_counters = debug.clear_counters


def counter_value(name: str) -> int | None:
    """The counter's value, or None if it never fired (as PyTorch/XLA returns)."""
    return debug.counter_value(name) if name in debug.counter_names() else None


def metric_data(name: str) -> tuple[int, float, list[tuple[float, float]]] | None:
    """``(TOTAL_SAMPLES, ACCUMULATOR, SAMPLES)``, or None if the metric never fired.

    ``ACCUMULATOR`` is the sum of all samples in nanoseconds; ``SAMPLES`` the
    last ones (at most 1024) as ``(time, value_ns)`` pairs, ``time`` in
    seconds since the epoch.
    """
    data = debug.metric_data(name)
    if data is None:
        return None
    count, total_s, _peak = data
    samples = [(t, v * 1e9) for t, v in debug.metric_samples(name)]
    return int(count), total_s * 1e9, samples


def clear_metrics() -> None:
    """Clears every metric (timer); counters stay."""
    debug.clear_timers()


def clear_all() -> None:
    """Clears every metric and every counter."""
    debug.clear_metrics()
