"""A lost peer ends every other process of the job at once, with a named error.

JAX's coordination service notices a dead process only after the heartbeat
timeout, and then aborts every other process from C++ (SIGABRT, "another
task died"): no Python error, no hint of what was lost or how to resume. Its
``missed_heartbeat_callback`` cannot replace that abort from Python (jaxlib
0.10.2 fails to pass the status to a Python callable: ``std::bad_cast`` and
``std::terminate``), and a Python ``SIGABRT`` handler never runs because
``abort()`` does not return to the interpreter (docs/design.md, decision 19).

So a process that joins a job also joins a *peer watch*: process 0 listens
on an ephemeral TCP port (published in the coordination service's key-value
store) and every other process keeps one connection to it. The kernel
closes a process's sockets when it dies (SIGKILL, a crash, JAX's own abort),
so its peer sees end-of-file at once, long before any heartbeat timeout; a
process that ends normally says ``bye`` first (``atexit``), one that ends on
an uncaught exception says ``fail``. Process 0 tells every other process
which one was lost. Each process then writes one line to stderr::

    spmdtorch.runtime.PeerLostError: process 1 of 2 was lost (...) while this process (0 of 2) was ...

and exits with status :data:`PEER_LOST_EXIT_STATUS` (75, ``EX_TEMPFAIL``:
retry the job). It exits rather than raising because the main thread is
usually blocked inside a collective that can never complete.

A host that vanishes without closing its sockets (power loss, a network
partition) still ends the others through JAX's heartbeat abort, after
``SPMDTORCH_HEARTBEAT_TIMEOUT`` seconds. ``SPMDTORCH_PEER_WATCH=0`` turns
the watch off. What this process was doing is named from :func:`activity`
regions (checkpoint saves and restores) and the main thread's stack.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import selectors
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

__all__ = [
    "PEER_LOST_EXIT_STATUS",
    "PeerLostError",
    "activity",
    "begin_activity",
    "end_activity",
    "note_checkpoint_directory",
    "start_peer_watch",
]

#: Exit status of a process that stopped because a peer was lost (``EX_TEMPFAIL``: try the job again).
PEER_LOST_EXIT_STATUS = 75

#: Key-value store key under which process 0 publishes its watch port.
_PORT_KEY = "spmdtorch/peer_watch/port"

#: Seconds an uncaught error that a lost peer may have caused (a JAX runtime error, a closed
#: connection) waits for the peer watch before it counts as this process's own failure. A
#: SIGKILLed peer's collective connection can close a moment before its watch connection:
#: without the wait the survivor's error won that race and the launcher named the survivor,
#: not the killed process, as the job's cause (CI, stop 51).
LOSS_WAIT_S = 2.0


class PeerLostError(RuntimeError):
    """Another process of the multi-process job died or failed, so this one cannot go on.

    Written as one line to stderr (``spmdtorch.runtime.PeerLostError: ...``)
    by every surviving process, which then exits with status
    :data:`PEER_LOST_EXIT_STATUS` (75). The message names the lost process,
    what this process was doing, the heartbeat timeout and how to resume.

    Attributes:
        peer: Index of the lost process, or None when unknown.
        activity: What this process was doing when it noticed.
    """

    def __init__(self, message: str, peer: int | None = None, activity: str = "") -> None:
        super().__init__(message)
        self.peer = peer
        self.activity = activity


# --------------------------------------------------------------------------
# What this process is doing
# --------------------------------------------------------------------------

#: token -> a description, or a callable giving one (None: over).
_ACTIVITIES: dict[int, str | Callable[[], str | None]] = {}
_TOKENS = itertools.count()
_CHECKPOINT_DIRS: list[str] = []


def begin_activity(what: str | Callable[[], str | None]) -> int:
    """Records that this process is doing ``what`` (e.g. a background save); returns a token for :func:`end_activity`.

    ``what`` may be a callable, asked only when a peer is lost, returning
    None once the activity is over (an async save that finished by itself).
    """
    token = next(_TOKENS)
    _ACTIVITIES[token] = what
    return token


def end_activity(token: int) -> None:
    """Ends the activity :func:`begin_activity` returned ``token`` for."""
    _ACTIVITIES.pop(token, None)


@contextlib.contextmanager
def activity(what: str) -> Iterator[None]:
    """Names what the code inside is doing ("checkpoint restore of step 3") in a :class:`PeerLostError`.

    Example:
        >>> with activity("checkpoint restore of step 3"):
        ...     pass
    """
    token = begin_activity(what)
    try:
        yield
    finally:
        end_activity(token)


def note_checkpoint_directory(directory: str) -> None:
    """Remembers a checkpoint directory in use, to name it in the resume advice of a :class:`PeerLostError`."""
    if directory in _CHECKPOINT_DIRS:
        _CHECKPOINT_DIRS.remove(directory)
    _CHECKPOINT_DIRS.append(directory)
    del _CHECKPOINT_DIRS[:-3]


def _describe_activity() -> str:
    parts = []
    for what in list(_ACTIVITIES.values()):
        try:
            text = what() if callable(what) else what
        except Exception:  # noqa: BLE001 (a dying process: describe what can be described)
            continue
        if text:
            parts.append(text)
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    where = _user_location(frame)
    if not parts and _waiting_on_program(frame):
        parts.append("waiting for a program's results (a collective that needs the lost process)")
    if not parts:
        parts.append("running Python code")
    return ", ".join(parts) + (f", at {where}" if where else "")


# spmdtorch/ (this module is spmdtorch/runtime/faults.py): frames anywhere in the library are not the user's.
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_MARKERS = ("site-packages", "dist-packages", f"{os.sep}lib{os.sep}python")


def _user_location(frame: Any) -> str:
    """The innermost main-thread frame outside spmdtorch and installed libraries: ``file:line (function)``."""
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_PACKAGE_DIR) and not any(m in path for m in _LIBRARY_MARKERS) and "<" not in path:
            return f"{os.path.basename(path)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return ""


def _waiting_on_program(frame: Any) -> bool:
    """Whether the main thread is inside spmdtorch's or JAX's execution or transfer code."""
    lazy = os.path.join(_PACKAGE_DIR, "lazy")
    tensor = os.path.join(_PACKAGE_DIR, "tensor")
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith((lazy, tensor)) or f"{os.sep}jax{os.sep}" in path:
            return True
        frame = frame.f_back
    return False


def _resume_advice() -> str:
    if _CHECKPOINT_DIRS:
        where = f"CheckpointManager({_CHECKPOINT_DIRS[-1]!r})"
    else:
        where = "your CheckpointManager"
    return (
        f"restart the whole job; it resumes from {where}.latest_step(), the newest completely written "
        "step (a save cut short is never listed)"
    )


def peer_lost_error(
    peer: int | None,
    how: str,
    process_id: int,
    num_processes: int,
    heartbeat_timeout_s: int,
    *,
    failing: str | None = None,
) -> PeerLostError:
    """Builds the :class:`PeerLostError` a survivor reports (one line).

    ``failing``: the type name of an uncaught exception this process is ending on (its stack is gone by
    then), or ``SystemExit(<code>)`` for a failing ``sys.exit``.

    Example:
        >>> e = peer_lost_error(1, "killed", 0, 2, 100)
        >>> e.peer, str(e)[:50]
        (1, 'process 1 of 2 was lost (killed) while this proces')
    """
    what = _describe_activity()
    if failing is not None:
        what = f"ending on {_ending(failing)}" + ("" if what == "running Python code" else f", {what}")
    who = f"process {peer} of {num_processes}" if peer is not None else "a peer process"
    message = (
        f"{who} was lost ({how}) while this process ({process_id} of {num_processes}) was {what}; it was "
        f"noticed from its closed connection (JAX's heartbeat timeout is {heartbeat_timeout_s} s). "
        f"This process exits with status {PEER_LOST_EXIT_STATUS}: {_resume_advice()}"
    )
    # One stderr line: paths and descriptions may hold line breaks.
    return PeerLostError(" ".join(message.split()), peer, " ".join(what.split()))


def _report_and_exit(error: PeerLostError) -> NoReturn:
    """Writes the error as one stderr line and ends the process (the main thread may never return to Python)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    line = f"spmdtorch.runtime.PeerLostError: {error}\n"
    with contextlib.suppress(OSError):
        os.write(2, line.encode("utf-8", errors="replace"))
    os._exit(PEER_LOST_EXIT_STATUS)


