"""Hostile and unlucky files and arguments (issue 42): named errors, nothing deleted, half-written or hung.

Each case builds the bad input by hand (a hand-edited record, a FIFO in place
of a file, an index naming a file outside its directory, a lying safetensors
header) and checks the named error, that it names the file and the field, and
that nothing outside the checkpoint was read, written or deleted.
"""

from __future__ import annotations

import copy
import json
import os
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from spmdtorch import checkpoint
from spmdtorch.checkpoint import (
    CheckpointArgumentError,
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    CheckpointManager,
    CheckpointWriterError,
    DtypeMismatchError,
    NotACheckpointError,
    OverwriteRefusedError,
    ShapeMismatchError,
    StepNotFoundError,
    import_state_dict,
    load_pretrained,
)
from spmdtorch.checkpoint.io import META, META_FILE
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


def _state() -> dict[str, Any]:
    w = torch.arange(48.0).reshape(8, 6).to("xla")
    mark_sharding(w, Mesh(np.arange(8), (8,), ("x",)), ("x", None))
    return {"model": {"w": w, "b": torch.arange(3.0)}, "step": 5, "name": "run"}


def _target() -> dict[str, Any]:
    return {"model": {"w": torch.zeros(8, 6, device="xla"), "b": torch.zeros(3)}, "step": 0, "name": ""}


def _call_with_deadline(fn: Any, seconds: float = 60.0) -> BaseException | None:
    """Run ``fn`` on a daemon thread; the exception it raised (None if none); fails if it is still running."""
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out.append(e)
        else:
            out.append(None)

    t = threading.Thread(target=run, daemon=True)  # a blocked reader must not keep the test process alive
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds} s"
    return out[0]


# -- item 1: readers never delete; one writer per directory ----------------------------------

_OTHER_WRITER = """
import fcntl, sys, time
f = open(sys.argv[1], "a+b")
fcntl.flock(f.fileno(), fcntl.LOCK_EX)
f.truncate(0); f.write(b"pid 4242 on elsewhere\\n"); f.flush()
print("locked", flush=True)
time.sleep(120)
"""


def test_opening_a_manager_never_deletes_another_writers_save_in_flight(tmp_path):
    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as mgr:
        mgr.save(0, _state(), force=True)
    in_flight = tmp_path / "1.orbax-checkpoint-tmp-1234"  # what a writing process has on disk mid-save
    (in_flight / "arrays").mkdir(parents=True)
    for _ in range(3):  # an evaluation job polling beside the trainer
        with CheckpointManager(tmp_path, save_on_preemption=False) as reader:
            assert reader.latest_step() == 0
            assert reader.restore(_target())["step"] == 5
    assert (in_flight / "arrays").is_dir()
    with CheckpointManager(tmp_path, save_on_preemption=False) as reader:
        with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as writer:
            writer.save(2, _state(), force=True)
        assert reader.latest_step() == 2  # a reader kept open sees the writer's new steps


def test_a_second_writer_process_gets_a_named_error(tmp_path):
    import subprocess
    import sys

    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as mgr:
        mgr.save(0, _state(), force=True)
    in_flight = tmp_path / "1.orbax-checkpoint-tmp-1234"
    in_flight.mkdir()
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_WRITER, str(tmp_path / ".spmdtorch-writer.lock")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "locked"
        with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as second:
            with pytest.raises(CheckpointWriterError, match=r"another process is writing.*pid 4242 on elsewhere"):
                second.save(2, _state(), force=True)
            assert second.all_steps() == [0]
        assert in_flight.is_dir()  # the other writer's save was left alone
    finally:
        other.kill()
        other.wait(timeout=60)
    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as writer:
        writer.save(2, _state(), force=True)  # the lock died with its process: leftovers go now
        assert writer.all_steps() == [0, 2]
    assert not in_flight.exists()


def test_a_later_manager_in_the_same_process_takes_over_writing(tmp_path):
    first = CheckpointManager(tmp_path, save_on_preemption=False)
    first.save(0, _state(), force=True)  # async: may still be writing
    second = CheckpointManager(tmp_path, save_on_preemption=False)  # the first is not closed
    second.save(1, _state(), force=True)
    second.wait_until_finished()
    assert second.all_steps() == [0, 1]
    first.close()  # no longer the writer: releases nothing the second holds
    second.save(2, _state(), force=True)
    second.close()
    assert CheckpointManager(tmp_path, save_on_preemption=False).all_steps() == [0, 1, 2]


