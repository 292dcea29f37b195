"""``CheckpointManager``: periodic, asynchronous, preemption-aware checkpoints.

A thin layer over ``orbax.checkpoint.CheckpointManager``, which already does
the hard parts: atomic step finalisation (a step is written under a temporary
name and renamed only once complete, so ``all_steps`` never lists a partial
one), ``max_to_keep`` garbage collection and background writes (an async save
blocks only for the device→host copy). This layer adds the spmdtorch state
(see :func:`spmdtorch.checkpoint.save`), fingerprint checks with fallback to
the newest intact step, and SIGTERM-driven preemption saves on one host.

One writer per directory: a manager's first save takes an exclusive
``flock`` on ``<dir>/.spmdtorch-writer.lock``; only then does it remove the
unfinished saves of killed writers. A manager that only reads (``all_steps``,
``restore``) deletes nothing, so it cannot remove another process's saves
in flight.

Every save failure is a :class:`CheckpointSaveError` naming the step and the
directory, its cause chained. A background (async) save that fails is
reported by the manager's next ``save``/``save_async``,
``wait_until_finished``/``join`` or ``close``, once; ``restore`` waits for
the write but never raises its failure (a restore is not the save's caller).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import operator
import os
import signal
import socket
import threading
import types
import typing
import warnings
import weakref
from collections.abc import Callable
from typing import IO, Any, Literal, overload

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint.checkpoint_managers import preservation_policy

from spmdtorch import _checks
from spmdtorch.checkpoint import io
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentError,
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    CheckpointExistsError,
    CheckpointSaveError,
    CheckpointWriterError,
    StepNotFoundError,
)
from spmdtorch.checkpoint.paths import CheckpointPath, checkpoint_path
from spmdtorch.lazy import executor
from spmdtorch.runtime import faults

#: Where retired steps go before they are deleted (not a step name, so never listed).
_TRASH = ".spmdtorch-deleted"

__all__ = ["CheckpointManager"]

log = logging.getLogger("spmdtorch.checkpoint")


class _LatestWritten(preservation_policy.PreservationPolicy):
    """Orbax retention keeping the ``n`` steps written last (by commit time), whatever their numbers.

    Orbax's ``max_to_keep`` keeps the last ``n`` of its list, which is in write
    order within a run but re-read in step order by a new manager.
    """

    def __init__(self, n: int) -> None:
        self.n = n

    def should_preserve(self, checkpoints: Any, *, context: Any) -> list[bool]:
        def written(i: int) -> tuple[float, int]:
            when = checkpoints[i].time
            try:
                stamp = when.timestamp()
            except (AttributeError, OverflowError, ValueError):  # no commit time recorded
                stamp = float("-inf")
            return stamp, checkpoints[i].step

        keep = set(sorted(range(len(checkpoints)), key=written)[-self.n :])
        return [i in keep for i in range(len(checkpoints))]


@overload
def _positive_int(value: object, name: str, allow_none: Literal[False] = False) -> int: ...
@overload
def _positive_int(value: object, name: str, allow_none: bool) -> int | None: ...
def _positive_int(value: object, name: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointArgumentError(f"{name} must be a positive int{' or None' if allow_none else ''}, got {value!r}")
    return value


#: The file a writing manager holds an exclusive ``flock`` on (never a step name, so never listed).
_WRITER_LOCK = ".spmdtorch-writer.lock"


@dataclasses.dataclass
class _HeldLock:
    """This process's hold on one directory's writer lock, and the manager writing with it."""

    file: IO[bytes]
    owner: weakref.ref[CheckpointManager]


# Directory (real path) -> this process's hold. flock conflicts between two
# open files even in one process, so a process holds each lock once and a
# later manager on the same directory takes the hold over (PyTorch/XLA's own
# tests re-open a manager without closing the previous one).
_held: dict[str, _HeldLock] = {}
_held_guard = threading.Lock()


def _lock_key(directory: epath.Path) -> str | None:
    text = str(directory)
    return None if "://" in text else os.path.realpath(text)  # remote storage has no flock


def _writer_lock(mgr: CheckpointManager, func: str) -> None:
    """Make ``mgr`` this process's writer of its directory, taking the ``flock`` if no manager here holds it.

    One writer per checkpoint directory: a second writer would delete the
    first's in-flight saves as leftovers, and both would retire each other's
    steps. The kernel releases a ``flock`` when its process ends, so a killed
    writer never leaves the directory locked.

    Raises:
        CheckpointWriterError: another process holds the lock.
    """
    key = _lock_key(mgr.directory)
    if key is None:
        return
    with _held_guard:
        held = _held.get(key)
        if held is None:
            path = os.path.join(key, _WRITER_LOCK)
            f = open(path, "a+b")
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                f.seek(0)
                holder = f.read(200).decode("utf-8", errors="replace").strip() or "unknown"
                f.close()
                raise CheckpointWriterError(
                    f"{func}: another process is writing checkpoints to {mgr.directory} (it holds {path}: "
                    f"{holder}); one writer per checkpoint directory, or the two would delete each other's "
                    "saves. Save to another directory, or stop the other writer first; reading (restore, "
                    "all_steps, latest_step) needs no lock"
                ) from e
            f.truncate(0)
            f.write(f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
            f.flush()
            held = _held[key] = _HeldLock(f, weakref.ref(mgr))
            weakref.finalize(mgr, _release_writer_lock, mgr.directory, None)
            return
        previous = held.owner()
        if previous is not None and previous is not mgr:
            # Its background saves end before the new writer cleans up leftovers.
            previous._finish_writes(report=False)  # a failure stays the previous manager's to report
            previous._writer = False
        held.owner = weakref.ref(mgr)
        weakref.finalize(mgr, _release_writer_lock, mgr.directory, None)


def _release_writer_lock(directory: epath.Path, mgr: CheckpointManager | None) -> None:
    """Release this process's hold if ``mgr`` owns it (None: if its owner is gone, from a finaliser)."""
    key = _lock_key(directory)
    if key is None:
        return
    with _held_guard:
        held = _held.get(key)
        if held is None:
            return
        owner = held.owner()
        if owner is not mgr:
            return
        del _held[key]
        with contextlib.suppress(OSError):
            fcntl.flock(held.file.fileno(), fcntl.LOCK_UN)
        held.file.close()