# --------------------------------------------------------------------------
# The peer watch
# --------------------------------------------------------------------------


class _Watch:
    """One process's side of the peer watch (see the module docstring)."""

    def __init__(
        self, process_id: int, num_processes: int, heartbeat_timeout_s: int, finished_marker: str | None = None
    ) -> None:
        self.process_id = process_id
        self.finished_marker = finished_marker  # a file to create when the script ends without failure
        self.num_processes = num_processes
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.lock = threading.Lock()
        self.peers: dict[int, socket.socket] = {}  # process 0: rank -> its connection; others: {0: ...}
        self.leaving = False  # this process is exiting normally: ends are no longer losses
        self.failing: str | None = None  # an uncaught exception's type name, or "SystemExit(<status>)"
        self.exit_status = 1  # the status a failing process ends with (sys.exit's, else Python's 1)
        self.loss_noticed = threading.Event()  # set once lost() runs: the process is about to exit 75

    def lost(self, peer: int | None, how: str) -> NoReturn:
        self.loss_noticed.set()
        error = peer_lost_error(
            peer, how, self.process_id, self.num_processes, self.heartbeat_timeout_s, failing=self.failing
        )
        _report_and_exit(error)

    def await_loss(self, seconds: float) -> None:
        """Gives the watch ``seconds`` to notice a lost peer; once it has, waits for it to end the process."""
        if self.peers and self.loss_noticed.wait(seconds):
            # lost() is writing its line and will os._exit(75); this thread must not say
            # goodbye first (that would end the process with status 1).
            time.sleep(30.0)

    def say_goodbye(self) -> None:
        """At exit: tell the peers this end is expected, or a failure after an uncaught exception.

        After a failure the process ends here with status 1, as Python would:
        the handlers registered before the join (JAX's shutdown barrier among
        them) would only wait for peers that are stopping because of it.
        """
        with self.lock:
            if self.leaving:
                return
            self.leaving = True
            word = b"bye\n" if self.failing is None else f"fail {self.process_id} {self.failing}\n".encode()
            if self.failing is None and self.finished_marker is not None:
                # For the launcher: this script finished. If this process dies
                # later, waiting in JAX's shutdown barrier, a peer that never
                # finished is to blame, not this one (spmdtorch.launch.local).
                with contextlib.suppress(OSError), open(self.finished_marker, "w"):
                    pass
            for sock in self.peers.values():
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    sock.sendall(word)
        if self.failing is not None and self.peers:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(self.exit_status)

    def note_exit(self, code: object) -> None:
        """``sys.exit(code)`` was called: a non-zero status is a failure the peers must hear of.

        Python never shows ``SystemExit`` to ``sys.excepthook``, so without this
        a ``sys.exit(3)`` said ``bye`` and its peers waited in their next
        collective until JAX's barrier timed out, losing the status.
        """
        if code is None or code == 0:
            return
        # Python's own rule: an int is the status, anything else is printed and gives 1.
        status = code if isinstance(code, int) and not isinstance(code, bool) else 1
        self.failing = f"SystemExit({code!r})"
        self.exit_status = status & 0xFF if status & 0xFF else 1

    def forget_in_child(self) -> None:
        """In a forked child: the connections are the parent's; never speak or close them for it."""
        self.leaving = True
        self.peers = {}
        self.lock = threading.Lock()


