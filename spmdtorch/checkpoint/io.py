"""``save``/``load``: a training state as one Orbax composite checkpoint.

Layout of a checkpoint directory (a standard Orbax ``CompositeCheckpointHandler``
checkpoint, finalised atomically by Orbax: written under a temporary name and
renamed when complete)::

    <path>/arrays/   every tensor, a PyTree checkpoint of nested dicts with str
                     keys mirroring the state (``model/fc1.weight`` ...);
                     zero-size tensors (a 0 in the shape) are not in it
                     (Orbax cannot store them): they hold no data, and the
                     record's dtype and shape say all of them
    <path>/meta/metadata
                     JSON: the state's structure, its plain Python values, and
                     per array its key path, torch dtype, shape and fingerprint

``load`` reads every array straight into the *target's* sharding (other mesh,
other device count, padded uneven dims: Orbax reads only each device's block),
verifies every fingerprint on device, and only then swaps the new data into
the target tensors, so a failed load leaves the state untouched.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, TypeAlias

import jax
import numpy as np
import numpy.typing as npt
import orbax.checkpoint as ocp
import torch
from etils import epath

from spmdtorch import _checks, _dtypes
from spmdtorch.checkpoint import fingerprint, placement, tree
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    CheckpointExistsError,
    CheckpointSaveError,
    DtypeMismatchError,
    MissingKeysError,
    NotACheckpointError,
    OverwriteRefusedError,
    ShapeMismatchError,
    UnexpectedKeysError,
    ValueKindMismatchError,
)
from spmdtorch.checkpoint.paths import CheckpointPath, checkpoint_path
from spmdtorch.checkpoint.tree import KeyPath
from spmdtorch.lazy import executor
from spmdtorch.runtime import faults

__all__ = [
    "ARRAYS",
    "FORMAT",
    "META",
    "TMP_MARK",
    "SaveFingerprints",
    "empty_array",
    "is_stored",
    "load",
    "read_record",
    "save",
    "save_args",
    "saving",
]

ARRAYS: Final = "arrays"
META: Final = "meta"
META_FILE = "metadata"  # the JsonCheckpointHandler's file name
FORMAT = "spmdtorch.checkpoint"
VERSION = 1
#: In the name of a step directory Orbax has not finalised (a save in flight, or killed).
TMP_MARK = ".orbax-checkpoint-tmp"

#: The checkpoint's JSON record (see the module docstring).
Record: TypeAlias = "dict[str, Any]"


# -- the meta item: JSON whose fingerprints are resolved in the background ------

# How long the record's write waits for the fingerprints to be *dispatched*
# (which happens right after Orbax's blocking phase, on the saving thread). It
# only bounds a wait that a bug would make endless; computing them is not bounded.
DISPATCH_TIMEOUT_S = 600.0
# How long the record's write leaves deferred fingerprints to the next program
# before dispatching them itself.
SELF_DISPATCH_AFTER_S = 0.5


class SaveFingerprints:
    """The device fingerprints of one save: dispatched after Orbax's copy, awaited by the record's write.

    An async save must block the training loop only for Orbax's device→host
    copy. The fingerprint programs are therefore dispatched only after Orbax's
    blocking phase returns (:meth:`dispatch`, on the saving thread), and the
    record that holds them is written by the commit future that Orbax awaits
    on its background thread (:meth:`results`). A save that fails before
    dispatching calls :meth:`fail`, so that write raises instead of waiting;
    either way no step is finalised without every fingerprint in its record.

    Example:
        >>> import jax.numpy as jnp
        >>> p = SaveFingerprints([jnp.arange(3.0)], [None], [0])
        >>> p.dispatch()
        >>> p.results(timeout=1.0)[0][0]
        0
    """

    def __init__(
        self, sources: Sequence[jax.Array], logical_shapes: Sequence[tuple[int, ...] | None], indices: Sequence[int]
    ) -> None:
        self._sources = list(sources)
        self._logical = list(logical_shapes)
        self._indices = list(indices)
        self._dispatched = threading.Event()
        self._fps: list[jax.Array] = []
        self._error: BaseException | None = None

    def dispatch(self) -> None:
        """Start the fingerprint programs (not waited for); a failure is also handed to :meth:`results`."""
        if self._dispatched.is_set():
            return
        try:
            fps = fingerprint.device_fingerprints(self._sources, self._logical)
        except BaseException as e:
            self.fail(e)
            raise
        self._fps = fps
        self._sources, self._logical = [], []  # the arrays may be freed once the programs hold them
        self._dispatched.set()

    def fail(self, error: BaseException) -> None:
        """Make :meth:`results` raise ``error`` (no effect once dispatched)."""
        if not self._dispatched.is_set():
            self._error = error
            self._dispatched.set()

    def results(self, timeout: float = DISPATCH_TIMEOUT_S) -> list[tuple[int, list[int]]]:
        """``(array index, [lane1, lane2])`` pairs, waiting for the dispatch and then the devices.

        Raises:
            CheckpointSaveError: the save failed before dispatching, or nothing
                dispatched them within ``timeout`` seconds.
            Exception: whatever computing them on the devices raised.
        """
        # Deferred to the next program (an async save): if none comes soon
        # (the loop ended, or waits for this save), dispatch them from here.
        # Polled, not flushed once: the save registers the dispatch only when
        # Orbax's call returns, which under load comes after the first flush;
        # a single flush then found nothing owed, and the next save (waiting
        # for this write) hung until the timeout.
        deadline = time.monotonic() + timeout
        while not self._dispatched.wait(max(0.0, min(SELF_DISPATCH_AFTER_S, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                break
            executor.flush_before_next()
        if not self._dispatched.is_set():
            raise CheckpointSaveError(
                f"the fingerprints of {len(self._indices)} array(s) were not dispatched within {timeout:.0f} s "
                "of Orbax's save; the checkpoint is not finalised: save again"
            )
        if self._error is not None:
            raise CheckpointSaveError(
                f"the save failed before the fingerprints of its {len(self._indices)} array(s) were computed "
                f"({type(self._error).__name__}: {self._error}); the checkpoint is not finalised"
            ) from self._error
        return [(i, [int(v) for v in np.asarray(fp)]) for i, fp in zip(self._indices, self._fps)]


class MetaHandler(ocp.JsonCheckpointHandler):
    """Orbax's JSON handler, but device fingerprints are awaited off the training thread.

    The record is written by the save's commit future, which runs on a thread
    of its own and is awaited by Orbax's background thread (an async save) or
    at the end of a blocking one, never inside Orbax's blocking phase: that
    phase must be able to return before the fingerprints are even dispatched.
    On disk it is exactly what ``JsonCheckpointHandler`` writes.
    """

    async def async_save(
        self,
        directory: epath.Path,
        item: Mapping[str, Any] | None = None,
        args: ocp.args.CheckpointArgs | None = None,
    ) -> list[ocp.future.Future]:
        if not isinstance(args, MetaSave):
            raise TypeError(f"MetaHandler saves MetaSave arguments, got {type(args).__name__}; use io.save_args")
        record = args.record
        pending = args.pending

        async def write() -> None:
            for i, fp in pending.results():
                record["arrays"][i]["fingerprint"] = fp
            if jax.process_index() == 0:
                (directory / META_FILE).write_text(json.dumps(record, allow_nan=False))

        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="spmdtorch_meta_save")]


@ocp.args.register_with_handler(MetaHandler, for_save=True)
@dataclasses.dataclass
class MetaSave(ocp.args.CheckpointArgs):
    """The record, and the device fingerprints that its write fills in."""

    record: Record
    pending: SaveFingerprints


@ocp.args.register_with_handler(MetaHandler, for_restore=True)
@dataclasses.dataclass
class MetaRestore(ocp.args.CheckpointArgs):
    """Unused by ``load`` (which reads the JSON directly); lets Orbax restore the item."""


def handlers() -> dict[str, ocp.CheckpointHandler]:
    """The item handlers of a checkpoint (for ``CompositeCheckpointHandler``/``CheckpointManager``)."""
    return {ARRAYS: ocp.PyTreeCheckpointHandler(), META: MetaHandler()}


# -- save ------------------------------------------------------------------------


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def is_stored(info: Mapping[str, Any]) -> bool:
    """Whether the record entry ``info`` of an array has data in ``arrays/`` (False for a zero-size array).

    Orbax refuses to save zero-size arrays ("Cannot save arrays with zero
    size"); they hold nothing, so the record's shape and dtype are the whole
    array and restoring one needs no read.
    """
    return all(n != 0 for n in info["shape"])


def empty_array(info: Mapping[str, Any]) -> npt.NDArray[Any]:
    """The zero-size array that record entry ``info`` describes (``is_stored(info)`` is False)."""
    return np.zeros(tuple(info["shape"]), dtype=np.dtype(info["storage_dtype"]))


def _zero_size_storage(e: tree.Entry) -> npt.NDArray[Any]:
    """A zero-size tensor as the (empty) host array its record entry describes, without touching a device."""
    if e.kind == "cpu":
        return placement.host_array(e.value)
    return np.zeros(tuple(e.value.shape), dtype=np.dtype(_dtypes.to_jax_dtype(e.value.dtype)))


def save_args(state: object) -> tuple[ocp.args.Composite, SaveFingerprints]:
    """The Orbax arguments that save ``state``, and its fingerprints (not yet dispatched).

    Call ``ocp.AsyncCheckpointer.save`` or an async ``ocp.CheckpointManager.save``
    with the arguments inside :func:`saving`, which dispatches the fingerprints
    once Orbax's blocking phase (its device→host copy) is over.

    Raises:
        UnsupportedValueError: an entry that cannot be checkpointed.
    """
    executor.sync()  # pending values (the last step's results) become concrete
    entries = tree.flatten(state)
    to_save: dict[KeyPath, jax.Array | npt.NDArray[Any]] = {}
    infos: list[dict[str, Any]] = []
    index: dict[KeyPath, int] = {}
    device_src: list[jax.Array] = []
    device_logical: list[tuple[int, ...] | None] = []
    device_idx: list[int] = []
    for e in entries:
        if e.kind == "value":
            continue
        i = len(infos)
        index[e.path] = i
        arr: jax.Array | npt.NDArray[Any]
        if e.value.numel() == 0:
            # Recorded only (see is_stored): Orbax cannot save it, and there is nothing to save.
            arr = _zero_size_storage(e)
            fp = list(fingerprint.fingerprint_numpy(arr))
        elif e.kind == "xla":
            arr, fp_src, logical = placement.save_value(e.value)
            device_src.append(fp_src)
            device_logical.append(logical)
            device_idx.append(i)
            fp = None
        else:
            arr = placement.host_array(e.value)
            fp = list(fingerprint.fingerprint_numpy(arr))
        if e.value.numel() != 0:
            to_save[e.path] = arr
        infos.append(
            {
                "path": list(e.path),
                "kind": e.kind,
                "dtype": _dtype_name(e.value.dtype),
                "storage_dtype": str(np.dtype(arr.dtype)),
                "shape": list(e.value.shape),
                "fingerprint": fp,
            }
        )
    pending = SaveFingerprints(device_src, device_logical, device_idx)
    record = {"format": FORMAT, "version": VERSION, "tree": tree.encode(state, index), "arrays": infos}
    items: dict[str, Any] = {META: MetaSave(record, pending)}
    if to_save:
        items[ARRAYS] = ocp.args.PyTreeSave(tree.orbax_tree(to_save))
    return ocp.args.Composite(**items), pending


@contextlib.contextmanager
def saving(pending: SaveFingerprints, *, defer: bool = False) -> Iterator[None]:
    """Around Orbax's (async) save call: dispatch the fingerprints after it returns, or fail them.

    Dispatching after the call keeps the fingerprint programs from delaying
    Orbax's device→host copy; failing them when the call raises keeps the
    record's write (already started by Orbax) from waiting for them. With
    ``defer`` they are dispatched ahead of the next program instead
    (``executor.before_next_execution``; the record's write dispatches them
    itself if none comes), so an async save returns right after the copy.
    """
    try:
        yield
    except BaseException as e:
        pending.fail(e)
        raise
    if defer:
        executor.before_next_execution(pending.dispatch)
    else:
        pending.dispatch()


# What Orbax writes at the top of a checkpoint directory besides the two items.
_ORBAX_TOP_FILES = frozenset({"_CHECKPOINT_METADATA", "commit_success.txt"})


def _check_replaceable(path: epath.Path) -> None:
    """Refuse ``overwrite=True`` unless ``path`` is empty or holds one checkpoint and nothing else.

    Orbax's ``force`` deletes the whole directory; a mistyped path (a home
    directory, a dataset, a ``CheckpointManager`` directory of steps) must
    not be deleted for it.

    Raises:
        OverwriteRefusedError: ``path`` is a file, or a directory holding
            anything but an spmdtorch checkpoint.
    """
    if not path.is_dir():
        raise OverwriteRefusedError(
            f"save: path {path} exists and is a file, not a checkpoint directory; overwrite=True replaces only a "
            "checkpoint: pick another path, or remove the file yourself if it is disposable"
        )
    names = sorted(child.name for child in path.iterdir())
    holds_checkpoint = (path / META).is_dir() or (path / ARRAYS).is_dir()
    others = [n for n in names if n not in (ARRAYS, META) and n not in _ORBAX_TOP_FILES]
    if names and (not holds_checkpoint or others):
        steps = _list_steps(path)
        what = (
            f"is a CheckpointManager directory (steps {steps})"
            if steps
            else f"holds {'no spmdtorch checkpoint' if not holds_checkpoint else 'a checkpoint and other files'}"
        )
        shown = others or names
        raise OverwriteRefusedError(
            f"save: path {path} {what}: found {shown[:8]}{' ...' if len(shown) > 8 else ''}; overwrite=True "
            f"replaces only a checkpoint (a directory holding {ARRAYS}/ and {META}/) and would have deleted "
            "all of it. Pick a new path (or a subdirectory of it), or remove the directory yourself if its "
            "contents are disposable"
        )


def _make_parent(path: epath.Path) -> None:
    """Create ``path``'s parent now, so a path that cannot be created fails here, named.

    Orbax creates the directory in the background, and when that fails its
    other writers wait for the "directory created" signal for the whole
    signal timeout (300 s), holding the process at exit.

    Raises:
        CheckpointSaveError: the parent cannot be created (a file on the way,
            no permission); the cause is chained.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointSaveError(
            f"checkpoint {path} could not be saved: its directory {path.parent} cannot be created "
            f"({type(e).__name__}: {e}); pick a path under a writable directory"
        ) from e