# -- item 2: save(overwrite=True) deletes only a checkpoint -------------------------------


def test_overwrite_refuses_a_directory_that_holds_no_checkpoint(tmp_path):
    precious = tmp_path / "data"
    precious.mkdir()
    (precious / "notes.txt").write_text("keep me")
    with pytest.raises(OverwriteRefusedError, match=r"holds no spmdtorch checkpoint.*notes\.txt.*Pick a new path"):
        checkpoint.save(precious, _state(), overwrite=True)
    assert (precious / "notes.txt").read_text() == "keep me"

    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(OverwriteRefusedError, match="is a file"):
        checkpoint.save(a_file, _state(), overwrite=True)
    assert a_file.read_text() == "x"


def test_overwrite_refuses_a_manager_directory_and_a_checkpoint_with_other_files(tmp_path):
    with CheckpointManager(tmp_path / "run", async_save=False, save_on_preemption=False) as mgr:
        mgr.save(0, _state(), force=True)
    with pytest.raises(OverwriteRefusedError, match=r"CheckpointManager directory \(steps \[0\]\)"):
        checkpoint.save(tmp_path / "run", _state(), overwrite=True)
    assert CheckpointManager(tmp_path / "run", save_on_preemption=False).all_steps() == [0]

    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, _state())
    (ckpt / "README").write_text("mine")
    with pytest.raises(OverwriteRefusedError, match=r"a checkpoint and other files.*README"):
        checkpoint.save(ckpt, _state(), overwrite=True)
    assert (ckpt / "README").exists()


def test_overwrite_replaces_a_checkpoint_and_fills_an_empty_directory(tmp_path):
    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, _state())
    new = _state()
    new["step"] = 9
    new["model"]["w"].add_(1)
    checkpoint.save(ckpt, new, overwrite=True)
    got = checkpoint.load(ckpt, _target())
    assert got["step"] == 9
    assert torch.equal(got["model"]["w"].cpu(), torch.arange(48.0).reshape(8, 6) + 1)

    empty = tmp_path / "empty"
    empty.mkdir()
    checkpoint.save(empty, _state(), overwrite=True)
    assert checkpoint.load(empty, _target())["step"] == 5


# -- item 3: CheckpointManager steps are non-negative ints -----------------------------------


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ("../x", CheckpointArgumentTypeError),
        (2.5, CheckpointArgumentTypeError),
        (True, CheckpointArgumentTypeError),
        (None, CheckpointArgumentTypeError),
        (-1, CheckpointArgumentError),
    ],
)
def test_manager_refuses_steps_that_are_not_non_negative_ints(tmp_path, step, error):
    root = tmp_path / "run"
    with CheckpointManager(root, async_save=False, save_on_preemption=False) as mgr:
        calls = [
            lambda: mgr.save(step, _state(), force=True),
            lambda: mgr.save_async(step, _state(), force=True),
            lambda: mgr.should_save(step),
            lambda: mgr.step_path(step),
        ]
        if step is not None:  # restore's None means the newest step
            calls.append(lambda: mgr.restore(_target(), step))
        for call in calls:
            with pytest.raises(error, match=r"step must be an int >= 0, got .*steps are directory names"):
                call()
        assert mgr.all_steps() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing written beside the directory
    assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == []


def test_manager_numpy_int_step_is_found_by_a_restarted_manager(tmp_path):
    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as mgr:
        assert mgr.save(np.int64(3), _state(), force=True)
    with CheckpointManager(tmp_path, save_on_preemption=False) as again:
        assert again.all_steps() == [3]
        assert again.restore(_target(), np.int64(3))["step"] == 5
        with pytest.raises(StepNotFoundError):
            again.restore(_target(), 4)


# -- item 4: import_state_dict checks every key before installing any -----------------------