def _lines(sock: socket.socket, buffer: bytearray) -> tuple[list[str], bool]:
    """Reads what ``sock`` has; returns the complete lines and whether it reached end-of-file."""
    try:
        data = sock.recv(4096)
    except OSError:
        data = b""
    if not data:
        return [], True
    buffer.extend(data)
    lines = []
    while b"\n" in buffer:
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        lines.append(line.decode("utf-8", errors="replace").strip())
    return lines, False


def _ending(failing: str) -> str:
    """How a failing process ends, in words: ``sys.exit(3)`` or ``an uncaught ValueError``."""
    if failing.startswith("SystemExit(") and failing.endswith(")"):
        return f"sys.exit{failing[len('SystemExit') :]}"
    return f"an uncaught {failing}"


def _fail_reason(line: str) -> str:
    _, _, exc = line.partition(" ")
    _, _, exc = exc.partition(" ")
    return f"it ended on {_ending(exc or 'exception')}"


_KILLED = "its connection closed without a goodbye: killed, crashed or aborted"


def _serve(watch: _Watch, server: socket.socket) -> None:
    """Process 0: accept every peer, notice any that ends without a goodbye, tell the others."""
    sel = selectors.DefaultSelector()
    sel.register(server, selectors.EVENT_READ)
    buffers: dict[socket.socket, bytearray] = {}
    ranks: dict[socket.socket, int] = {}
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)  # invariant: only sockets are registered
            if sock is server:
                with contextlib.suppress(OSError):
                    conn, _ = server.accept()
                    conn.setblocking(True)
                    buffers[conn] = bytearray()
                    sel.register(conn, selectors.EVENT_READ)
                continue
            lines, eof = _lines(sock, buffers[sock])
            for line in lines:
                if line.startswith("hello ") and line[6:].isdigit():  # anything else is not a peer
                    ranks[sock] = int(line[6:])
                    with watch.lock:
                        watch.peers[ranks[sock]] = sock
                elif line == "bye" or line.startswith("fail "):
                    sel.unregister(sock)
                    with watch.lock:
                        watch.peers.pop(ranks.get(sock, -1), None)
                    if line.startswith("fail ") and not watch.leaving:
                        _tell_and_exit(watch, ranks.get(sock), _fail_reason(line))
                    eof = False
                    break
            if eof:
                with contextlib.suppress(KeyError, ValueError):
                    sel.unregister(sock)
                rank = ranks.get(sock)
                with watch.lock:
                    leaving = watch.leaving or rank not in watch.peers
                    watch.peers.pop(rank if rank is not None else -1, None)
                if not leaving:
                    _tell_and_exit(watch, rank, _KILLED)