def save(path: CheckpointPath, state: object, *, overwrite: bool = False) -> None:
    """Save ``state`` to the checkpoint directory ``path`` (blocking; atomic).

    Args:
        path: a directory that does not exist yet (local or any path Orbax takes).
        state: dicts/lists/tuples of xla tensors, CPU tensors and None/bool/int/
            float/str values, e.g. ``{"model": model.state_dict(),
            "optimizer": opt.state_dict(), "step": step}``.
        overwrite: replace an existing checkpoint at ``path`` (an empty
            directory too); anything else at ``path`` is never deleted.

    Raises:
        CheckpointExistsError: ``path`` exists and ``overwrite`` is False.
        OverwriteRefusedError: ``overwrite`` is True but ``path`` holds
            something other than one checkpoint (nothing is deleted).
        UnsupportedValueError: an entry that cannot be checkpointed.
        CheckpointSaveError: writing failed (the cause is chained); nothing
            was finalised.

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> from spmdtorch import checkpoint
        >>> w = torch.arange(4.0, device="xla")
        >>> d = tempfile.mkdtemp() + "/ckpt"
        >>> checkpoint.save(d, {"w": w, "step": 7})
        >>> _ = w.zero_()
        >>> checkpoint.load(d, {"w": w, "step": 0})["step"]
        7
        >>> w.cpu()
        tensor([0., 1., 2., 3.])
    """
    with faults.activity(f"saving the checkpoint {path}"):
        path = checkpoint_path(path)
        overwrite = _checks.check_bool(overwrite, "save", "overwrite", CheckpointArgumentTypeError)
        if path.exists():
            if not overwrite:
                raise CheckpointExistsError(
                    f"checkpoint path {path} already exists; pick a new path or pass overwrite=True"
                )
            _check_replaceable(path)
        _make_parent(path)
        args, pending = save_args(state)
        # Orbax's async checkpointer, waited for here: the fingerprints run while
        # Orbax writes (a blocking Checkpointer would wait for the record, hence
        # for the fingerprints, before they could be dispatched).
        items = handlers()
        # By keyword (the names are ARRAYS and META): a ``**`` dict would also
        # match the handler's other keyword parameters, as far as types go.
        handler = ocp.CompositeCheckpointHandler(arrays=items[ARRAYS], meta=items[META])
        # Directories created in the blocking phase, not by a background thread:
        # with Orbax's default, every writer thread first waits (up to 300 s) for
        # that thread's "directory created" signal. When a handler raised in the
        # blocking phase, nothing waited for that thread any more; at a prompt
        # exit the interpreter shut its executor down under it, no signal came,
        # and the orphaned writers held the process for the full 300 s. Made
        # here, there is no signal to wait for (this save blocks anyway).
        sync_dirs = ocp.options.AsyncOptions(create_directories_asynchronously=False)
        try:
            with ocp.AsyncCheckpointer(handler, async_options=sync_dirs) as ckptr:
                try:
                    with saving(pending):
                        ckptr.save(path, args=args, force=overwrite)
                except BaseException:
                    # The background write then fails on the missing fingerprints:
                    # let it end (nothing is finalised) and raise the cause, not that.
                    with contextlib.suppress(Exception):
                        ckptr.wait_until_finished()
                    raise
                ckptr.wait_until_finished()
        except Exception as e:
            # Orbax and tensorstore raise whatever their layer raises (ValueError,
            # OSError...); the caller gets one named error with the cause chained.
            raise CheckpointSaveError(
                f"checkpoint {path} could not be saved ({type(e).__name__}: {str(e)[:500]}); nothing of it "
                "was finalised"
            ) from e


