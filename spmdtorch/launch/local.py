"""Start N copies of a script on this machine as one multi-process job.

Each process gets ``K`` simulated CPU devices and the environment that
:func:`spmdtorch.runtime.initialize_distributed` reads (``import spmdtorch``
joins the job with it, no init call needed), so a script written for a
multi-host cluster runs unchanged on one machine. Output lines are
streamed with a ``[rank i]`` prefix. When a process fails, the others get
SIGTERM, and SIGKILL after a grace period (JAX traps SIGTERM in a
multi-process job, so only SIGKILL is sure to stop it).

Example:
    >>> result = launch(["-c", "import os; print(os.environ['RANK'])"], nprocs=2)  # doctest: +SKIP
    [rank 0] 0
    [rank 1] 1
    >>> result.returncode                                                   # doctest: +SKIP
    0
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, TextIO

from spmdtorch import _checks, runtime
from spmdtorch.runtime import cpu_devices

__all__ = ["LaunchError", "LaunchResult", "RankResult", "child_env", "describe_exit", "free_port", "launch"]

#: Seconds between the first failure and SIGKILL for the processes still running.
DEFAULT_GRACE_PERIOD_S = 10.0
_POLL_S = 0.05


class LaunchError(ValueError):
    """The launch request is malformed (bad counts, empty command...)."""


@dataclasses.dataclass(frozen=True)
class RankResult:
    """How one process ended.

    Attributes:
        rank: The process index.
        returncode: Its exit status (negative: killed by that signal number).
        stopped_by_launcher: The launcher signalled it because another process
            failed (or the launch was interrupted); False when it died of a
            SIGKILL that the launcher did not send (it only sent SIGTERM).
        elapsed_s: Seconds from the start of the launch to its exit.
        finished_script: Its script ended without failure (it noted so at
            exit); a process that then dies (e.g. aborted by JAX after
            waiting for a hung peer in the shutdown barrier) is not the cause.
    """

    rank: int
    returncode: int
    stopped_by_launcher: bool
    elapsed_s: float
    finished_script: bool = False

    @property
    def meaning(self) -> str:
        """What the exit status means: ``"ok"``, ``"killed by SIGKILL"``, ``"peer lost (PeerLostError)"``...

        Example:
            >>> RankResult(0, runtime.PEER_LOST_EXIT_STATUS, False, 3.0).meaning
            'peer lost (PeerLostError)'
        """
        # A process the launcher signalled may still have ended by itself (JAX traps SIGTERM): only
        # a death by signal is the launcher's doing.
        stopped = self.stopped_by_launcher and self.returncode < 0
        waited = self.finished_script and self.returncode != 0
        return (
            describe_exit(self.returncode)
            + (", after its script had finished (waiting for the others)" if waited else "")
            + (", stopped by the launcher" if stopped else "")
        )


@dataclasses.dataclass(frozen=True)
class LaunchResult:
    """The outcome of :func:`launch`.

    Attributes:
        returncode: 0 when every process succeeded, else the exit status of
            the first process that failed (a signal ``s`` reads ``128 + s``,
            as in a shell).
        ranks: One :class:`RankResult` per process, by rank.
        first_failure: Rank of the first process that failed, or None. A
            process that stopped because it lost a peer (status 75,
            ``PeerLostError``) is a consequence: when another process
            failed by itself (not killed by the launcher; killed by someone
            else counts, e.g. the OOM killer's SIGKILL), that one is named.
        timed_out: The launch hit ``timeout_s`` and stopped the processes.
    """

    returncode: int
    ranks: tuple[RankResult, ...]
    first_failure: int | None
    timed_out: bool = False


def free_port(host: str = "127.0.0.1") -> int:
    """Returns a TCP port that is free on ``host`` right now.

    Example:
        >>> 0 < free_port() < 65536
        True
    """
    _checks.check_str(host, "free_port", "host", LaunchError, nonempty=True)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]  # (host, port) for AF_INET; typeshed says Any
        return port


def child_env(
    rank: int,
    nprocs: int,
    devices_per_proc: int,
    coordinator: str,
    master_port: int,
    *,
    heartbeat_timeout_s: int | None = None,
    base: Mapping[str, str] | None = None,
    finished_dir: str | None = None,
) -> dict[str, str]:
    """The environment of process ``rank``: distributed settings and CPU devices.

    Sets ``SPMDTORCH_COORDINATOR_ADDRESS`` / ``SPMDTORCH_NUM_PROCESSES`` /
    ``SPMDTORCH_PROCESS_ID`` (read by ``initialize_distributed()``), torchrun's
    ``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE`` /
    ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (for code that reads them; the port
    differs from the coordinator's so ``torch.distributed`` can use it), CPU
    as the platform with ``devices_per_proc`` devices (``XLA_FLAGS`` and
    ``SPMDTORCH_CPU_DEVICES``) and enough XLA threads (``NPROC``), and
    unbuffered Python output. With
    ``finished_dir``, ``SPMDTORCH_LAUNCH_FINISHED_DIR``: where the process
    notes that its script finished (``RankResult.finished_script``).

    Example:
        >>> env = child_env(1, 2, 4, "127.0.0.1:5000", 5001, base={})
        >>> env["SPMDTORCH_PROCESS_ID"], env["RANK"], env["XLA_FLAGS"]
        ('1', '1', '--xla_force_host_platform_device_count=4')
    """
    what = "child_env"
    nprocs = _checks.check_int(nprocs, what, "nprocs", LaunchError, minimum=1)
    _checks.check_int(rank, what, "rank", LaunchError, minimum=0, maximum=nprocs - 1)
    _checks.check_int(devices_per_proc, what, "devices_per_proc", LaunchError, minimum=1)
    _checks.check_str(coordinator, what, "coordinator", LaunchError, nonempty=True)
    _checks.check_int(master_port, what, "master_port", LaunchError, minimum=0, maximum=65535)
    if heartbeat_timeout_s is not None:
        _checks.check_int(heartbeat_timeout_s, what, "heartbeat_timeout_s", LaunchError, minimum=1)
    if base is not None and not isinstance(base, Mapping):
        _checks.fail(LaunchError, what, "base", "a mapping of environment variables or None", base)
    if finished_dir is not None:
        _checks.check_str(finished_dir, what, "finished_dir", LaunchError, nonempty=True)
    env = dict(os.environ if base is None else base)
    # A launch from inside a process that joined a job starts a new job: its children join it.
    env.pop(runtime.ENV_JOINED_PID, None)
    host = coordinator.rsplit(":", 1)[0]
    env.update(
        {
            runtime.ENV_COORDINATOR_ADDRESS: coordinator,
            runtime.ENV_NUM_PROCESSES: str(nprocs),
            runtime.ENV_PROCESS_ID: str(rank),
            "MASTER_ADDR": host,
            "MASTER_PORT": str(master_port),
            "RANK": str(rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "JAX_PLATFORMS": "cpu",
            "PJRT_DEVICE": "CPU",
            # What import spmdtorch applies; also replaces a count inherited from the caller's environment.
            cpu_devices.ENV_CPU_DEVICES: str(devices_per_proc),
            "PYTHONUNBUFFERED": "1",
        }
    )
    flag = "--xla_force_host_platform_device_count"
    flags = re.sub(rf"{flag}=\S*", "", env.get("XLA_FLAGS", "")).split()
    env["XLA_FLAGS"] = " ".join(flags + [f"{flag}={devices_per_proc}"])
    # XLA's CPU client sizes its thread pool from NPROC; fewer threads than
    # 2 x devices can deadlock queued collectives (docs/design.md, hazard "CPU collective deadlock").
    try:
        nproc = int(env.get("NPROC", "0"))
    except ValueError:
        nproc = 0
    env["NPROC"] = str(max(nproc, 16, 2 * devices_per_proc))
    if heartbeat_timeout_s is not None:
        env[runtime.ENV_HEARTBEAT_TIMEOUT] = str(int(heartbeat_timeout_s))
    env.pop(runtime.ENV_LAUNCH_FINISHED_DIR, None)  # a nested launch's children note in their own
    if finished_dir is not None:
        env[runtime.ENV_LAUNCH_FINISHED_DIR] = finished_dir
    return env


def _pump(rank: int, stream: IO[bytes], out: TextIO, lock: threading.Lock) -> None:
    """Copies ``stream`` to ``out`` line by line, each line prefixed with the rank."""
    prefix = f"[rank {rank}] "
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        with lock:
            out.write(prefix + line + "\n")
            out.flush()
    stream.close()


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the child leads its own process group
    except (ProcessLookupError, PermissionError):
        pass


def _shell_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def launch(  # noqa: C901, PLR0915  (why: the supervisor reads top to bottom: check options, spawn, watch, restart, tear down, sharing one worker table; a candidate for splitting)
    command: Sequence[str],
    *,
    nprocs: int,
    devices_per_proc: int = 1,
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S,
    host: str = "127.0.0.1",
    port: int | None = None,
    heartbeat_timeout_s: int | None = None,
    env: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    python: str = sys.executable,
    timeout_s: float | None = None,
) -> LaunchResult:
    """Runs ``python *command`` as ``nprocs`` processes of one job and waits for them.

    Args:
        command: Arguments after the interpreter: ``["train.py", "--steps",
            "5"]``, ``["-m", "pkg.mod"]`` or ``["-c", "code"]``.
        nprocs: Number of processes (>= 1).
        devices_per_proc: Simulated CPU devices per process (>= 1).
        grace_period_s: After the first failure, seconds the other processes
            get to stop by themselves (they receive SIGTERM at once) before
            SIGKILL.
        host: Address of process 0's coordinator.
        port: Coordinator port; a free one when None.
        heartbeat_timeout_s: Passed to the processes as
            ``SPMDTORCH_HEARTBEAT_TIMEOUT`` (seconds before a silent peer is
            declared dead).
        env: Base environment (default ``os.environ``).
        out: Where the prefixed lines go (default ``sys.stdout``).
        python: The interpreter to run.
        timeout_s: Stop every process (SIGTERM, then SIGKILL after the grace
            period) once this many seconds have passed; the result's
            ``returncode`` is then 124 (as with ``timeout(1)``) unless a
            process had already failed.

    Returns:
        A :class:`LaunchResult`.

    Raises:
        LaunchError: ``nprocs``, ``devices_per_proc`` or ``grace_period_s`` is
            out of range, or ``command`` is empty.
        KeyboardInterrupt: after stopping every process (SIGTERM, then
            SIGKILL after the grace period).
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int) or nprocs < 1:
        raise LaunchError(f"nprocs must be an int >= 1, got {nprocs!r}")
    if isinstance(devices_per_proc, bool) or not isinstance(devices_per_proc, int) or devices_per_proc < 1:
        raise LaunchError(f"devices_per_proc must be an int >= 1, got {devices_per_proc!r}")
    if not _checks.check_float(grace_period_s, "launch", "grace_period_s", LaunchError) >= 0:
        raise LaunchError(f"grace_period_s must be >= 0 seconds, got {grace_period_s!r}")
    if timeout_s is not None and not (_checks.check_float(timeout_s, "launch", "timeout_s", LaunchError) > 0):
        raise LaunchError(f"timeout_s must be > 0 seconds or None, got {timeout_s!r}")
    _checks.check_str(host, "launch", "host", LaunchError, nonempty=True)
    if port is not None:
        _checks.check_int(port, "launch", "port", LaunchError, minimum=0, maximum=65535)
    if heartbeat_timeout_s is not None:
        _checks.check_int(heartbeat_timeout_s, "launch", "heartbeat_timeout_s", LaunchError, minimum=1)
    if env is not None and not isinstance(env, Mapping):
        _checks.fail(LaunchError, "launch", "env", "a mapping of environment variables or None", env)
    if out is not None and not callable(getattr(out, "write", None)):
        _checks.fail(LaunchError, "launch", "out", "a text stream (with write) or None", out)
    _checks.check_str(python, "launch", "python", LaunchError, nonempty=True)
    if (
        isinstance(command, str)
        or not isinstance(command, Sequence)
        or not command
        or not all(isinstance(c, str) for c in command)
    ):
        raise LaunchError(
            f"command must be a non-empty list of arguments after the interpreter, e.g. "
            f"['train.py', '--steps', '5'], got {command!r}"
        )
    out = sys.stdout if out is None else out
    coordinator = f"{host}:{port if port is not None else free_port(host)}"
    master_port = free_port(host)
    lock = threading.Lock()
    start = time.monotonic()
    procs: list[subprocess.Popen[bytes]] = []
    pumps: list[threading.Thread] = []
    ended: dict[int, float] = {}
    stopped: set[int] = set()  # ranks the launcher signalled
    sigkilled: set[int] = set()  # ... and of those, the ones it sent SIGKILL
    first_failure: int | None = None
    kill_at: float | None = None
    timed_out = False
    # Each process creates <finished_dir>/<rank> when its script ends without
    # failure: one that dies after that was waiting for a peer, not the cause.
    finished_dir = tempfile.mkdtemp(prefix="spmdtorch-launch-")

    def finished(rank: int) -> bool:
        return os.path.exists(os.path.join(finished_dir, str(rank)))

    try:
        for rank in range(nprocs):
            proc = subprocess.Popen(
                [python, *command],
                env=child_env(
                    rank,
                    nprocs,
                    devices_per_proc,
                    coordinator,
                    master_port,
                    heartbeat_timeout_s=heartbeat_timeout_s,
                    base=env,
                    finished_dir=finished_dir,
                ),
                stdin=subprocess.DEVNULL,
                # Two pipes, each copied line by line: with one shared pipe a
                # C++ library's stderr write (gloo's "[Gloo] Rank 1 is
                # connected ...") landed between an unbuffered print()'s text
                # and its newline, splitting that line.
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # own process group: signals reach its children too
            )
            procs.append(proc)
            for stream in (proc.stdout, proc.stderr):
                pump = threading.Thread(target=_pump, args=(rank, stream, out, lock), daemon=True)
                pump.start()
                pumps.append(pump)
        while len(ended) < nprocs:
            now = time.monotonic()
            for rank, proc in enumerate(procs):
                if rank in ended or proc.poll() is None:
                    continue
                ended[rank] = now - start
                if proc.returncode != 0 and first_failure is None and rank not in stopped:
                    first_failure = rank
                    kill_at = now + grace_period_s
                    note = ""
                    if finished(rank):
                        # It finished its script and died waiting (JAX's shutdown
                        # barrier): a peer that never finished is the cause.
                        hung = [r for r, p in enumerate(procs) if r not in ended and p.poll() is None]
                        hung = [r for r in hung if not finished(r)]
                        if hung:
                            first_failure = hung[0]
                            note = (
                                f" after its script had finished; rank {hung[0]} never finished its script "
                                "(hung or still running)"
                            )
                    with lock:
                        out.write(
                            f"[launch] rank {rank} failed with exit status "
                            f"{_status(proc.returncode)}{note}; stopping the other processes\n"
                        )
                        out.flush()
                    for other, p in enumerate(procs):
                        if other not in ended and p.poll() is None:
                            stopped.add(other)
                            _signal_group(p, signal.SIGTERM)
            if timeout_s is not None and not timed_out and now - start >= timeout_s and len(ended) < nprocs:
                timed_out = True
                kill_at = now + grace_period_s if kill_at is None else min(kill_at, now + grace_period_s)
                with lock:
                    out.write(f"[launch] timed out after {timeout_s:g} s; stopping every process\n")
                    out.flush()
                for rank, proc in enumerate(procs):
                    if rank not in ended and proc.poll() is None:
                        stopped.add(rank)
                        _signal_group(proc, signal.SIGTERM)
            if kill_at is not None and now >= kill_at:
                for rank, proc in enumerate(procs):
                    if rank not in ended and proc.poll() is None:
                        stopped.add(rank)
                        sigkilled.add(rank)
                        _signal_group(proc, signal.SIGKILL)
            time.sleep(_POLL_S)
    except BaseException:
        # Interrupted (Ctrl-C) or failed to start a process: stop every child.
        for rank, proc in enumerate(procs):
            if proc.poll() is None:
                stopped.add(rank)
                _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace_period_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
        raise
    finally:
        for pump in pumps:
            pump.join(timeout=5.0)
        done = {r for r in range(len(procs)) if finished(r)}
        shutil.rmtree(finished_dir, ignore_errors=True)
    # A rank signalled only with SIGTERM that died of SIGKILL was killed by
    # someone else (the OOM killer, a scheduler, a test) before or while the
    # launcher stopped it: not the launcher's doing, so it may be the cause.
    by_launcher = {r for r in stopped if not (procs[r].returncode == -signal.SIGKILL and r not in sigkilled)}
    ranks = tuple(
        RankResult(rank, proc.returncode, rank in by_launcher, ended[rank], rank in done)
        for rank, proc in enumerate(procs)
    )
    if first_failure is not None and procs[first_failure].returncode == runtime.PEER_LOST_EXIT_STATUS:
        # The peers of a failing process may end first (they are told at once,
        # sometimes before the launcher has seen the failing process end): name the cause.
        causes = [
            r
            for r in sorted(ended, key=ended.__getitem__)
            if procs[r].returncode not in (0, runtime.PEER_LOST_EXIT_STATUS)
            and not (r in by_launcher and procs[r].returncode < 0)
        ]
        first_failure = causes[0] if causes else first_failure
    if first_failure is not None:
        code = _shell_code(procs[first_failure].returncode)
    else:
        code = 124 if timed_out else 0
    result = LaunchResult(code, ranks, first_failure, timed_out)
    if code != 0:
        with lock:
            out.write(_summary(result))
            out.flush()
    return result


def describe_exit(returncode: int) -> str:
    """What a process's exit status means, in words (a negative status: killed by that signal).

    Example:
        >>> describe_exit(-9), describe_exit(75), describe_exit(1)
        ('killed by SIGKILL', 'peer lost (PeerLostError)', 'failed (exit status 1)')
    """
    _checks.check_int(returncode, "describe_exit", "returncode", LaunchError)
    if returncode == 0:
        return "ok"
    if returncode == runtime.PEER_LOST_EXIT_STATUS:
        return "peer lost (PeerLostError)"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"killed by signal {-returncode}"
        return f"aborted ({name})" if returncode == -signal.SIGABRT else f"killed by {name}"
    return f"failed (exit status {returncode})"


def _summary(result: LaunchResult) -> str:
    """The lines the launcher prints after a failed or timed-out launch: the first failure, then every rank."""
    lines = []
    if result.first_failure is not None:
        first = result.ranks[result.first_failure]
        lines.append(
            f"[launch] first failure: rank {first.rank} ({first.meaning}) after {first.elapsed_s:.1f} s; "
            f"exit status {result.returncode}"
        )
    elif result.timed_out:
        lines.append(f"[launch] timed out; exit status {result.returncode}")
    for r in result.ranks:
        lines.append(f"[launch]   rank {r.rank}: exit status {r.returncode}, {r.meaning}, after {r.elapsed_s:.1f} s")
    return "".join(line + "\n" for line in lines)


def _status(returncode: int) -> str:
    """``-9 (killed by SIGKILL)``, ``75 (peer lost (PeerLostError))``, or the plain number of an ordinary failure."""
    if returncode < 0 or returncode == runtime.PEER_LOST_EXIT_STATUS:
        return f"{returncode} ({describe_exit(returncode)})"
    return str(returncode)