def _tell_and_exit(watch: _Watch, rank: int | None, how: str) -> NoReturn:
    with watch.lock:
        for sock in watch.peers.values():
            with contextlib.suppress(OSError):
                sock.settimeout(1.0)
                sock.sendall(f"lost {rank if rank is not None else -1} {how}\n".encode())
    watch.lost(rank, how)


def _follow(watch: _Watch, client: Any, host: str, init_timeout_s: int) -> None:
    """Every other process: connect to process 0's watch, then wait for a loss or a goodbye."""
    try:
        port = int(client.blocking_key_value_get(_PORT_KEY, init_timeout_s * 1000))
        sock = socket.create_connection((host, port), timeout=30.0)
        sock.settimeout(None)
        sock.sendall(f"hello {watch.process_id}\n".encode())
    except Exception as e:  # noqa: BLE001 (the job still runs; only the fast notice of a loss is off)
        _warn(f"peer watch off ({type(e).__name__}: {e}); a lost peer is noticed after the heartbeat timeout")
        return
    with watch.lock:
        watch.peers[0] = sock
    buffer = bytearray()
    while True:
        lines, eof = _lines(sock, buffer)
        for line in lines:
            if line.startswith("lost "):
                _, rank, how = (line.split(" ", 2) + [""])[:3]
                with watch.lock:
                    leaving = watch.leaving  # done with the job: a late loss changes nothing
                if not leaving:
                    watch.lost(int(rank) if rank.isdigit() else None, how or _KILLED)
                return
            if line == "bye" or line.startswith("fail "):
                with watch.lock:
                    watch.peers.pop(0, None)
                    leaving = watch.leaving
                if line.startswith("fail ") and not leaving:
                    watch.lost(0, _fail_reason(line))
                return
        if eof:
            with watch.lock:
                leaving = watch.leaving
            if not leaving:
                watch.lost(0, _KILLED)
            return