# -- load ------------------------------------------------------------------------


def _list_steps(path: epath.Path) -> list[int]:
    out = []
    for child in path.iterdir():
        # isascii: str.isdigit() also accepts digits such as '²' that int() refuses.
        if child.name.isascii() and child.name.isdigit() and (child / META / META_FILE).exists():
            out.append(int(child.name))
    return sorted(out)


def read_record(path: CheckpointPath) -> Record:
    """The JSON record of the checkpoint at ``path``.

    Raises:
        NotACheckpointError: ``path`` is missing or holds no spmdtorch checkpoint.
        CheckpointCorruptionError: ``path`` is a checkpoint whose record is missing or damaged.
    """
    path = checkpoint_path(path)
    if not path.exists():
        tmp = [p.name for p in path.parent.glob(path.name + TMP_MARK + "*")] if path.parent.exists() else []
        hint = f" (found the unfinished save {tmp[0]!r}: that save was interrupted)" if tmp else ""
        raise NotACheckpointError(f"checkpoint path {path} does not exist{hint}")
    meta_file = path / META / META_FILE
    if not meta_file.exists():
        if path.is_dir() and (path / ARRAYS).exists():
            raise CheckpointCorruptionError(
                f"checkpoint {path} has arrays but its record {META}/{META_FILE} is missing: the checkpoint is "
                "damaged; restore another one (CheckpointManager.restore falls back to the newest intact step)"
            )
        steps = _list_steps(path) if path.is_dir() else []
        if steps:
            raise NotACheckpointError(
                f"{path} is a CheckpointManager directory (steps {steps}), not one checkpoint; load "
                f"{path / str(steps[-1])} or use CheckpointManager({str(path)!r}).restore(state)"
            )
        raise NotACheckpointError(
            f"{path} is not an spmdtorch checkpoint: expected {META}/{META_FILE} and {ARRAYS}/ inside it"
        )
    _refuse_special_files(path)
    try:
        record = json.loads(meta_file.read_text())
    except (ValueError, OSError, RecursionError) as e:
        # RecursionError: json nested deeper than Python's stack (a hand-made record).
        raise CheckpointCorruptionError(f"checkpoint record {meta_file} cannot be read: {type(e).__name__}: {e}") from e
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise NotACheckpointError(
            f"{meta_file} is not an spmdtorch checkpoint record (format {record.get('format') if isinstance(record, dict) else None!r}, "
            f"expected {FORMAT!r})"
        )
    version = record.get("version", 0)
    if not _checks.is_int(version) or version < 0:
        raise _damaged(meta_file, "version", f"must be a non-negative int, got {version!r:.80}")
    if version > VERSION:
        raise NotACheckpointError(
            f"checkpoint {path} has format version {record['version']}; this spmdtorch reads up to {VERSION}: upgrade"
        )
    _check_record(record, meta_file)
    stored = sum(is_stored(info) for info in record["arrays"])
    if stored and not (path / ARRAYS).exists():
        raise CheckpointCorruptionError(
            f"checkpoint {path} lists {stored} arrays with data but its {ARRAYS}/ directory is missing"
        )
    return record


