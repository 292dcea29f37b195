"""Structure-aware fuzz of checkpoint records and safetensors headers (issue 42, beyond the list).

Each example takes a real file (one ``checkpoint.save`` record, one
safetensors header) and changes it where it is structured: a field replaced
by another JSON value (null, a bool, a huge or negative int, a string like
``"../x"``, a list, an object), a field deleted, a list entry repeated. Then:

* ``checkpoint.load`` (and ``export``) either restore exactly what was saved
  or raise a named :class:`~spmdtorch.checkpoint.CheckpointError`, and a
  failed load leaves every target tensor as it was;
* ``import_state_dict`` / ``load_pretrained`` of the changed safetensors file
  either load or raise a ``CheckpointError``, and a failed call leaves the
  model as it was.

Nothing else may escape (``IndexError``, ``KeyError``, ``TypeError``,
``RecursionError``, a safetensors ``SafetensorError``). Default tier: 25 fixed
examples each; ``-m slow``: 200 random ones.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from spmdtorch import checkpoint
from spmdtorch.checkpoint import CheckpointError, import_state_dict, load_pretrained

FAST = settings(
    max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))

SAVED: dict[str, Any] = {
    "model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.tensor([1, -2, 3])},
    "opt": [{"step": 4, "lr": 0.5}, None],
    "name": "run",
}

JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "../x", "/etc/passwd", "float32", "nan", "array", "dict", "F32", "I64"])
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _locations(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _locations(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _locations(v, (*path, i))
    return out


@st.composite
def mutated(draw: st.DrawFn, original: Any) -> Any:
    """``original`` (JSON) changed at one place: replaced, deleted or repeated."""
    doc = copy.deepcopy(original)
    where = draw(st.sampled_from(_locations(doc)))
    how = draw(st.sampled_from(["replace", "delete", "repeat"] if where else ["replace"]))
    if not where:
        return draw(JSON)
    parent = doc
    for k in where[:-1]:
        parent = parent[k]
    last = where[-1]
    if how == "replace":
        parent[last] = draw(JSON)
    elif how == "delete":
        del parent[last]
    elif isinstance(parent, list):
        parent.insert(last, copy.deepcopy(parent[last]))
    else:
        parent[last] = [parent[last], copy.deepcopy(parent[last])]
    return doc


def _target() -> dict[str, Any]:
    return {
        "model": {"w": torch.zeros(3, 4, device="xla"), "b": torch.zeros(3, dtype=torch.int64)},
        "opt": [{"step": 0, "lr": 0.0}, None],
        "name": "",
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    ckpt = tmp_path_factory.mktemp("fuzz_record") / "ckpt"
    state = copy.deepcopy(SAVED)
    state["model"]["w"] = state["model"]["w"].to("xla")
    checkpoint.save(ckpt, state)
    return ckpt, json.loads((ckpt / "meta" / "metadata").read_text())


def _check_record(saved: tuple[Path, Any], record: Any) -> None:
    ckpt, original = saved
    meta = ckpt / "meta" / "metadata"
    meta.write_text(json.dumps(record))
    try:
        target = _target()
        try:
            got = checkpoint.load(ckpt, target)
        except CheckpointError:
            assert torch.equal(target["model"]["w"].cpu(), torch.zeros(3, 4))  # nothing changed
            assert torch.equal(target["model"]["b"], torch.zeros(3, dtype=torch.int64))
        else:
            # A change load accepts (a plain value edited, say) loads the arrays exactly.
            assert torch.equal(got["model"]["w"].cpu(), SAVED["model"]["w"])
            assert torch.equal(got["model"]["b"], SAVED["model"]["b"])
        try:
            checkpoint.export(ckpt, ckpt.parent / "out.pt", "torch")
        except CheckpointError:
            pass
    finally:
        meta.write_text(json.dumps(original))


@FAST
@given(data=st.data())
def test_fuzzed_record_loads_or_raises_a_named_error(saved, data):
    _check_record(saved, data.draw(mutated(saved[1])))


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzzed_record_loads_or_raises_a_named_error_slow(saved, data):
    _check_record(saved, data.draw(mutated(saved[1])))


# -- safetensors headers -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, bytes]:
    path = tmp_path_factory.mktemp("fuzz_header") / "model.safetensors"
    save_file({"weight": torch.arange(8.0).reshape(2, 4), "bias": torch.tensor([5.0, 6.0])}, path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return path, json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _check_header(shard: tuple[Path, Any, bytes], header: Any) -> None:
    path, _, data = shard
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    for load in (
        lambda model: import_state_dict(path, model, strict=False, cast=True),
        lambda model: load_pretrained(path.parent, model, strict=False),
    ):
        model = torch.nn.Linear(4, 2).to("xla")
        before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
        try:
            load(model)
        except CheckpointError:
            for k, v in model.state_dict().items():
                assert torch.equal(v.cpu(), before[k]), k


@FAST
@given(data=st.data())
def test_fuzzed_safetensors_header_loads_or_raises_a_named_error(shard, data):
    _check_header(shard, data.draw(mutated(shard[1])))


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_fuzzed_safetensors_header_loads_or_raises_a_named_error_slow(shard, data):
    _check_header(shard, data.draw(mutated(shard[1])))