def _check_step(step: object, func: str) -> int:
    """``step`` as an int if it is a non-negative int (not a bool), else a named argument error.

    A step is a directory name under the manager's directory: ``"../x"``
    would write outside it, and ``-1``, ``2.5`` or ``True`` would be saved and
    listed by this manager but never found again by a restarted one (Orbax
    lists only non-negative integer names).
    """
    fix = "steps are directory names: pass the training step as an int >= 0"
    if not _checks.is_int(step):
        _checks.fail(CheckpointArgumentTypeError, func, "step", "an int >= 0", step, fix)
    value = operator.index(typing.cast(typing.SupportsIndex, step))  # an Integral (numpy's included)
    if value < 0:
        _checks.fail(CheckpointArgumentError, func, "step", "an int >= 0", step, fix)
    return value


class CheckpointManager:
    """Saves a training state every ``save_interval_steps`` steps under ``directory/<step>``.

    Args:
        directory: where the step directories go (created if missing).
        save_interval_steps: ``should_save(step)`` is True when ``step`` is a
            multiple, and for the first step saved into an empty directory
            (Orbax's rule: a run always has a checkpoint early).
        max_to_keep: keep only this many newest steps (None keeps all).
        async_save: write in the background; ``save`` returns after the
            device→host copy (and dispatching the fingerprint programs, which
            the background write awaits). Call ``wait_until_finished()``
            before reading the files yourself. False: ``save`` waits for the
            write.
        save_on_preemption: install a SIGTERM handler (main thread only; the
            previous handler is restored by ``close()``): after a SIGTERM the
            next ``save`` saves whatever the interval, waits for the write,
            and ``reached_preemption`` returns True. In a multi-process job
            no handler is installed: JAX's preemption service (started by
            ``jax.distributed.initialize``) catches the SIGTERM of any
            process and every process agrees on one later step, which
            ``save`` then saves everywhere (call ``save`` or
            ``reached_preemption`` every step on every process).

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> from spmdtorch.checkpoint import CheckpointManager
        >>> w = torch.zeros(4, device="xla")
        >>> with CheckpointManager(tempfile.mkdtemp(), save_interval_steps=2) as mgr:
        ...     for step in range(5):
        ...         _ = w.add_(1)
        ...         _ = mgr.save(step, {"w": w, "step": step})
        ...         if mgr.reached_preemption(step):
        ...             break
        ...     mgr.wait_until_finished()
        ...     mgr.all_steps(), mgr.restore({"w": w, "step": -1})["step"], w.cpu()
        ([0, 2, 4], 4, tensor([5., 5., 5., 5.]))
    """

    #: Which steps ``max_to_keep`` retires. False: Orbax's own order (write order within a run,
    #: step order once a new manager re-reads the directory). True (PyTorch/XLA's manager):
    #: the ones written longest ago, by commit time, also after a restart.
    _retire_oldest_written = False

    def __init__(
        self,
        directory: CheckpointPath,
        save_interval_steps: int = 1,
        max_to_keep: int | None = None,
        async_save: bool = True,
        save_on_preemption: bool = True,
    ) -> None:
        self._directory = checkpoint_path(directory, "directory")
        self._async = _checks.check_bool(async_save, "CheckpointManager", "async_save", CheckpointArgumentTypeError)
        _checks.check_bool(save_on_preemption, "CheckpointManager", "save_on_preemption", CheckpointArgumentTypeError)
        self._writing: int | None = None  # the step of the latest async save (maybe still being written)
        # A background save's failure that a restore waited through: the next
        # save / wait_until_finished / close reports it (see the module docstring).
        self._failure: CheckpointSaveError | None = None
        keep = _positive_int(max_to_keep, "max_to_keep", allow_none=True)
        by_write_time = keep is not None and self._retire_oldest_written
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=_positive_int(save_interval_steps, "save_interval_steps"),
            max_to_keep=None if by_write_time else keep,
            preservation_policy=_LatestWritten(keep) if by_write_time and keep is not None else None,
            # Always Orbax's async path; a blocking save waits for it in save().
            # Orbax's blocking path would wait for the record (hence for the
            # fingerprints) inside its own save call, before they are dispatched.
            enable_async_checkpointing=True,
            # Step directories made in save()'s blocking phase (one mkdir), not
            # by a background thread that every writer waits for: when a handler
            # raised in the blocking phase, nothing waited for that thread, and a
            # process ending soon after was held ~300 s by writers waiting for
            # its "directory created" signal (see io.save).
            async_options=ocp.options.AsyncOptions(create_directories_asynchronously=False),
            create=True,
            # A step is deleted (max_to_keep) by renaming it into _TRASH first, so
            # that a process killed while deleting never leaves a half-deleted step
            # that all_steps() would list; the trash is emptied by _empty_trash().
            todelete_subdir=_TRASH,
            # Not Orbax's cleanup at construction: a manager opened only to read
            # (an evaluation job polling latest_step(), a notebook) would delete
            # the in-flight saves of the process writing there. Leftovers of
            # killed saves are removed by the writer, once it holds the
            # directory's writer lock (_become_writer).
            cleanup_tmp_directories=False,
        )
        self._mgr = ocp.CheckpointManager(self._directory, options=options, item_handlers=io.handlers())
        self._writer = False  # set by the first save: this manager holds the writer lock
        self._preempted = False
        self._preemption_step: int | None = None
        self._restored_step: int | None = None
        # What signal.signal returned: a handler, SIG_DFL/SIG_IGN, or None (not set from Python).
        self._previous_handler: Callable[[int, types.FrameType | None], Any] | int | None = None
        self._handler_installed = False
        self._closed = False
        if save_on_preemption:
            self._install_handler()
        # A lost peer names this directory in its resume advice, and a background write in flight.
        faults.note_checkpoint_directory(str(self._directory))
        self._activity = faults.begin_activity(_background_write(weakref.ref(self)))

    # -- preemption ------------------------------------------------------------

    def _install_handler(self) -> None:
        if jax.process_count() > 1:
            # Several processes must save the same step: JAX's preemption
            # service (its own SIGTERM notifier, started by
            # jax.distributed.initialize) agrees on it and Orbax reports it;
            # a Python handler here would replace JAX's and let one host
            # save alone, waiting forever for the others.
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "CheckpointManager built outside the main thread cannot catch SIGTERM; preemption saves are off",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
        self._handler_installed = True  # (the previous handler may be None: not set from Python)

    def _on_sigterm(self, signum: int, frame: types.FrameType | None) -> None:
        # Only a flag: the save itself must happen at a step boundary, where
        # the state is consistent, not inside whatever the signal interrupted.
        self._preempted = True

    def reached_preemption(self, step: int) -> bool:
        """True once a preemption was seen *and* a step boundary saved for it.

        A SIGTERM sets a flag; the next ``save`` saves whatever the interval
        and then this returns True, so a loop that calls ``save`` then
        ``reached_preemption`` every step stops with its last step on disk.
        (A SIGTERM that lands between this step's ``save`` and this call is
        reported at the next step, after that step's save.) JAX's multi-host
        preemption notice is passed through as Orbax reports it.
        """
        if self._preempted:
            return self._preemption_step is not None
        return bool(self._mgr.reached_preemption(step))

    # -- saving ----------------------------------------------------------------

    @property
    def directory(self) -> epath.Path:
        """The directory holding the step directories."""
        return self._directory

    def _due(self, step: int) -> bool:
        """Whether the interval asks for ``step`` (Orbax's rule; the PyTorch/XLA-style manager overrides it)."""
        return bool(self._mgr.should_save(step))

    def should_save(self, step: int) -> bool:
        """Whether ``save(step, ...)`` would save (interval reached, or preemption)."""
        step = _check_step(step, f"{type(self).__name__}.should_save")
        if self._preempted and step not in self.all_steps():
            return True
        return self._due(step)

    def save_async(self, step: int, state: object, force: bool = False) -> bool:
        """``save`` in the background, whatever ``async_save`` says (PyTorch/XLA's ``save_async``).

        Returns after the device→host copy; the write goes on in the
        background (``wait_until_finished``/``join`` wait for it).
        """
        return self._save(step, state, force, asynchronous=True, func="save_async")

    def save(self, step: int, state: object, force: bool = False) -> bool:
        """Save ``state`` as ``step`` if ``should_save(step)`` (or ``force``); return whether it did.

        Asynchronous when the manager was built with ``async_save=True`` (the
        default), else it returns once the step is written.

        Raises:
            CheckpointArgumentTypeError: ``step`` is not an int (a bool, a float, a str).
            CheckpointArgumentError: ``step`` is negative.
            CheckpointExistsError: ``step`` is already saved.
            CheckpointWriterError: another process is writing to this directory
                (one writer per directory: the first save takes its lock).
            UnsupportedValueError: an entry of ``state`` cannot be checkpointed.
            CheckpointSaveError: the save failed (nothing of it is finalised;
                the cause is chained). With ``async_save`` a failure in the
                background is raised by the next ``save``,
                ``wait_until_finished`` or ``close`` (once; the step it names
                is then not saved, and this call's step was not started: save
                again).
        """
        return self._save(step, state, force, asynchronous=self._async)

    def _save(self, step: int, state: object, force: bool, *, asynchronous: bool, func: str = "save") -> bool:
        step = _check_step(step, f"{type(self).__name__}.{func}")
        preempted = self._preempted or bool(self._mgr.reached_preemption(step))
        if not (force or preempted or self._due(step)):
            return False
        self._become_writer(func)
        # The previous background save first: its failure is reported here, as
        # that step's (Orbax's save would wait for it, and raise it as this one's).
        self._finish_writes(not_started=step)
        if step in self._mgr.all_steps():  # written, or still being written
            if preempted and self._preemption_step == step:
                return True
            raise CheckpointExistsError(
                f"step {step} is already saved in {self._directory}; save a later step (latest is {self.latest_step()})"
            )
        args, pending = io.save_args(state)
        try:
            # Orbax's call returns after its device→host copy; only then are
            # the fingerprints dispatched, and its background thread writes
            # the record holding them before it finalises the step.
            # Async: dispatched ahead of the next program, so that save()
            # blocks the loop only for Orbax's device→host copy.
            with (
                faults.activity(f"saving checkpoint step {step} to {self._directory}"),
                io.saving(pending, defer=asynchronous and not preempted),
            ):
                saved = bool(self._mgr.save(step, args=args, force=True))
            if saved:
                self._writing = step
        except Exception as e:
            # The background write of this step (if Orbax started one) now
            # fails on the missing fingerprints: let it end, raise the cause.
            self._finish_writes(report=False)
            self._failure = None  # that is this failure, reported now
            raise _save_error(step, self._directory, e) from e
        except BaseException:
            self._finish_writes(report=False)
            self._failure = None
            raise
        if preempted or not asynchronous:
            # Preempted: the process is about to be killed, the write must finish first.
            self._finish_writes()
        if preempted:
            self._preemption_step = step
            log.warning("preemption: saved step %d to %s", step, self._directory)
        return saved

    def wait_until_finished(self) -> None:
        """Block until every background save is written and finalised.

        Raises:
            CheckpointSaveError: a background save failed (reported once; the
                step it names is not saved).
        """
        self._finish_writes()

    def join(self) -> None:
        """PyTorch/XLA's name for :meth:`wait_until_finished`."""
        self._finish_writes()

    def _finish_writes(self, *, report: bool = True, not_started: int | None = None) -> None:
        """Wait for the background save; raise its failure (``report``), or keep it for the next report.

        Args:
            report: raise a failure now (a save, ``wait_until_finished``,
                ``close``), else keep it in ``self._failure`` (``restore``).
            not_started: the step of the save that is waiting (named in the
                message: it was not started).
        """
        executor.flush_before_next()  # fingerprints deferred to the next program: now
        try:
            self._mgr.wait_until_finished()
        except Exception as e:  # noqa: BLE001 (any background failure is kept as the CheckpointSaveError the manager reports)
            failure = _save_error(self._writing, self._directory, e, background=True, not_started=not_started)
            failure.__cause__ = e
            if self._failure is None:  # the first one is the one to report
                self._failure = failure
        finally:
            self._empty_trash()
        if report and self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _become_writer(self, func: str) -> None:
        """Take the directory's writer lock (once), then remove what killed writers left.

        Raises:
            CheckpointWriterError: another process holds the lock.
        """
        if self._writer:
            return
        if jax.process_index() == 0:  # one process of a job holds it and deletes
            _writer_lock(self, f"{type(self).__name__}.{func}")
            self._remove_leftovers()
        self._writer = True
        self._empty_trash()
        # Steps another writer finalised since this manager listed the directory.
        self._mgr.reload()

    def _remove_leftovers(self) -> None:
        """Remove unfinished saves (``<step>.orbax-checkpoint-tmp...``): the writer lock says no one is writing them."""
        for child in self._directory.iterdir():
            if io.TMP_MARK in child.name:
                with contextlib.suppress(OSError):
                    child.rmtree()

    def _empty_trash(self) -> None:
        """Remove the steps that ``max_to_keep`` retired (already out of every listing); the writer only."""
        if not self._writer or jax.process_index() != 0:  # one process deletes (the directory may be shared)
            return
        trash = self._directory / _TRASH
        if trash.exists():
            for child in trash.iterdir():
                with contextlib.suppress(OSError):  # another process's cleanup got there first
                    child.rmtree()

    # -- listing and restoring ---------------------------------------------------

    def all_steps(self) -> list[int]:
        """The completely written steps, oldest first (not a step still being written).

        A manager that has not saved re-reads the directory each time, so a
        reader polling beside the writing process sees its new steps.
        """
        if not self._writer:
            self._mgr.reload()
        steps = set(self._mgr.all_steps())
        # Orbax lists a step as soon as its async save starts; it is not on
        # disk (finalised) until the background write ends.
        if self._writing is not None and self._mgr.is_saving_in_progress():
            steps.discard(self._writing)
        return sorted(steps)

    def latest_step(self) -> int | None:
        """The highest completely written step (None if there is none); what ``restore`` loads first."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    @property
    def restored_step(self) -> int | None:
        """The step the last ``restore`` loaded (after a fallback, an older one)."""
        return self._restored_step

    def step_path(self, step: int) -> epath.Path:
        """The checkpoint directory of ``step`` (what ``spmdtorch.checkpoint.load`` takes)."""
        step = _check_step(step, f"{type(self).__name__}.step_path")
        return self._directory / str(step)

    def restore(
        self, state: Any, step: int | None = None, *, strict: bool = True, cast: bool = False, fallback: bool = True
    ) -> Any:
        """Fill ``state`` from ``step`` (the newest when None); return the state.

        With ``step=None`` and ``fallback``, a damaged newest step
        (``CheckpointCorruptionError``) is reported with a warning and the
        next older step is tried, down to the oldest.

        Raises:
            StepNotFoundError: ``step`` is not saved, or there is no step at all.
            CheckpointCorruptionError: the step (every step, with fallback) is damaged.
            MissingKeysError, UnexpectedKeysError, ShapeMismatchError, DtypeMismatchError:
                see :func:`spmdtorch.checkpoint.load`.
        """
        # Waits for a background save, but leaves its failure to the next
        # save / wait_until_finished / close: this caller did not make it.
        self._finish_writes(report=False)
        steps = self.all_steps()
        if step is not None:
            step = _check_step(step, f"{type(self).__name__}.restore")
            if step not in steps:
                raise StepNotFoundError(
                    f"step {step} is not saved in {self._directory}; saved steps: {steps}; "
                    "pass one of them, or step=None for the newest"
                )
            out = io.load(self.step_path(step), state, strict=strict, cast=cast)
            self._restored_step = step
            return out
        if not steps:
            raise StepNotFoundError(f"{self._directory} holds no saved step; save one first")
        failures: list[CheckpointCorruptionError] = []
        candidates = steps if fallback else steps[-1:]
        for i, s in enumerate(reversed(candidates)):
            try:
                out = io.load(self.step_path(s), state, strict=strict, cast=cast)
            except CheckpointCorruptionError as e:
                failures.append(e)
                if i + 1 < len(candidates):  # only when there is an older step to try (never with fallback=False)
                    warnings.warn(f"step {s} is damaged, trying an older step: {e}", RuntimeWarning, stacklevel=2)
                continue
            self._restored_step = s
            return out
        raise CheckpointCorruptionError(
            f"no intact step in {self._directory}: " + " | ".join(str(e) for e in failures),
            tuple(k for e in failures for k in e.keys),
        ) from failures[-1]

    # -- lifetime ----------------------------------------------------------------

    def close(self) -> None:
        """Finish background saves, release Orbax's resources, restore the SIGTERM handler.

        Raises:
            CheckpointSaveError: a background save failed and was not reported
                yet (everything is released first).
        """
        if self._closed:
            return
        self._closed = True
        faults.end_activity(self._activity)
        try:
            self._finish_writes(report=False)
            self._mgr.close()
        finally:
            _release_writer_lock(self._directory, self)
            if self._handler_installed:
                previous = self._previous_handler
                signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
                self._handler_installed = False
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        # Leaving on an exception: a save failure must not replace it; it is logged instead.
        try:
            self.close()
        except CheckpointSaveError as failure:
            log.error("%s (while leaving the manager's block on %s)", failure, type(exc).__name__)

    def __repr__(self) -> str:
        return f"CheckpointManager({str(self._directory)!r}, steps={self.all_steps()})"


def _save_error(
    step: int | None,
    directory: epath.Path,
    cause: BaseException,
    *,
    background: bool = False,
    not_started: int | None = None,
) -> CheckpointSaveError:
    """The :class:`CheckpointSaveError` of a failed save of ``step`` (the caller chains ``cause``)."""
    what = f"checkpoint step {step}" if step is not None else "a checkpoint step"
    how = "its background write failed" if background else "failed"
    then = f"; step {not_started} was not started: save it again" if not_started not in (None, step) else ""
    return CheckpointSaveError(
        f"{what} could not be saved to {directory} ({how}: {type(cause).__name__}: {str(cause)[:500]}); "
        f"nothing of it was finalised, the previous steps stand{then}"
    )


def _background_write(ref: weakref.ref[CheckpointManager]) -> Callable[[], str | None]:
    """What a manager's background write is doing, for a ``PeerLostError`` (None: nothing in flight)."""

    def describe() -> str | None:
        mgr = ref()
        if mgr is None or mgr._closed or mgr._writing is None or not mgr._mgr.is_saving_in_progress():
            return None
        return (
            f"writing checkpoint step {mgr._writing} to {mgr._directory} in the background (an async save: "
            "it is never finalised, so never listed)"
        )

    return describe