def _damaged(meta_file: epath.Path, field: str, what: str) -> CheckpointCorruptionError:
    return CheckpointCorruptionError(
        f"checkpoint record {meta_file}: field {field} {what}; the record was altered or damaged: restore "
        "another checkpoint"
    )


def _is_local(path: epath.Path) -> bool:
    return "://" not in str(path)


def _refuse_special_files(path: epath.Path) -> None:
    """Refuse a checkpoint holding a FIFO, socket or device, before anything is opened.

    Opening a FIFO for reading blocks until a writer comes, which for a
    planted ``meta/metadata`` is forever; ``os.stat`` (which follows
    symbolic links, so linked regular files still load) never blocks.
    Remote paths hold no such files and are not walked.

    Raises:
        CheckpointCorruptionError: naming the file and what it is.
    """
    if not _is_local(path):
        return
    for root, dirs, files in os.walk(os.fspath(path)):
        for name in dirs + files:
            full = os.path.join(root, name)
            try:
                mode = os.stat(full).st_mode
            except OSError as e:  # a dangling or looping symbolic link
                raise CheckpointCorruptionError(
                    f"checkpoint {path}: {full} cannot be read ({type(e).__name__}: {e}); restore another checkpoint"
                ) from e
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
                raise CheckpointCorruptionError(
                    f"checkpoint {path}: {full} is {kind}, not a regular file; a checkpoint holds only regular "
                    "files and directories (reading it could block forever): restore another checkpoint"
                )


