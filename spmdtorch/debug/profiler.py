"""Profiling: traces that TensorBoard's profile plugin and Perfetto open, built on ``jax.profiler``.

PyTorch/XLA's ``torch_xla.debug.profiler`` names (``start_server``,
``trace``, ``trace_detached``, ``start_trace``/``stop_trace``, ``Trace``,
``StepTrace``, ``trace_me``) plus :func:`profile`, a context manager that
captures its block. While a trace is captured (or a profiler server runs),
spmdtorch puts its own names on the trace: each ``spmdtorch.step()`` block as
a step (``spmdtorch.step``, with ``step_num``), each barrier
(``spmdtorch.sync``), each compilation (``spmdtorch.compile``, with the
program's name) and each execution (``spmdtorch.program_N``, the N-th program
compiled in the process); the XLA module of every program is
``jit_spmdtorch_program``. With no trace and no server, none of this costs
anything but a flag test per barrier.

A capture writes ``<logdir>/plugins/profile/<run>/<host>.xplane.pb`` (open
with ``tensorboard --logdir <logdir>`` and the profile plugin, or xprof) and
``<host>.trace.json.gz`` (Chrome trace format: Perfetto, chrome://tracing);
``create_perfetto_trace=True`` adds ``perfetto_trace.json.gz``.

Example:
    >>> import torch, spmdtorch
    >>> from spmdtorch.debug import profiler as xp
    >>> w = torch.ones(4, device="xla")
    >>> with xp.profile("/tmp/spmdtorch-profile"):               # doctest: +SKIP
    ...     for i in range(3):
    ...         with spmdtorch.step():
    ...             w.mul_(2)
    >>> xp.trace_files("/tmp/spmdtorch-profile")                  # doctest: +SKIP
    [PosixPath('/tmp/spmdtorch-profile/plugins/profile/2026_01_01_00_00_00/host.trace.json.gz'), ...]
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jax
from jax.profiler import ProfileData

from spmdtorch import _checks
from spmdtorch._checks import ArgumentError, ArgumentTypeError
from spmdtorch.debug._activity import DeviceActivity, activity_of, newest_xspace
from spmdtorch.lazy import executor, profiling
from spmdtorch.programs import mark_step

__all__ = [
    "DeviceActivity",
    "ProfilerArgumentError",
    "ProfilerArgumentTypeError",
    "ProfilerError",
    "StepTrace",
    "Trace",
    "device_activity",
    "is_tracing",
    "profile",
    "start_server",
    "start_trace",
    "stop_server",
    "stop_trace",
    "trace",
    "trace_detached",
    "trace_files",
    "trace_me",
]

F = TypeVar("F", bound=Callable[..., Any])


class ProfilerError(RuntimeError):
    """A profiling request cannot be served (already tracing, no server, remote capture unavailable)."""


class ProfilerArgumentError(ProfilerError, ArgumentError):
    """A profiler function was given a bad argument (also a ``ValueError``); the message names it."""


class ProfilerArgumentTypeError(ProfilerArgumentError, ArgumentTypeError):
    """A profiler argument of the wrong type (a ``TypeError`` and a ``ValueError`` too)."""


class _Capture:
    """The trace being captured by this process (at most one: JAX's limit)."""

    __slots__ = ("lock", "logdir", "server", "server_port")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.logdir: str | None = None
        self.server: Any = None
        self.server_port: int | None = None


_CAPTURE = _Capture()


def _logdir(logdir: Any, func: str, name: str = "logdir") -> str:
    expected = "a non-empty directory path (str or os.PathLike)"
    if isinstance(logdir, bytes) or not isinstance(logdir, (str, os.PathLike)):
        _checks.fail(ProfilerArgumentTypeError, func, name, expected, logdir)
    if not os.fspath(logdir):
        _checks.fail(ProfilerArgumentError, func, name, expected, logdir, "e.g. '/tmp/profile'")
    return os.fspath(logdir)


def _level(value: Any, func: str, name: str, maximum: int, optional: bool = True) -> int | None:
    """A tracer level: an int in ``0..maximum`` (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not _checks.is_int(value):
        _checks.fail(ProfilerArgumentTypeError, func, name, f"an int in 0..{maximum}", value)
    return _checks.check_int(value, func, name, ProfilerArgumentError, minimum=0, maximum=maximum)


def _capture_options(
    func: str,
    logdir: Any,
    logdir_name: str,
    create_perfetto_link: Any,
    create_perfetto_trace: Any,
    host_tracer_level: Any,
    python_tracer_level: Any,
) -> str:
    """Checks :func:`start_trace`'s (and :func:`profile`'s) arguments; returns the directory."""
    path = _logdir(logdir, func, logdir_name)
    _checks.check_bool(create_perfetto_link, func, "create_perfetto_link", ProfilerArgumentTypeError)
    _checks.check_bool(create_perfetto_trace, func, "create_perfetto_trace", ProfilerArgumentTypeError)
    _level(host_tracer_level, func, "host_tracer_level", 3)
    _level(python_tracer_level, func, "python_tracer_level", 1)
    return path


def is_tracing() -> bool:
    """Whether :func:`start_trace` (or :func:`profile`) is capturing a trace now.

    Example:
        >>> is_tracing()
        False
    """
    return _CAPTURE.logdir is not None


def start_trace(
    log_dir: str | os.PathLike[str],
    create_perfetto_link: bool = False,
    create_perfetto_trace: bool = False,
    *,
    host_tracer_level: int | None = None,
    python_tracer_level: int | None = None,
) -> None:
    """Starts capturing a trace of this process into ``log_dir`` (``xp.start_trace``).

    Args:
        log_dir: Directory the trace goes to (created if missing; ``gs://`` works).
        create_perfetto_link: Print a link that opens the trace in Perfetto
            (blocks in :func:`stop_trace` until it is opened, as in JAX).
        create_perfetto_trace: Also write ``perfetto_trace.json.gz``.
        host_tracer_level: Host events kept: 1 critical, 2 info (default), 3 verbose.
        python_tracer_level: 1 records every Python call (slow); default 0.

    Raises:
        ProfilerError: a trace is already being captured.
        ProfilerArgumentError: ``log_dir`` is empty or not a path, a flag is
            not a bool or a level out of range (a ``ValueError``).
    """
    path = _capture_options(
        "start_trace",
        log_dir,
        "log_dir",
        create_perfetto_link,
        create_perfetto_trace,
        host_tracer_level,
        python_tracer_level,
    )
    options = jax.profiler.ProfileOptions()
    if host_tracer_level is not None:
        options.host_tracer_level = int(host_tracer_level)
    if python_tracer_level is not None:
        options.python_tracer_level = int(python_tracer_level)
    with _CAPTURE.lock:
        if _CAPTURE.logdir is not None:
            raise ProfilerError(
                f"a trace is already being captured into {_CAPTURE.logdir!r}; call stop_trace() "
                f"before starting one into {path!r} (JAX captures one trace at a time)"
            )
        try:
            jax.profiler.start_trace(
                path,
                create_perfetto_link=create_perfetto_link,
                create_perfetto_trace=create_perfetto_trace,
                profiler_options=options,
            )
        except RuntimeError as e:  # started through jax.profiler directly
            raise ProfilerError(f"cannot start a trace into {path!r}: {e}") from e
        _CAPTURE.logdir = path
        profiling.STATE.acquire()


def stop_trace() -> Path:
    """Stops the trace :func:`start_trace` began and writes it (``xp.stop_trace``).

    Waits for the programs already dispatched to finish first, so their
    device work is on the trace (pending lazy values stay pending: no barrier).

    Returns:
        The directory the trace files were written to
        (``<log_dir>/plugins/profile/<run>``; see :func:`trace_files`).

    Raises:
        ProfilerError: no trace is being captured.
    """
    with _CAPTURE.lock:
        if _CAPTURE.logdir is None:
            raise ProfilerError("stop_trace(): no trace is being captured; call start_trace(log_dir) first")
        logdir, _CAPTURE.logdir = _CAPTURE.logdir, None
        try:
            executor.wait_executions()
        finally:
            try:
                jax.profiler.stop_trace()
            finally:
                profiling.STATE.release()
    return _latest_run(logdir)


def _latest_run(logdir: str) -> Path:
    root = Path(logdir) / "plugins" / "profile"
    runs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else root


def profile(
    logdir: str | os.PathLike[str],
    *,
    create_perfetto_link: bool = False,
    create_perfetto_trace: bool = False,
    host_tracer_level: int | None = None,
    python_tracer_level: int | None = None,
) -> contextlib.AbstractContextManager[None]:
    """Captures a trace of the block into ``logdir`` (TensorBoard / Perfetto).

    The arguments are checked at the call (before the ``with`` block); the
    capture starts on entering the block and is written on leaving it.

    Args:
        logdir: Directory the trace goes to.
        create_perfetto_link: Print a Perfetto link at the end (waits until opened).
        create_perfetto_trace: Also write ``perfetto_trace.json.gz``.
        host_tracer_level: 1 critical, 2 info (default), 3 verbose host events.
        python_tracer_level: 1 records every Python call (slow); default 0.

    Raises:
        ProfilerArgumentError: a bad argument (a ``ValueError``).
        ProfilerError: (on entering) a trace is already being captured.

    Example:
        >>> import torch, spmdtorch
        >>> with spmdtorch.debug.profile("/tmp/spmdtorch-profile"):   # doctest: +SKIP
        ...     with spmdtorch.step():
        ...         y = torch.ones(4, device="xla") * 2
    """
    path = _capture_options(
        "profile", logdir, "logdir", create_perfetto_link, create_perfetto_trace, host_tracer_level, python_tracer_level
    )
    return _profile(path, create_perfetto_link, create_perfetto_trace, host_tracer_level, python_tracer_level)


@contextlib.contextmanager
def _profile(
    logdir: str,
    create_perfetto_link: bool,
    create_perfetto_trace: bool,
    host_tracer_level: int | None,
    python_tracer_level: int | None,
) -> Iterator[None]:
    start_trace(
        logdir,
        create_perfetto_link,
        create_perfetto_trace,
        host_tracer_level=host_tracer_level,
        python_tracer_level=python_tracer_level,
    )
    try:
        yield
    finally:
        stop_trace()


def trace_files(logdir: str | os.PathLike[str]) -> list[Path]:
    """The trace files under ``logdir`` (``*.xplane.pb``, ``*.trace.json.gz``...), oldest run first.

    Example:
        >>> trace_files("/nonexistent")
        []
    """
    root = Path(_logdir(logdir, "trace_files")) / "plugins" / "profile"
    if not root.is_dir():
        return []
    runs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    return [f for run in runs for f in sorted(run.iterdir()) if f.is_file()]


def device_activity(trace: Any) -> list[DeviceActivity]:
    """How busy each device was over a captured trace, and how long it sat idle waiting for the host.

    Read off the trace rather than inferred from timings: a GPU's kernels and
    copies on its streams, a TPU's XLA ops; simulated CPU devices run on host
    threads, so they give one entry, ``"cpu"``, for XLA's CPU client as a whole
    (busy while any of them runs program work). Idle time is the part of the
    window from a device's first work to its last that no work covers: capture
    N steps launched back to back, and ``idle_ns / N`` is what each step left
    the device waiting (host-bound when it is a large part of the step).

    Args:
        trace: the ``logdir`` of :func:`profile` / :func:`start_trace` (its
            newest ``*.xplane.pb``), an ``.xplane.pb`` file, or a loaded
            ``jax.profiler.ProfileData``.

    Returns:
        One :class:`DeviceActivity` per device that did work, in the trace's
        order (empty when none did).

    Raises:
        ProfilerArgumentError: ``trace`` names no trace file, or a file that is
            not one (a ``ValueError``).

    Example:
        >>> import torch, spmdtorch, tempfile
        >>> w = torch.ones(256, 256, device="xla")
        >>> logdir = tempfile.mkdtemp()
        >>> with spmdtorch.debug.profile(logdir):
        ...     for _ in range(3):
        ...         with spmdtorch.step():
        ...             w = torch.tanh(w @ w)
        ...     spmdtorch.wait_device_ops()
        >>> [cpu] = device_activity(logdir)  # simulated CPU devices: one entry
        >>> cpu.device, cpu.busy_ns > 0, cpu.busy_ns + cpu.idle_ns == cpu.window_ns
        ('cpu', True, True)
    """
    if hasattr(trace, "planes"):  # a jax.profiler.ProfileData
        return activity_of(trace)
    path = _logdir(trace, "device_activity", "trace")
    found = newest_xspace(path)
    if found is None:
        _checks.fail(
            ProfilerArgumentError,
            "device_activity",
            "trace",
            "a directory holding a captured trace (*.xplane.pb), such a file, or a jax.profiler.ProfileData",
            path,
            "capture one with spmdtorch.debug.profile(logdir) and pass that logdir",
        )
    try:
        data = ProfileData.from_file(str(found))
    except RuntimeError as e:  # jaxlib's parser: "Failed to parse XSpace from array"
        raise ProfilerArgumentError(
            f"device_activity: trace must be an XSpace trace file (*.xplane.pb), got {str(found)!r}, "
            f"which does not parse as one ({e}); pass the capture's directory or its .xplane.pb file"
        ) from e
    return activity_of(data)


# -- a profiler server and on-demand captures (TensorBoard's "capture profile") ------------


def start_server(port: int, only_on_master: bool = True) -> Any:
    """Starts a profiler server on ``port`` (``xp.start_server``).

    TensorBoard's profile plugin ("Capture profile", address ``host:port``)
    or :func:`trace` / :func:`trace_detached` then capture traces on demand.
    While the server runs, spmdtorch annotates its steps and programs (a
    capture may start at any moment).

    Args:
        port: TCP port, 1..65535.
        only_on_master: PyTorch/XLA starts the server only on the local master
            ordinal. Under SPMD every process is its host's master, so every
            process starts one; accepted for compatibility.

    Returns:
        JAX's ``ProfilerServer`` (keep it; :func:`stop_server` stops it).

    Raises:
        ProfilerArgumentError: ``port`` is not an int in 1..65535, or
            ``only_on_master`` not a bool (a ``ValueError``).
        ProfilerError: a server already runs in this process (one at a time).
    """
    _port(port, "start_server", "port")
    # Every SPMD process is its host's master ordinal: checked, then not needed.
    _checks.check_bool(only_on_master, "start_server", "only_on_master", ProfilerArgumentTypeError)
    with _CAPTURE.lock:
        if _CAPTURE.server is not None:
            raise ProfilerError(
                f"a profiler server already runs on port {_CAPTURE.server_port}; call stop_server() "
                f"before starting one on port {port} (one per process)"
            )
        try:
            _CAPTURE.server = jax.profiler.start_server(port)
        except (ValueError, RuntimeError) as e:
            raise ProfilerError(f"cannot start a profiler server on port {port}: {e}") from e
        _CAPTURE.server_port = port
        profiling.STATE.acquire()
    return _CAPTURE.server


def _port(port: Any, func: str, name: str) -> int:
    if not _checks.is_int(port):
        _checks.fail(ProfilerArgumentTypeError, func, name, "an int in 1..65535", port)
    if not 0 < port < 65536:
        # "got <value>": the shape tests and users match on (no type name for an int).
        raise ProfilerArgumentError(
            f"{func}: {name} must be an int in 1..65535, got {port!r}; pick a free TCP port, e.g. 9012"
        )
    return int(port)


def stop_server() -> None:
    """Stops the server :func:`start_server` started.

    Raises:
        ProfilerError: no server runs.
    """
    with _CAPTURE.lock:
        if _CAPTURE.server is None:
            raise ProfilerError("stop_server(): no profiler server runs; start_server(port) starts one")
        try:
            jax.profiler.stop_server()
        finally:
            _CAPTURE.server = _CAPTURE.server_port = None
            profiling.STATE.release()


def _local_hosts() -> set[str]:
    names = {"localhost", "127.0.0.1", "::1", "[::1]", "0.0.0.0", socket.gethostname()}
    with contextlib.suppress(OSError):
        names.add(socket.gethostbyname(socket.gethostname()))
    return names


def _is_own_server(address: str) -> bool:
    host, _, port = address.strip().removeprefix("grpc://").rpartition(":")
    return _CAPTURE.server_port is not None and port == str(_CAPTURE.server_port) and host in _local_hosts()


def _trace_args(
    func: str,
    service_addr: Any,
    logdir: Any,
    duration_ms: Any,
    num_tracing_attempts: Any,
    host_tracer_level: Any,
    device_tracer_level: Any,
    delay_ms: Any,
    timeout_s: Any,
    interval_s: Any,
) -> tuple[str, list[str]]:
    """Checks :func:`trace`'s arguments; returns the directory and the server addresses."""
    expected = "'host:port' (comma-separated for several)"
    if not isinstance(service_addr, str):
        _checks.fail(ProfilerArgumentTypeError, func, "service_addr", expected, service_addr)
    addresses = [a.strip() for a in service_addr.split(",") if a.strip()]
    if not addresses or not all(a.rpartition(":")[2].isdigit() and a.rpartition(":")[0] for a in addresses):
        _checks.fail(ProfilerArgumentError, func, "service_addr", expected, service_addr, "e.g. 'localhost:9012'")
    path = _logdir(logdir, func)
    if not _checks.is_int(duration_ms):
        _checks.fail(ProfilerArgumentTypeError, func, "duration_ms", "an int > 0 (milliseconds)", duration_ms)
    if duration_ms <= 0:
        _checks.fail(ProfilerArgumentError, func, "duration_ms", "an int > 0 (milliseconds)", duration_ms)
    for name, value, minimum in (
        ("num_tracing_attempts", num_tracing_attempts, 1),
        ("delay_ms", delay_ms, 0),
        ("timeout_s", timeout_s, 0),
        ("interval_s", interval_s, 0),
    ):
        error = ProfilerArgumentError if _checks.is_int(value) else ProfilerArgumentTypeError
        _checks.check_int(value, func, name, error, minimum=minimum)
    _level(host_tracer_level, func, "host_tracer_level", 3, optional=False)
    _level(device_tracer_level, func, "device_tracer_level", 1, optional=False)
    return path, addresses


def trace(
    service_addr: str,
    logdir: str | os.PathLike[str],
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    timeout_s: int = 120,
    interval_s: int = 5,
) -> None:
    """Captures ``duration_ms`` of the profiler server(s) at ``service_addr`` into ``logdir`` (``xp.trace``).

    Blocks until done. When ``service_addr`` is this process's own server
    (``localhost:<port>`` of :func:`start_server`, the usual PyTorch/XLA
    pattern), the capture runs here, through ``jax.profiler``. Other
    addresses (another process or host) need the ``xprof`` package, whose
    client JAX's ``python -m jax.collect_profile`` uses too.

    Args:
        service_addr: ``host:port`` of the server, or several, comma-separated.
        logdir: Directory the trace goes to.
        duration_ms: How long to capture.
        num_tracing_attempts: Attempts for a remote capture.
        host_tracer_level: 1 critical, 2 info, 3 verbose host events.
        device_tracer_level: 0 leaves device events out of a remote capture
            (a local capture always records them: JAX has no switch).
        delay_ms: Wait this long before capturing.
        timeout_s: Accepted for PyTorch/XLA compatibility (JAX's client retries
            ``num_tracing_attempts`` times instead).
        interval_s: Accepted for PyTorch/XLA compatibility.

    Raises:
        ProfilerArgumentError: a malformed argument (``service_addr`` not
            ``host:port``, an empty ``logdir``, ``duration_ms`` < 1, a level out
            of range...; a ``ValueError``).
        ProfilerError: the address is not this process's server and ``xprof``
            is not installed, or a trace is already being captured here.
    """
    path, addresses = _trace_args(
        "trace",
        service_addr,
        logdir,
        duration_ms,
        num_tracing_attempts,
        host_tracer_level,
        device_tracer_level,
        delay_ms,
        timeout_s,
        interval_s,
    )
    if delay_ms > 0:
        time.sleep(delay_ms / 1000)
    if all(_is_own_server(a) for a in addresses):
        start_trace(path, host_tracer_level=host_tracer_level)
        try:
            time.sleep(duration_ms / 1000)
        finally:
            stop_trace()
        return
    try:
        from xprof.convert import _pywrap_profiler_plugin  # type: ignore[import-not-found]
    except ImportError:
        own = f"localhost:{_CAPTURE.server_port}" if _CAPTURE.server_port is not None else "none started"
        raise ProfilerError(
            f"cannot capture a trace from {service_addr!r}: it is not this process's profiler server "
            f"({own}) and capturing from another process needs the 'xprof' package (pip install xprof). "
            "Alternatively capture in the process itself with spmdtorch.debug.profile(logdir) or "
            "start_trace/stop_trace, or use TensorBoard's profile plugin"
        ) from None
    options = {
        "host_tracer_level": host_tracer_level,
        "device_tracer_level": device_tracer_level,
        "delay_ms": 0,
    }
    _pywrap_profiler_plugin.trace(",".join(addresses), path, "", True, duration_ms, num_tracing_attempts, options)


def trace_detached(
    service_addr: str,
    logdir: str | os.PathLike[str],
    duration_ms: int = 1000,
    num_tracing_attempts: int = 3,
    host_tracer_level: int = 2,
    device_tracer_level: int = 1,
    delay_ms: int = 0,
    timeout_s: int = 120,
    interval_s: int = 5,
) -> threading.Thread:
    """:func:`trace` in a background thread; returns at once (``xp.trace_detached``).

    Returns:
        The (daemon) thread; ``join()`` it to wait for the capture.

    Raises:
        ProfilerArgumentError: a malformed argument, as for :func:`trace`
            (checked here, not silently in the thread).
    """
    _trace_args(
        "trace_detached",
        service_addr,
        logdir,
        duration_ms,
        num_tracing_attempts,
        host_tracer_level,
        device_tracer_level,
        delay_ms,
        timeout_s,
        interval_s,
    )
    thread = threading.Thread(
        target=trace,
        args=(service_addr, logdir, duration_ms, num_tracing_attempts, host_tracer_level),
        kwargs={
            "device_tracer_level": device_tracer_level,
            "delay_ms": delay_ms,
            "timeout_s": timeout_s,
            "interval_s": interval_s,
        },
        name="spmdtorch-profiler-trace",
        daemon=True,
    )
    thread.start()
    return thread


# -- annotations -----------------------------------------------------------------------------


class Trace(jax.profiler.TraceAnnotation):
    """A named span on the trace for the ``with`` block (``xp.Trace``); metadata as keywords.

    Example:
        >>> from spmdtorch.debug.profiler import Trace
        >>> with Trace("forward", layer=3):
        ...     pass
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = _checks.check_str(name, "Trace", "name", ProfilerArgumentTypeError)
        super().__init__(name, **kwargs)


class StepTrace(Trace):
    """One training step on the trace (``xp.StepTrace``); leaving the block syncs, as in PyTorch/XLA.

    Example:
        >>> import torch
        >>> from spmdtorch.debug.profiler import StepTrace
        >>> w = torch.ones(2, device="xla")
        >>> for step in range(2):
        ...     with StepTrace("train_step", step_num=step):
        ...         _ = w.mul_(2)
        >>> w.cpu()
        tensor([4., 4.])
    """

    def __init__(self, name: str, **kwargs: Any) -> None:
        self.name = _checks.check_str(name, "StepTrace", "name", ProfilerArgumentTypeError)
        # What jax.profiler.StepTraceAnnotation passes: "_r=1" makes it a step (root) event.
        jax.profiler.TraceAnnotation.__init__(self, name, _r=1, **kwargs)  # type: ignore[call-arg]

    def __exit__(self, *exc: Any) -> None:
        try:
            mark_step()
        finally:
            super().__exit__(*exc)


def trace_me(name: str) -> Callable[[F], F]:
    """Decorator: each call of the function is a span named ``name`` (``xp.trace_me``).

    Example:
        >>> @trace_me("loss")
        ... def loss(x):
        ...     return x * 2
        >>> loss(3)
        6
    """
    _checks.check_str(name, "trace_me", "name", ProfilerArgumentTypeError)

    def wrap(func: F) -> F:
        _checks.check_callable(func, f"trace_me({name!r})", "func", ProfilerArgumentTypeError)
        wrapped: F = jax.profiler.annotate_function(func, name=name)
        return wrapped

    return wrap
