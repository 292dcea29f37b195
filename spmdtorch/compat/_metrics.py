"""``torch_xla.debug.metrics`` (``met``) with PyTorch/XLA's return shapes and names.

spmdtorch's own counters and timers (``CompileTime``, ``ExecuteTime``,
``TransferToDeviceTime``, ``TransferFromDeviceTime``, ``UncachedCompile``,
``CachedCompile``, ``MarkStep``, ``aten::_local_scalar_dense``...) are
reported under their names, most of which are PyTorch/XLA's. The PyTorch/XLA
names spmdtorch counts under another name are reported too (:data:`COUNTER_ALIASES`,
:data:`METRIC_ALIASES`): in SPMD mode every program runs replicated
(``ExecuteReplicated``, ``ExecuteReplicatedTime``), every tensor lives on the
virtual device (``VirtualDeviceUsage`` counts the transfers to it),
``OutboundData``/``InboundData`` are the bytes moved to/from the devices, and
``InputOutputAliasCount`` has a sample per program execution, the number of
its outputs XLA writes into donated input buffers (PyTorch/XLA samples it per
compilation; a cached program run again samples again here).
Timer values are in nanoseconds, as PyTorch/XLA's; data metrics in bytes.
"""

from __future__ import annotations

from typing import NamedTuple

from spmdtorch import debug

__all__ = [
    "clear_all",
    "clear_counters",
    "clear_metrics",
    "counter_names",
    "counter_value",
    "executed_fallback_ops",
    "metric_data",
    "metric_names",
    "metrics_report",
    "short_metrics_report",
]

#: PyTorch/XLA counter name -> the spmdtorch counter that counts the same events.
COUNTER_ALIASES: dict[str, str] = {
    "ExecuteReplicated": "ExecuteCount",  # SPMD: every program runs on all devices at once
    "VirtualDeviceUsage": "TransferToDevice",  # SPMD: every transfer goes to the virtual device SPMD:0
    # PyTorch/XLA counts every host read of SPMD data (PjRtShardedData: any array on all
    # devices, replicated ones included, which it returns without a copy).
    "ReplicateShardedData": "TransferFromDeviceMultiDevice",
}


class DataMetric(NamedTuple):
    """A PyTorch/XLA value metric spmdtorch keeps as two counters: how many samples, and their sum.

    Attributes:
        count_counter: the counter of samples (transfers, program executions).
        bytes_counter: the counter summing their values (bytes, aliased buffers).
        unit: the unit the reports print after the sum.
    """

    count_counter: str
    bytes_counter: str
    unit: str = "B"


#: PyTorch/XLA metric name -> the spmdtorch timer (str) or transfer counters (DataMetric) behind it.
METRIC_ALIASES: dict[str, str | DataMetric] = {
    "ExecuteReplicatedTime": "ExecuteTime",
    "OutboundData": DataMetric("TransferToDevice", "OutboundBytes"),
    "InboundData": DataMetric("TransferFromDevice", "InboundBytes"),
    # One sample per program execution: how many outputs it writes into donated inputs' buffers.
    "InputOutputAliasCount": DataMetric("ExecuteCount", "InputOutputAliases", unit=""),
}

#: PyTorch/XLA's short report: these counters and metrics, those that fired.
_SHORT_COUNTERS = ("CachedCompile", "MarkStep", "DynamoSyncInputExecuteTime")
_SHORT_METRICS = (
    "CompileTime",
    "ExecuteTime",
    "ExecuteReplicatedTime",
    "TransferToDeviceTime",
    "TransferFromDeviceTime",
)

#: The (count, bytes) of each data metric at the last ``clear_metrics()``: its values count from there.
_DATA_SINCE: dict[str, tuple[int, int]] = {}


def _data_values(name: str, source: DataMetric) -> tuple[int, int]:
    count = debug.counter_value(source.count_counter)
    nbytes = debug.counter_value(source.bytes_counter)
    base_count, base_bytes = _DATA_SINCE.get(name, (0, 0))
    if count < base_count or nbytes < base_bytes:  # the counters were cleared since (spmdtorch.debug directly)
        base_count, base_bytes = 0, 0
        _DATA_SINCE.pop(name, None)
    return count - base_count, nbytes - base_bytes


def clear_counters() -> None:
    """Clears every counter (``OutboundData``/``InboundData`` too: spmdtorch counts them)."""
    debug.clear_counters()
    _DATA_SINCE.clear()