_ARRAY_KINDS = ("xla", "cpu")


def _check_record(record: Record, meta_file: epath.Path) -> None:  # noqa: C901  (why: one check per record field, each naming the damage)
    """Check every field ``load``/``export`` read from the record, so damage is named, never an IndexError.

    Raises:
        CheckpointCorruptionError: naming ``meta_file`` and the field.
    """
    arrays = record.get("arrays")
    if not isinstance(arrays, list):
        raise _damaged(meta_file, "arrays", f"must be a list, got {type(arrays).__name__}")
    for i, info in enumerate(arrays):
        field = f"arrays[{i}]"
        if not isinstance(info, dict):
            raise _damaged(meta_file, field, f"must be an object, got {type(info).__name__}")
        p = info.get("path")
        if not isinstance(p, list) or any(isinstance(k, bool) or not isinstance(k, (str, int)) for k in p):
            raise _damaged(meta_file, f"{field}.path", f"must be a list of str/int keys, got {p!r:.80}")
        if info.get("kind") not in _ARRAY_KINDS:
            raise _damaged(meta_file, f"{field}.kind", f"must be one of {_ARRAY_KINDS}, got {info.get('kind')!r:.80}")
        dtype = info.get("dtype")
        if not isinstance(dtype, str) or not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise _damaged(meta_file, f"{field}.dtype", f"must name a torch dtype, got {dtype!r:.80}")
        try:
            np.dtype(info.get("storage_dtype"))
            if not isinstance(info.get("storage_dtype"), str):
                raise TypeError("not a string")
        except (TypeError, ValueError) as e:
            raise _damaged(
                meta_file, f"{field}.storage_dtype", f"must name a numpy dtype, got {info.get('storage_dtype')!r:.80}"
            ) from e
        shape = info.get("shape")
        if not isinstance(shape, list) or not all(_checks.is_int(n) and n >= 0 for n in shape):
            raise _damaged(meta_file, f"{field}.shape", f"must be a list of non-negative ints, got {shape!r:.80}")
        fp = info.get("fingerprint")
        if not isinstance(fp, list) or len(fp) != 2 or not all(_checks.is_int(v) for v in fp):
            raise _damaged(meta_file, f"{field}.fingerprint", f"must be a list of two ints, got {fp!r:.80}")
    if "tree" not in record:
        raise _damaged(meta_file, "tree", "is missing")
    used: dict[int, KeyPath] = {}
    for key, (kind, payload) in tree.decode(record["tree"], f"checkpoint record {meta_file}").items():
        if kind != "array":
            continue
        field = f"tree{tree.keystr(key)}.array"
        if payload >= len(arrays):
            raise _damaged(meta_file, field, f"is {payload}, but 'arrays' has {len(arrays)} entries")
        if payload in used:
            raise _damaged(meta_file, field, f"is {payload}, which tree{tree.keystr(used[payload])} also uses")
        used[payload] = key
        if tuple(arrays[payload]["path"]) != key:
            raise _damaged(
                meta_file,
                f"arrays[{payload}].path",
                f"is {arrays[payload]['path']!r:.80}, but the tree has it at {list(key)!r:.80}",
            )