def test_import_state_dict_leaves_the_model_unchanged_when_a_later_key_fails(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("xla")
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    good_weight = torch.full((2, 4), 7.0)

    with pytest.raises(ShapeMismatchError, match=r"\['bias'\] has shape \(3,\)"):
        import_state_dict({"weight": good_weight, "bias": torch.zeros(3)}, model)
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k

    path = tmp_path / "w.safetensors"
    save_file({"weight": good_weight, "bias": torch.zeros(2, dtype=torch.float16)}, path)
    with pytest.raises(DtypeMismatchError, match=r"\['bias'\] has dtype torch.float16"):
        import_state_dict(path, model)
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k

    import_state_dict(path, model, cast=True)  # the same file, converting: every key lands
    assert torch.equal(model.weight.cpu(), good_weight)
    assert torch.equal(model.bias.cpu(), torch.zeros(2))


# -- item 7: index shard names stay inside the model directory --------------------------------


def _hf_dir(root: Path, weight_map: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


@pytest.mark.parametrize("how", ["parent", "absolute", "nested_parent"])
def test_load_pretrained_refuses_shard_names_outside_the_directory(tmp_path, how):
    outside = tmp_path / "outside"
    outside.mkdir()
    save_file({"weight": torch.ones(2, 4), "bias": torch.ones(2)}, outside / "x.safetensors")
    name = {
        "parent": "../outside/x.safetensors",
        "absolute": str(outside / "x.safetensors"),
        "nested_parent": "sub/../../outside/x.safetensors",
    }[how]
    model_dir = _hf_dir(tmp_path / "model", {"weight": name, "bias": name})
    model = torch.nn.Linear(4, 2)
    before = model.weight.detach().clone()
    with pytest.raises(
        CheckpointCorruptionError, match=r"index\.json: field weight_map\['weight'\] is .*inside the model"
    ):
        load_pretrained(model_dir, model)
    assert torch.equal(model.weight.detach(), before)


def test_load_pretrained_follows_symlinked_shards_as_in_the_hub_cache(tmp_path):
    # snapshots/<rev>/<file> -> ../../blobs/<hash>, the Hugging Face cache layout.
    blobs = tmp_path / "cache" / "blobs"
    blobs.mkdir(parents=True)
    torch.manual_seed(1)
    src = torch.nn.Linear(4, 16)
    save_file({"weight": src.weight.detach().contiguous()}, blobs / "aaa")
    save_file({"bias": src.bias.detach().contiguous()}, blobs / "bbb")
    snap = tmp_path / "cache" / "snapshots" / "rev"
    snap.mkdir(parents=True)
    os.symlink("../../blobs/aaa", snap / "model-00001-of-00002.safetensors")
    os.symlink("../../blobs/bbb", snap / "model-00002-of-00002.safetensors")
    _hf_dir(snap, {"weight": "model-00001-of-00002.safetensors", "bias": "model-00002-of-00002.safetensors"})
    with torch.device("meta"):
        model = torch.nn.Linear(4, 16)
    load_pretrained(snap, model, Mesh(np.arange(8), (8,), ("fsdp",)), "fsdp")
    assert torch.equal(model.weight.cpu(), src.weight.detach())
    assert torch.equal(model.bias.cpu(), src.bias.detach())


@pytest.mark.parametrize("bad", [5, "", None, ["a"]])
def test_load_pretrained_refuses_shard_names_that_are_not_file_names(tmp_path, bad):
    model_dir = _hf_dir(tmp_path / "model", {"weight": bad})
    with pytest.raises(CheckpointCorruptionError, match=r"field weight_map\['weight'\] must be a shard file name"):
        load_pretrained(model_dir, torch.nn.Linear(4, 2))


# -- item 10: a FIFO where a file belongs is refused, never opened ------------------------------


@needs_fifo
def test_load_refuses_a_fifo_record_without_blocking(tmp_path):
    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, _state())
    meta = ckpt / META / META_FILE
    meta.unlink()
    os.mkfifo(meta)
    err = _call_with_deadline(lambda: checkpoint.load(ckpt, _target()))
    assert isinstance(err, CheckpointCorruptionError), err
    assert f"{meta} is a FIFO, not a regular file" in str(err)


@needs_fifo
def test_hf_and_import_refuse_fifos_without_blocking(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    os.mkfifo(model_dir / "model.safetensors")
    err = _call_with_deadline(lambda: load_pretrained(model_dir, torch.nn.Linear(4, 2)))
    assert isinstance(err, CheckpointCorruptionError) and "model.safetensors is not a regular file" in str(err), err

    sharded = _hf_dir(tmp_path / "sharded", {"weight": "a.safetensors", "bias": "a.safetensors"})
    os.mkfifo(sharded / "a.safetensors")
    err = _call_with_deadline(lambda: load_pretrained(sharded, torch.nn.Linear(4, 2)))
    assert isinstance(err, CheckpointCorruptionError) and "a.safetensors is not a regular file" in str(err), err

    fifo = tmp_path / "state.safetensors"
    os.mkfifo(fifo)
    err = _call_with_deadline(lambda: import_state_dict(fifo, torch.nn.Linear(4, 2)))
    assert isinstance(err, NotACheckpointError) and "is not a regular file" in str(err), err


# -- item 11: damaged records and headers are CheckpointCorruptionErrors naming file and field ---


def _edit_record(ckpt: Path, edit: Any) -> Path:
    meta = ckpt / META / META_FILE
    record = json.loads(meta.read_text())
    edited = edit(copy.deepcopy(record))
    meta.write_text(edited if isinstance(edited, str) else json.dumps(edited))
    return meta


def _deep(depth: int) -> str:
    return '{"format": "spmdtorch.checkpoint", "version": 1, "arrays": [], "tree": ' + "[" * depth + "]" * depth + "}"


def _set(record: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    node: Any = record
    for k in path[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return record


_DELETE = object()
# The saved tree is {"dict": [["model", {"dict": [["w", {"array": 0}], ["b", {"array": 1}]]}], ["step", ...], ...]}.
_W = ("tree", "dict", 0, 1, "dict", 0, 1)
_B = ("tree", "dict", 0, 1, "dict", 1, 1)
RECORD_DAMAGE = {
    "array index past the end": (lambda r: _set(r, (*_W, "array"), 7), r"field tree\['model'\]\['w'\]\.array is 7"),
    "array index a string": (lambda r: _set(r, (*_W, "array"), "0"), r"field tree\['model'\]\['w'\] 'array' must"),
    "array used twice": (lambda r: _set(r, (*_B, "array"), 0), r"is 0, which tree\['model'\]\['w'\] also uses"),
    "unknown node": (lambda r: _set(r, _W, {"bogus": 1}), r"field tree\['model'\]\['w'\] must be an object with"),
    "node not an object": (lambda r: _set(r, _W, [1, 2]), r"field tree\['model'\]\['w'\] must be an object"),
    "dict key a list": (lambda r: _set(r, ("tree", "dict", 0, 0), ["m"]), r"field tree has the key \['m'\]"),
    "duplicate key": (
        lambda r: _set(r, ("tree", "dict"), r["tree"]["dict"] + [r["tree"]["dict"][1]]),
        r"field tree holds the key 'step' twice",
    ),
    "bad float": (lambda r: _set(r, ("tree", "dict", 1, 1), {"float": "pi"}), r"tree\['step'\] 'float' must be"),
    "value a list": (lambda r: _set(r, ("tree", "dict", 1, 1), {"v": [1]}), r"tree\['step'\] 'v' must be null"),
    "tree missing": (lambda r: _set(r, ("tree",), _DELETE), r"field tree is missing"),
    "arrays not a list": (lambda r: _set(r, ("arrays",), {}), r"field arrays must be a list"),
    "shape missing": (lambda r: _set(r, ("arrays", 0, "shape"), _DELETE), r"field arrays\[0\]\.shape must"),
    "shape negative": (lambda r: _set(r, ("arrays", 0, "shape"), [-8, 6]), r"field arrays\[0\]\.shape must"),
    "storage dtype unknown": (
        lambda r: _set(r, ("arrays", 0, "storage_dtype"), "nope"),
        r"field arrays\[0\]\.storage_dtype must name a numpy dtype",
    ),
    "dtype unknown": (lambda r: _set(r, ("arrays", 1, "dtype"), "float99"), r"field arrays\[1\]\.dtype must name"),
    "kind unknown": (lambda r: _set(r, ("arrays", 1, "kind"), "gpu"), r"field arrays\[1\]\.kind must be one of"),
    "fingerprint short": (lambda r: _set(r, ("arrays", 0, "fingerprint"), [1]), r"arrays\[0\]\.fingerprint must be"),
    "path disagrees": (lambda r: _set(r, ("arrays", 0, "path"), ["model", "b"]), r"field arrays\[0\]\.path is"),
    "version a string": (lambda r: _set(r, ("version",), "1"), r"field version must be a non-negative int"),
    "nested 100,000 deep": (lambda r: _deep(100_000), r"cannot be read: RecursionError"),
    "nested 300 deep": (lambda r: _deep(300), r"field tree must be an object with one of the keys"),
}


@pytest.mark.parametrize("damage", sorted(RECORD_DAMAGE))
def test_damaged_record_is_a_corruption_error_naming_file_and_field(tmp_path, damage):
    edit, expected = RECORD_DAMAGE[damage]
    ckpt = tmp_path / "ckpt"
    checkpoint.save(ckpt, _state())
    meta = _edit_record(ckpt, edit)
    target = _target()
    for call in (lambda: checkpoint.load(ckpt, target), lambda: checkpoint.export(ckpt, tmp_path / "out.pt", "torch")):
        with pytest.raises(CheckpointCorruptionError) as info:
            call()
        assert str(meta) in str(info.value)
        assert info.match(expected)
    assert torch.equal(target["model"]["w"].cpu(), torch.zeros(8, 6))  # nothing changed


def test_restore_falls_back_past_a_hand_edited_newest_step(tmp_path):
    with CheckpointManager(tmp_path, async_save=False, save_on_preemption=False) as mgr:
        mgr.save(0, _state(), force=True)
        mgr.save(1, _state(), force=True)
        _edit_record(mgr.step_path(1), lambda r: _set(r, (*_W, "array"), 9))
        with pytest.warns(RuntimeWarning, match=r"step 1 is damaged.*field tree\['model'\]\['w'\]\.array"):
            mgr.restore(_target())
        assert mgr.restored_step == 0


def _lying_safetensors(path: Path, name: str = "weight", shape: tuple[int, ...] = (2, 4)) -> Path:
    """A safetensors file whose header promises more bytes than the file holds."""
    nbytes = int(np.prod(shape)) * 4
    header = json.dumps({name: {"dtype": "F32", "shape": list(shape), "data_offsets": [0, nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (nbytes // 2))
    return path


def test_lying_safetensors_headers_name_the_file(tmp_path):
    model_dir = _hf_dir(tmp_path / "model", {"weight": "a.safetensors", "bias": "b.safetensors"})
    save_file({"bias": torch.zeros(2)}, model_dir / "b.safetensors")
    shard = _lying_safetensors(model_dir / "a.safetensors")
    with pytest.raises(CheckpointCorruptionError, match=rf"{shard} \(its header\) cannot be read as safetensors"):
        load_pretrained(model_dir, torch.nn.Linear(4, 2))

    lone = _lying_safetensors(tmp_path / "lone.safetensors")
    model = torch.nn.Linear(4, 2)
    with pytest.raises(CheckpointCorruptionError, match=rf"import_state_dict: {lone} \(its header\) cannot be read"):
        import_state_dict(lone, model, strict=False)


class Payload:
    """An object a weights_only load refuses (a pickle could run code here)."""


def test_torch_file_holding_more_than_tensors_is_refused_by_name(tmp_path):
    path = tmp_path / "state.pt"
    torch.save([torch.ones(2)], path)  # a list, not a state_dict
    with pytest.raises(CheckpointCorruptionError, match=r"holds a list, not a state_dict"):
        import_state_dict(path, torch.nn.Linear(4, 2))

    torch.save({"weight": Payload()}, path)
    with pytest.raises(CheckpointCorruptionError, match=r"cannot be read as a torch state_dict file.*weights_only"):
        import_state_dict(path, torch.nn.Linear(4, 2))


def test_bad_index_json_names_the_field(tmp_path):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    index = model_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": ["a.safetensors"]}))
    with pytest.raises(CheckpointCorruptionError, match=r"field weight_map must be an object"):
        load_pretrained(model_dir, torch.nn.Linear(4, 2))
    index.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointCorruptionError, match=r"RecursionError"):
        load_pretrained(model_dir, torch.nn.Linear(4, 2))


# -- found on the way: an async save's record waited for a dispatch registered late ------------


def test_record_write_dispatches_fingerprints_registered_after_its_first_look():
    """Under load Orbax's save call returns (and the dispatch is registered) after the record's
    writer first looked for it; the writer must keep looking, not wait for the timeout."""
    import jax.numpy as jnp

    from spmdtorch.checkpoint.io import SELF_DISPATCH_AFTER_S, SaveFingerprints
    from spmdtorch.lazy import executor

    pending = SaveFingerprints([jnp.arange(6.0)], [None], [0])
    got: list[Any] = []
    writer = threading.Thread(target=lambda: got.append(pending.results(timeout=120.0)), daemon=True)
    writer.start()
    writer.join(3 * SELF_DISPATCH_AFTER_S)  # the writer's first look found nothing owed
    assert writer.is_alive()
    executor.before_next_execution(pending.dispatch)  # what io.saving(defer=True) does when Orbax returns
    writer.join(30)
    assert not writer.is_alive(), "the record's write waited for the timeout"
    assert got[0][0][0] == 0 and len(got[0][0][1]) == 2
