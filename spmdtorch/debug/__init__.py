"""Debugging: metrics, counters, HLO of the pending graph.

Mirrors ``torch_xla.debug.metrics``: ``metrics_report()``, ``counter_value``,
``metric_data``; plus ``get_hlo_text``/``get_stablehlo`` for the graph that the
next barrier would run. Set ``SPMDTORCH_LOG_RECOMPILES=1`` (or enable INFO on
the ``spmdtorch.compile`` logger) to get a line on every recompilation saying
which input changed. ``clear_caches()`` empties every cache the library keeps
(compiled programs included); ``cache_sizes()`` says how full each one is.

Profiling: ``profile(logdir)`` captures a trace of its block (TensorBoard,
Perfetto) with spmdtorch's step and program names on it;
:mod:`spmdtorch.debug.profiler` has PyTorch/XLA's ``torch_xla.debug.profiler``
names (``start_server``, ``trace``, ``trace_detached``, ``Trace``,
``StepTrace``...); ``device_activity(logdir)`` reads how busy each device was
over a captured trace and how long it sat idle waiting for the host.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import torch

from spmdtorch import _checks
from spmdtorch._checks import ArgumentTypeError, check_bool, check_str
from spmdtorch.debug import profiler
from spmdtorch.debug.profiler import (
    DeviceActivity,
    ProfilerArgumentError,
    ProfilerArgumentTypeError,
    ProfilerError,
    StepTrace,
    Trace,
    device_activity,
    profile,
    start_server,
    start_trace,
    stop_server,
    stop_trace,
    trace,
    trace_detached,
    trace_me,
)
from spmdtorch.lazy import ENGINE, caches, executor, manual, metrics, rng
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
    "cache_stats",
    "clear_caches",
    "clear_counters",
    "clear_metrics",
    "clear_timers",
    "get_hlo_text",
    "last_executable_outputs",
    "GraphParameter",
    "LoweredGraph",
    "lower_graph",
    "get_stablehlo",
    "get_stablehlo_bytecode",
    "metric_samples",
    "short_metrics_report",
    "last_executable",
    "log_recompiles",
    "profile",
    "profiler",
    "DeviceActivity",
    "device_activity",
    # torch_xla.debug.profiler's names (also in spmdtorch.debug.profiler)
    "ProfilerArgumentError",
    "ProfilerArgumentTypeError",
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


def metric_samples(name: str) -> list[tuple[float, float]]:
    """The last samples of timer ``name``: ``(wall-clock time, seconds)`` pairs, oldest first.

    At most ``spmdtorch.lazy.metrics.MAX_SAMPLES`` are kept (a circular
    buffer, as in PyTorch/XLA); an unknown name gives ``[]``.
    """
    return list(metrics.samples.get(check_str(name, "metric_samples", "name", ArgumentTypeError), ()))


def clear_metrics() -> None:
    """Clears every counter and timer."""
    metrics.reset()


def clear_counters() -> None:
    """Clears every counter (timers stay)."""
    metrics.reset_counters()


def clear_timers() -> None:
    """Clears every timer and its samples (counters stay)."""
    metrics.reset_timers()


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


def cache_stats() -> dict[str, caches.CacheStats]:
    """Each per-process cache's size, bound, evictions and bypasses, by ``"module.what"`` name.

    ``maxsize`` is None only for a cache its owner bounds (then ``bound``
    says how). A growing ``bypasses`` count means calls that could not use
    their cache (an unhashable argument) and ran uncached.

    Example:
        >>> s = cache_stats()["lazy.executor.compile_cache"]
        >>> s.maxsize > 0, s.size <= s.maxsize
        (True, True)
    """
    return caches.stats()


def metrics_report() -> str:
    """A text report of every timer and counter (compiles, executions, transfers…)."""
    return _report(sorted(metrics.timers), sorted(metrics.counters))


def _report(timer_names, counter_names) -> str:
    lines = []
    for name in timer_names:
        entry = metrics.timers.get(name)
        if entry is None:
            continue
        count, total, peak = entry
        lines.append(
            f"Metric: {name}\n  TotalSamples: {count}\n  Accumulator: {total * 1e3:.3f}ms\n"
            f"  Mean: {total / count * 1e3:.3f}ms\n  Max: {peak * 1e3:.3f}ms"
        )
    for name in counter_names:
        if name in metrics.counters:
            lines.append(f"Counter: {name}\n  Value: {metrics.counters[name]}")
    return "\n".join(lines) + ("\n" if lines else "")


#: What :func:`short_metrics_report` shows by default (PyTorch/XLA's choice, minus its
#: ExecuteReplicatedTime: spmdtorch runs one program for all devices, timed as ExecuteTime).
SHORT_REPORT_COUNTERS = ("CachedCompile", "MarkStep")
SHORT_REPORT_METRICS = ("CompileTime", "ExecuteTime", "TransferToDeviceTime", "TransferFromDeviceTime")


def short_metrics_report(counter_names: Sequence[str] | None = None, metric_names: Sequence[str] | None = None) -> str:
    """The report of a few counters and timers (PyTorch/XLA's ``short_metrics_report``).

    Args:
        counter_names: counters to show (default :data:`SHORT_REPORT_COUNTERS`).
        metric_names: timers to show (default :data:`SHORT_REPORT_METRICS`).
            Names that never fired are left out.

    Example:
        >>> import torch, spmdtorch
        >>> _ = (torch.ones(2, device="xla") + 1).cpu()
        >>> "Metric: ExecuteTime" in short_metrics_report()
        True
    """
    counters = _names(counter_names, "counter_names", SHORT_REPORT_COUNTERS)
    timers = _names(metric_names, "metric_names", SHORT_REPORT_METRICS)
    return _report(timers, counters)


def _names(names: object, param: str, default: Sequence[str]) -> list[str]:
    """``short_metrics_report``'s list of names: None (the default) or a sequence of str."""
    if names is None:
        return list(default)
    if isinstance(names, str) or not isinstance(names, Sequence):
        _checks.fail(
            ArgumentTypeError, "short_metrics_report", param, "a list of names or None", names, f"e.g. {param}=['a']"
        )
    for i, name in enumerate(names):
        check_str(name, "short_metrics_report", f"{param}[{i}]", ArgumentTypeError)
    return list(names) or list(default)


def _pending_refs(tensors, what: str):
    if tensors is None:  # the whole pending graph (every live pending tensor)
        return [st.value for st in executor.pending_storages()]
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


def get_hlo_text(tensors=None, *, optimized: bool = False) -> str:
    """HLO text of the pending graph computing ``tensors`` (None: every pending tensor).

    Args:
        tensors: the tensors whose pending graph to print (None: every pending tensor).
        optimized: the program as XLA compiled it for the devices (partitioned,
            its collectives inserted, fused) instead of the program before
            partitioning. It compiles the program (not cached for the run).

    Example:
        >>> import torch, spmdtorch
        >>> x = torch.arange(4.0, device="xla")
        >>> spmdtorch.sync()
        >>> y = x * x
        >>> "multiply" in get_hlo_text([y]), "ENTRY" in get_hlo_text([y], optimized=True)
        (True, True)
    """
    optimized = check_bool(optimized, "get_hlo_text", "optimized", ArgumentTypeError)
    refs = _pending_refs(tensors, "get_hlo_text")
    if not refs:
        return ""
    if optimized:  # XLA cannot compile a program returning a manual value (an assertion, not an error)
        manual.check_not_manual(refs, "get_hlo_text(optimized=True)")
    lowered = executor.lower(refs)
    if optimized:
        return str(lowered.compile().as_text())
    return str(lowered.as_text(dialect="hlo"))


class GraphParameter(NamedTuple):
    """One parameter of a program :func:`lower_graph` lowered.

    Attributes:
        number: its parameter number in the HLO entry computation.
        role: ``"data"`` (a tensor's device array), ``"scalar"`` (a number
            kept as an input) or ``"rng_key"`` (the random key's data).
        value: the ``jax.Array`` (or, for the key, the numpy data) the program
            would be given if it ran now.
    """

    number: int
    role: str
    value: Any


class LoweredGraph(NamedTuple):
    """The program computing some tensors, lowered and not run (:func:`lower_graph`).

    Attributes:
        lowered: the ``jax.stages.Lowered`` program (``as_text()``,
            ``compiler_ir("hlo")``); it returns the tensors in the order given.
        parameters: its parameters, in parameter-number order.
        devices: the program's device assignment: a device number in its HLO
            shardings (``{devices=[2,4]<=[8]}``) is a position in this tuple.
    """

    lowered: jax.stages.Lowered
    parameters: tuple[GraphParameter, ...]
    devices: tuple = ()

    def parameter_of(self, tensor: XlaTensor) -> int:
        """The parameter number whose argument is ``tensor``'s device data, or -1 (pending, or not an input)."""
        value = read_value(tensor)
        if isinstance(value, LazyRef):
            return -1
        return next((p.number for p in self.parameters if p.role == "data" and p.value is value), -1)


def lower_graph(tensors, *, name: str = "spmdtorch_program") -> LoweredGraph:
    """Lower the program computing ``tensors`` without running it or changing any state.

    Pending tensors are the graph's outputs; a computed tensor is a
    parameter returned as it is. Python numbers are constants; the random key
    is the one the next program would draw (torch's generator is left
    where it was).

    Args:
        tensors: xla tensors (a list; one tensor is taken as a list of one).
        name: the program's name (the HLO module is ``jit_<name>``).

    Raises:
        ArgumentTypeError: ``tensors`` is not a list of xla tensors or ``name`` not a string.

    Example:
        >>> import torch, spmdtorch
        >>> x = torch.ones(4, device="xla")
        >>> spmdtorch.sync()
        >>> g = lower_graph([x * 2], name="double")
        >>> [p.role for p in g.parameters], g.parameter_of(x)
        (['data'], 0)
    """
    check_str(name, "lower_graph", "name", ArgumentTypeError)
    if isinstance(tensors, XlaTensor):
        tensors = [tensors]
    if not isinstance(tensors, (list, tuple)):
        raise ArgumentTypeError(
            f"lower_graph: tensors must be a list of xla tensors, got {type(tensors).__name__}; pass [t1, t2, ...]"
        )
    roots = []
    for i, t in enumerate(tensors):
        if not isinstance(t, XlaTensor):
            raise ArgumentTypeError(
                f"lower_graph: tensors[{i}] must be an xla tensor, got "
                f"{type(t).__name__ if not isinstance(t, torch.Tensor) else f'a tensor on {t.device}'}; "
                "move it with t.to('xla')"
            )
        roots.append(read_value(t))
    # The key the next program would draw: drawn, then the generator put back.
    state = torch.default_generator.get_state()
    try:
        key_data = rng.next_key_data()
    finally:
        torch.default_generator.set_state(state)
    program = executor.lower_program(roots, name=name, key_data=key_data)
    params = tuple(GraphParameter(i, role, value) for i, (role, value) in enumerate(zip(program.roles, program.args)))
    return LoweredGraph(program.lowered, params, program.devices)


def get_stablehlo(tensors=None) -> str:
    """StableHLO (MLIR text) of the pending graph computing ``tensors`` (None: every pending tensor)."""
    refs = _pending_refs(tensors, "get_stablehlo")
    if not refs:
        return ""
    return executor.lower(refs).as_text()


def get_stablehlo_bytecode(tensors=None) -> bytes:
    """StableHLO of the pending graph computing ``tensors`` as MLIR bytecode (None: every pending tensor).

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(2, device="xla") * 3
        >>> get_stablehlo_bytecode([y])[:4]
        b'ML\\xefR'
    """
    import io

    refs = _pending_refs(tensors, "get_stablehlo_bytecode")
    if not refs:
        return b""
    module = executor.lower(refs).compiler_ir("stablehlo")
    buf = io.BytesIO()
    # jax types Lowered.compiler_ir() Optional; the "stablehlo" dialect always gives a module.
    module.operation.write_bytecode(buf)  # type: ignore[union-attr]
    return buf.getvalue()


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


def last_executable_outputs() -> tuple:
    """The outputs (``shape``, ``dtype``, ``sharding``) of :func:`last_executable`: the tensors it computes.

    Every program spmdtorch compiles also returns a replicated 0-d bool last
    (the in-flight bound waits on it, ``spmdtorch.lazy.executor``); it is no
    tensor's value and is left out here. ``()`` when nothing was compiled.

    Example:
        >>> import torch, spmdtorch
        >>> y = torch.ones(4, 2, device="xla") * 3
        >>> spmdtorch.sync()
        >>> [(tuple(o.shape), str(o.dtype)) for o in spmdtorch.debug.last_executable_outputs()]
        [((4, 2), 'float32')]
    """
    compiled = last_executable()
    if compiled is None:
        return ()
    return tuple(compiled.out_info)[:-1]