def _paths(saved_path_lists: Sequence[Sequence[str | int]]) -> list[KeyPath]:
    return [tuple(p) for p in saved_path_lists]


def _check_keys(target: Mapping[KeyPath, Any], saved: Mapping[KeyPath, Any], strict: bool, path: epath.Path) -> None:
    missing = [p for p in target if p not in saved]
    unexpected = [p for p in saved if p not in target]
    if strict and missing:
        names = [tree.keystr(p) for p in missing]
        raise MissingKeysError(
            f"checkpoint {path} has no entry for {len(names)} key(s) of the state: {names[:10]}"
            f"{' ...' if len(names) > 10 else ''}; the checkpoint holds {[tree.keystr(p) for p in list(saved)[:10]]}"
            "; remove them from the state or pass strict=False to leave them unchanged",
            names,
        )
    if strict and unexpected:
        names = [tree.keystr(p) for p in unexpected]
        raise UnexpectedKeysError(
            f"checkpoint {path} holds {len(names)} key(s) that the state has no entry for: {names[:10]}"
            f"{' ...' if len(names) > 10 else ''}; add them to the state (a fresh optimizer has no state yet: "
            "call spmdtorch.checkpoint.init_optimizer_state(opt) before opt.state_dict()) or pass strict=False "
            "to skip them",
            names,
        )