def counter_names() -> list[str]:
    """The counters that fired: spmdtorch's, and PyTorch/XLA's names for those it counts under another."""
    own = debug.counter_names()
    return sorted(set(own) | {alias for alias, src in COUNTER_ALIASES.items() if src in own})


def counter_value(name: str) -> int | None:
    """The counter's value, or None if it never fired (as PyTorch/XLA returns)."""
    source = COUNTER_ALIASES.get(name, name)
    return debug.counter_value(source) if source in debug.counter_names() else None


def executed_fallback_ops() -> list[str]:
    """The ops that ran on the CPU (``aten::nonzero``...): spmdtorch counts each under its name, as PyTorch/XLA."""
    return [name for name in debug.counter_names() if name.startswith("aten::") and debug.counter_value(name)]


def _metric_fired(name: str) -> bool:
    source = METRIC_ALIASES.get(name, name)
    if isinstance(source, DataMetric):
        return _data_values(name, source) != (0, 0)
    return source in debug.metric_names()


def metric_names() -> list[str]:
    """The metrics that fired: spmdtorch's timers and PyTorch/XLA's names for those kept under another."""
    return sorted(set(debug.metric_names()) | {alias for alias in METRIC_ALIASES if _metric_fired(alias)})


def metric_data(name: str) -> tuple[int, float, list[tuple[float, float]]] | None:
    """``(TOTAL_SAMPLES, ACCUMULATOR, SAMPLES)``, or None if the metric never fired.

    For a timer ``ACCUMULATOR`` is the sum of all samples in nanoseconds and
    ``SAMPLES`` the last ones (at most 1024) as ``(time, value_ns)`` pairs,
    ``time`` in seconds since the epoch. For ``OutboundData``/``InboundData``
    it is the bytes transferred, for ``InputOutputAliasCount`` the outputs
    written into donated buffers over the program executions it counts, and
    ``SAMPLES`` is empty (spmdtorch keeps their totals only).
    """
    source = METRIC_ALIASES.get(name, name)
    if isinstance(source, DataMetric):
        if not _metric_fired(name):
            return None
        count, nbytes = _data_values(name, source)
        return count, float(nbytes), []
    data = debug.metric_data(source)
    if data is None:
        return None
    count, total_s, _peak = data
    samples = [(t, v * 1e9) for t, v in debug.metric_samples(source)]
    return int(count), total_s * 1e9, samples


def _alias_report(counters: list[str], metrics: list[str]) -> str:
    lines = []
    for name in metrics:
        data = metric_data(name)
        if data is None:
            continue
        count, acc, _ = data
        source = METRIC_ALIASES[name]
        unit = source.unit if isinstance(source, DataMetric) else "ns"
        lines.append(f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {acc:.0f}{unit}")
    for name in counters:
        value = counter_value(name)
        if value is not None:
            lines.append(f"Counter: {name}\n  Value: {value}")
    return "\n".join(lines) + ("\n" if lines else "")


def metrics_report() -> str:
    """spmdtorch's report, then PyTorch/XLA's names for what it counts under another name."""
    return debug.metrics_report() + _alias_report(sorted(COUNTER_ALIASES), sorted(METRIC_ALIASES))


def short_metrics_report(counter_names: list[str] | None = None, metric_names: list[str] | None = None) -> str:
    """PyTorch/XLA's short report: a few counters and metrics (by default PyTorch/XLA's choice), those that fired."""
    counters = list(_SHORT_COUNTERS if counter_names is None else counter_names)
    metrics = list(_SHORT_METRICS if metric_names is None else metric_names)
    own = debug.short_metrics_report(
        [c for c in counters if c not in COUNTER_ALIASES], [m for m in metrics if m not in METRIC_ALIASES]
    )
    return own + _alias_report(
        [c for c in counters if c in COUNTER_ALIASES], [m for m in metrics if m in METRIC_ALIASES]
    )


def clear_metrics() -> None:
    """Clears every metric (timers, and ``OutboundData``/``InboundData``); counters stay."""
    debug.clear_timers()
    for name, source in METRIC_ALIASES.items():
        if isinstance(source, DataMetric):
            _DATA_SINCE[name] = (
                debug.counter_value(source.count_counter),
                debug.counter_value(source.bytes_counter),
            )


def clear_all() -> None:
    """Clears every metric and every counter."""
    debug.clear_metrics()
    _DATA_SINCE.clear()
