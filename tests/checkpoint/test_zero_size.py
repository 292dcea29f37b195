"""Zero-size tensors in a checkpointed state (issue 42, item 15).

Orbax refuses to save an array with a 0 in its shape ("Cannot save arrays
with zero size"), so a state holding one (an empty buffer, a pruned head, an
optimizer entry of an empty parameter) could not be checkpointed at all. Such
a tensor holds no data: it is kept in the record only (dtype, shape,
fingerprint) and restored without a read, into the target's sharding.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.checkpoint import CheckpointCorruptionError, CheckpointManager, ShapeMismatchError
from spmdtorch.checkpoint.io import ARRAYS, META, META_FILE
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

# (shape, dtype, partition spec or None for replicated / a CPU tensor)
_CASES: list[tuple[tuple[int, ...], torch.dtype, tuple[Any, ...] | None]] = [
    ((0,), torch.float32, None),
    ((0, 8), torch.float32, (None, "x")),  # the non-empty dim sharded
    ((3, 0), torch.bfloat16, ("x", None)),  # an uneven (padded) dim sharded
    ((0, 16), torch.int64, ("x", None)),  # the empty dim itself sharded
    ((2, 0, 4), torch.bool, (None, None, "x")),
    ((0,), torch.float16, None),
    ((4, 0), torch.int8, None),
]


def _mesh() -> Mesh:
    return Mesh(np.arange(8), (8,), ("x",))


def _make(shape: tuple[int, ...], dtype: torch.dtype, spec: tuple[Any, ...] | None, fill: int) -> torch.Tensor:
    t = torch.full(shape, fill, dtype=dtype, device="xla")
    if spec is not None:
        mark_sharding(t, _mesh(), spec)
    return t


def _state(fill: int) -> dict[str, Any]:
    xla = {f"x{i}": _make(shape, dtype, spec, fill) for i, (shape, dtype, spec) in enumerate(_CASES)}
    cpu = {f"c{i}": torch.full(shape, fill, dtype=dtype) for i, (shape, dtype, _) in enumerate(_CASES)}
    # A tensor with data beside them: its values must still round-trip.
    w = mark_sharding(torch.arange(16.0).reshape(8, 2).to("xla") + fill, _mesh(), ("x", None))
    return {"xla": xla, "cpu": cpu, "w": w, "step": fill}


def _check_restored(target: dict[str, Any], shardings: dict[str, Any]) -> None:
    for i, (shape, dtype, _) in enumerate(_CASES):
        for kind in ("xla", "cpu"):
            t = target[kind][f"{'x' if kind == 'xla' else 'c'}{i}"]
            assert tuple(t.shape) == shape and t.dtype == dtype
            assert t.cpu().numel() == 0
        # The xla target keeps its own sharding (the restored array is placed in it).
        x = target["xla"][f"x{i}"]
        assert x._st.value.sharding == shardings[f"x{i}"]
    assert torch.equal(target["w"].cpu(), torch.arange(16.0).reshape(8, 2) + 1)


def _shardings(state: dict[str, Any]) -> dict[str, Any]:
    spmdtorch.sync()
    return {k: v._st.value.sharding for k, v in state["xla"].items()}


def test_save_and_load_round_trip_zero_size_tensors(tmp_path, devices8):
    checkpoint.save(tmp_path / "c", _state(1))
    record = json.loads((tmp_path / "c" / META / META_FILE).read_text())
    empty = [info for info in record["arrays"] if 0 in info["shape"]]
    assert len(empty) == 2 * len(_CASES)
    assert {info["dtype"] for info in empty} == {str(d).removeprefix("torch.") for _, d, _ in _CASES}
    target = _state(0)
    shardings = _shardings(target)
    out = checkpoint.load(tmp_path / "c", target)
    assert out["step"] == 1
    _check_restored(target, shardings)


def test_a_state_of_only_zero_size_tensors_saves_no_orbax_arrays(tmp_path, devices8):
    checkpoint.save(tmp_path / "c", {"a": torch.zeros(0, 4, device="xla"), "b": torch.zeros(0)})
    assert not (tmp_path / "c" / ARRAYS).exists()  # Orbax is given nothing it would refuse
    target = {"a": torch.ones(0, 4, device="xla"), "b": torch.ones(0)}
    checkpoint.load(tmp_path / "c", target)
    assert target["a"].shape == (0, 4) and target["b"].shape == (0,)


def test_manager_async_round_trip_and_export(tmp_path, devices8):
    with CheckpointManager(tmp_path / "m", save_on_preemption=False) as mgr:
        assert mgr.save(0, _state(1))
        mgr.wait_until_finished()
        assert mgr.all_steps() == [0]
        target = _state(0)
        shardings = _shardings(target)
        assert mgr.restore(target)["step"] == 1
    _check_restored(target, shardings)
    # export streams arrays from Orbax: the zero-size ones come from the record.
    out = tmp_path / "x.safetensors"
    checkpoint.export(tmp_path / "m" / "0", out, prefix="cpu")
    loaded = load_file(out)
    for i, (shape, dtype, _) in enumerate(_CASES):
        assert tuple(loaded[f"c{i}"].shape) == shape and loaded[f"c{i}"].dtype == dtype


def test_zero_size_entries_are_still_checked(tmp_path, devices8):
    checkpoint.save(tmp_path / "c", {"e": torch.zeros(0, 4, device="xla"), "w": torch.ones(2, device="xla")})
    with pytest.raises(ShapeMismatchError, match=r"\['e'\].*\(0, 4\).*\(0, 5\)"):
        checkpoint.load(tmp_path / "c", {"e": torch.zeros(0, 5, device="xla"), "w": torch.zeros(2, device="xla")})
    # A record claiming data for an entry that has none on disk: named as damage, not an Orbax error.
    meta = tmp_path / "c" / META / META_FILE
    record = json.loads(meta.read_text())
    record["arrays"][0]["shape"] = [1, 4]
    meta.write_text(json.dumps(record))
    w = torch.zeros(2, device="xla")
    with pytest.raises(CheckpointCorruptionError, match="cannot be read"):
        checkpoint.load(tmp_path / "c", {"e": torch.zeros(1, 4, device="xla"), "w": w})
    assert torch.equal(w.cpu(), torch.zeros(2))  # nothing installed
    # A tampered fingerprint of a zero-size entry is caught like any other.
    record["arrays"][0]["shape"] = [0, 4]
    record["arrays"][0]["fingerprint"] = [1, 2]
    meta.write_text(json.dumps(record))
    with pytest.raises(CheckpointCorruptionError, match=r"\['e'\]"):
        checkpoint.load(tmp_path / "c", {"e": torch.zeros(0, 4, device="xla"), "w": w})