@dataclasses.dataclass
class _Plan:
    """One array to restore: where it comes from and where it goes."""

    path: KeyPath
    info: dict[str, Any]
    entry: tree.Entry
    layout: placement.Layout | None = None  # set for xla targets (_restore_arg)
    via_host: bool = False  # read as numpy (CPU target, or a dtype the device cannot hold)

    def xla_layout(self) -> placement.Layout:
        """The xla target's layout (set by ``_restore_arg`` for every xla target)."""
        if self.layout is None:
            raise RuntimeError(f"state{tree.keystr(self.path)} has no target layout: it is not an xla target")
        return self.layout


def _check_array(p: _Plan, cast: bool, path: epath.Path) -> None:
    saved_shape = tuple(p.info["shape"])
    target = p.entry.value
    if saved_shape != tuple(target.shape):
        raise ShapeMismatchError(
            f"state{tree.keystr(p.path)}: checkpoint {path} holds shape {saved_shape}, the state's tensor has "
            f"shape {tuple(target.shape)}; build the model with the saved configuration (shapes must match exactly)"
        )
    saved_dtype = p.info["dtype"]
    if saved_dtype != _dtype_name(target.dtype) and not cast:
        raise DtypeMismatchError(
            f"state{tree.keystr(p.path)}: checkpoint {path} holds dtype {saved_dtype}, the state's tensor is "
            f"{_dtype_name(target.dtype)}; pass cast=True to convert, or convert the model first"
        )


def _share_equal_scalars(new: dict[KeyPath, Any], plans: Sequence[_Plan]) -> None:
    """Give restored xla scalars that are equal (same dtype, placement and bits) one array.

    A step shares one buffer among equal results (AdamW's per-parameter step
    counters are one array, so a compiled step computes the bias corrections
    once); restored one per path they would stay apart for the rest of the run.
    Reading a scalar costs one tiny device-to-host copy, at restore time only.
    """
    first: dict[tuple[Any, Any, bytes], Any] = {}
    for p in plans:
        a = new[p.path]
        if p.entry.kind != "xla" or getattr(a, "ndim", None) != 0:
            continue
        key = (a.dtype, a.sharding, np.asarray(a).tobytes())
        new[p.path] = first.setdefault(key, a)


def _restore_arg(p: _Plan) -> ocp.RestoreArgs:
    storage = np.dtype(p.info["storage_dtype"])
    if p.entry.kind == "xla":
        p.layout = layout = placement.layout_of(p.entry.value, p.path)
        # 64-bit data saved from a CPU tensor cannot live on the device (x64
        # is off): it is read on the host, checked, narrowed and placed.
        # read(): jax.config's per-flag attributes are set at run time, untyped.
        p.via_host = storage.itemsize == 8 and not jax.config.read("jax_enable_x64")
        if not p.via_host:
            return ocp.ArrayRestoreArgs(
                sharding=layout.sharding,
                global_shape=layout.storage_shape,
                # Orbax zero-fills up to a padded storage shape only when not strict;
                # the logical shapes were checked to match above.
                strict=not layout.padded,
            )
    p.via_host = True
    return ocp.RestoreArgs(restore_type=np.ndarray)


def _read_arrays(path: epath.Path, plans: Sequence[_Plan], partial: bool) -> dict[KeyPath, Any]:
    items = {p.path: _restore_arg(p) for p in plans}
    restore_args = tree.orbax_tree(items)
    args = ocp.args.PyTreeRestore(item=restore_args, restore_args=restore_args, partial_restore=partial)
    try:
        with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
            restored = ckptr.restore(path / ARRAYS, args=args)
        flat: dict[KeyPath, Any] = {}
        for p in plans:
            node = restored
            for k in p.path:
                node = node[str(k)]
            flat[p.path] = node
        jax.block_until_ready([v for v in flat.values() if isinstance(v, jax.Array)])
    except Exception as e:
        raise CheckpointCorruptionError(
            f"the arrays of checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:500]}); "
            "the files are damaged or incomplete: restore another checkpoint"
        ) from e
    return flat