def _may_come_from_a_lost_peer(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) is one a dead peer can cause.

    A collective cut short raises JAX's runtime error (gloo's closed connection
    surfaces as one); a socket of the user's own to the dead host, an OSError.

    Example:
        >>> _may_come_from_a_lost_peer(ValueError("bad shape"))
        False
        >>> _may_come_from_a_lost_peer(ConnectionResetError())
        True
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) or type(current).__name__ in ("JaxRuntimeError", "XlaRuntimeError"):
            return True
        current = current.__cause__ or current.__context__
    return False


def _warn(text: str) -> None:
    with contextlib.suppress(Exception):
        sys.stderr.write(f"spmdtorch: {text}\n")


#: Seconds an abort() waits before ending the process (libc's sleep(SIGABRT), below).
ABORT_DELAY_S = int(signal.SIGABRT)


def _delay_aborts() -> None:
    """Makes ``abort()`` wait ``ABORT_DELAY_S`` seconds, so that the peer watch names a lost coordinator first.

    When process 0 dies, JAX's client in every other process aborts the
    instant its RPC socket closes, the same instant the watch sees its own
    connection close: the watch would lose that race. libc's ``sleep``
    installed as the SIGABRT handler (``sleep(6)`` in the aborting thread:
    async-signal-safe, no Python, no GIL) holds the abort for 6 seconds, then
    ``abort()`` restores the default action and the process ends with SIGABRT
    as before. Any other abort (a genuine crash) is delayed, not changed.
    """
    try:
        libc = ctypes.CDLL(None)
        handler = ctypes.cast(libc.sleep, ctypes.c_void_p).value
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(int(signal.SIGABRT), handler)
    except (OSError, AttributeError):  # no libc with sleep/signal (not Linux/macOS): JAX's abort is immediate
        pass


_STARTED: list[_Watch] = []


def start_peer_watch(
    client: Any,
    process_id: int,
    num_processes: int,
    coordinator_host: str,
    heartbeat_timeout_s: int,
    init_timeout_s: int,
    *,
    finished_marker: str | None = None,
) -> None:
    """Joins this process to the job's peer watch (once; see the module docstring).

    Args:
        client: JAX's ``DistributedRuntimeClient`` (its key-value store carries process 0's port).
        process_id: This process's index.
        num_processes: Processes in the job.
        coordinator_host: The host of the coordinator address (process 0's).
        heartbeat_timeout_s: JAX's heartbeat timeout, named in the error.
        init_timeout_s: How long to wait for process 0's port.
        finished_marker: A file created when the script ends without failure
            (``spmdtorch.launch`` reads it to name a hung peer); None: none.
    """
    if _STARTED or num_processes < 2:
        return
    watch = _Watch(process_id, num_processes, heartbeat_timeout_s, finished_marker)
    _STARTED.append(watch)
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        watch.failing = kind.__name__
        previous_hook(kind, value, tb)  # the error is shown either way
        if _may_come_from_a_lost_peer(value):
            watch.await_loss(LOSS_WAIT_S)

    sys.excepthook = excepthook
    previous_exit = sys.exit

    def exit_(code: str | int | None = None) -> NoReturn:
        watch.note_exit(code)
        previous_exit(code)
        raise AssertionError("unreachable: sys.exit returned")  # keeps the NoReturn contract for type checkers

    # sys.exit is wrapped (only in a process that joined a multi-process job):
    # SystemExit reaches no hook, and `raise SystemExit(n)` written directly
    # still ends with a goodbye (docs/reliability.md says so).
    sys.exit = exit_
    _delay_aborts()
    # Registered after JAX's own atexit shutdown, so it runs before it (LIFO):
    # the goodbye goes out before the shutdown barrier waits for the others.
    atexit.register(watch.say_goodbye)
    # A forked child (a DataLoader worker) inherits the sockets; its exit must not say goodbye for us.
    os.register_at_fork(after_in_child=watch.forget_in_child)
    if process_id == 0:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", 0))
        client.key_value_set(_PORT_KEY, str(server.getsockname()[1]))
        target: Callable[..., None] = _serve
        args: tuple[Any, ...] = (watch, server)
    else:
        target, args = _follow, (watch, client, coordinator_host, init_timeout_s)
    threading.Thread(target=target, args=args, name="spmdtorch-peer-watch", daemon=True).start()