def _verify(path: epath.Path, plans: Sequence[_Plan], arrays: Mapping[KeyPath, Any]) -> None:
    device = [p for p in plans if not p.via_host]
    fps = fingerprint.device_fingerprints(
        [arrays[p.path] for p in device],
        [p.xla_layout().logical_shape if p.xla_layout().padded else None for p in device],
    )
    got = {p.path: tuple(int(v) for v in np.asarray(fp)) for p, fp in zip(device, fps)}
    for p in plans:
        if p.via_host:
            got[p.path] = fingerprint.fingerprint_numpy(arrays[p.path])
    bad = [p for p in plans if got[p.path] != tuple(p.info["fingerprint"])]
    if bad:
        names = [tree.keystr(p.path) for p in bad]
        details = "; ".join(
            f"state{tree.keystr(p.path)}: saved {tuple(p.info['fingerprint'])}, read {got[p.path]}" for p in bad[:5]
        )
        raise CheckpointCorruptionError(
            f"checkpoint {path}: {len(bad)} array(s) read back different from what was saved "
            f"(fingerprint mismatch): {details}; the data files were altered: restore another checkpoint",
            names,
        )


def _new_value(p: _Plan, array: Any) -> Any:
    """The restored array converted to what replaces the target's data."""
    target = p.entry.value
    if p.entry.kind == "cpu":
        src = placement.to_torch(array)
        return src.to(target.dtype) if src.dtype != target.dtype else src
    want = _dtypes.to_jax_dtype(target.dtype)
    if p.via_host:
        host = np.asarray(array).astype(want)
        return placement.device_put(host, p.xla_layout())
    if array.dtype != want:
        return placement.cast(array, want, p.xla_layout().sharding)
    return array


def load(path: CheckpointPath, state: Any, *, strict: bool = True, cast: bool = False) -> Any:
    """Fill ``state``'s tensors in place from the checkpoint at ``path``; return the state.

    Xla tensors keep their own sharding (the checkpoint may come from another
    mesh, device count or sharding); CPU tensors are copied into; plain
    Python values are replaced (in their dicts and lists; tuples are rebuilt),
    so use the returned state for them.

    Args:
        path: a checkpoint directory written by :func:`save` (or one step of a
            :class:`CheckpointManager` directory).
        state: the same structure as saved, holding the tensors to fill.
        strict: every key must match (otherwise keys on only one side are skipped).
        cast: convert saved dtypes to the targets' (otherwise a mismatch raises).

    Raises:
        NotACheckpointError: not a checkpoint; nothing was changed.
        MissingKeysError: nothing was changed.
        UnexpectedKeysError: nothing was changed.
        ShapeMismatchError: nothing was changed.
        DtypeMismatchError: nothing was changed.
        ValueKindMismatchError: nothing was changed.
        CheckpointCorruptionError: the files are damaged; nothing was changed.
    """
    with faults.activity(f"restoring the checkpoint {path}"):
        path = checkpoint_path(path)
        strict = _checks.check_bool(strict, "load", "strict", CheckpointArgumentTypeError)
        cast = _checks.check_bool(cast, "load", "cast", CheckpointArgumentTypeError)
        record = read_record(path)
        saved = tree.decode(record["tree"])
        executor.sync()
        entries = {e.path: e for e in tree.flatten(state)}
        _check_keys(entries, saved, strict, path)
        plans: list[_Plan] = []
        values: dict[KeyPath, Any] = {}
        for key, e in entries.items():
            if key not in saved:
                continue
            kind, payload = saved[key]
            if (kind == "array") != (e.kind != "value"):
                found = "a tensor" if kind == "array" else f"the value {payload!r}"
                want = "a tensor" if e.kind != "value" else f"the value {e.value!r}"
                raise ValueKindMismatchError(
                    f"state{tree.keystr(key)}: checkpoint {path} holds {found} where the state holds {want}; "
                    "the state's structure must match the saved one"
                )
            if kind == "value":
                values[key] = payload
                continue
            plan = _Plan(key, record["arrays"][payload], e)
            _check_array(plan, cast, path)
            plans.append(plan)
        if plans:
            stored = [p for p in plans if is_stored(p.info)]
            n_stored = sum(is_stored(info) for info in record["arrays"])
            arrays = _read_arrays(path, stored, partial=len(stored) < n_stored) if stored else {}
            for p in plans:
                if not is_stored(p.info):  # zero-size: nothing on disk to read (see is_stored)
                    if p.entry.kind == "xla":
                        p.layout = placement.layout_of(p.entry.value, p.path)
                    p.via_host = True
                    arrays[p.path] = empty_array(p.info)
            _verify(path, plans, arrays)
            new = {p.path: _new_value(p, arrays[p.path]) for p in plans}
            _share_equal_scalars(new, plans)
            # Only now, with every array read and checked, does the state change.
            for p in plans:
                target = p.entry.value
                if p.entry.kind == "xla":
                    placement.install(target, new[p.path])
                else:
                    with torch.no_grad():
                        target.copy_(new[p.path])
        return tree.replace_values(state, values)
