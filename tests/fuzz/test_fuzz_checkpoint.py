"""Fuzzed ``checkpoint.load`` targets: exact restore, or a named error that changes nothing.

One checkpoint is saved per module. Each example builds a load target from the
saved structure, perhaps sharded over a random mesh with a random (valid)
spec, and perhaps broken in one way: a tensor's shape or dtype, a key missing
or extra, a tensor where a plain value was saved (or the reverse), an
unsupported leaf. Then:

* a target that fits (keys, shapes, dtypes; dtypes may differ with
  ``cast=True``; keys on one side only with ``strict=False``): every tensor
  holds the saved values, in its own sharding;
* otherwise: a :class:`~spmdtorch.checkpoint.CheckpointError` subclass (a
  named error), every target tensor keeps its values, and the checkpoint's
  files are unchanged.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest
import torch
from fuzz_strategies import meshes, specs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spmdtorch import checkpoint
from spmdtorch.checkpoint import CheckpointError
from spmdtorch.sharding import mark_sharding

FAST = settings(
    max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck))

#: What is saved: key -> CPU value.
SAVED: dict[str, Any] = {
    "w": torch.arange(24, dtype=torch.float32).reshape(4, 6),
    "b": torch.tensor([3, -1, 7], dtype=torch.int64),
    "h": torch.arange(5, dtype=torch.bfloat16) / 2,
    "step": 7,
    "name": "run",
}
TENSOR_KEYS = ("w", "b", "h")


def _digest(root: str) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            h.update(path.encode())
            with open(path, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def saved_checkpoint(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fuzz_ckpt") / "ckpt")
    state = {k: (v.to("xla") if isinstance(v, torch.Tensor) else v) for k, v in SAVED.items()}
    checkpoint.save(path, {"model": {k: state[k] for k in TENSOR_KEYS}, "step": state["step"], "name": state["name"]})
    return path, _digest(path)


@st.composite
def targets(draw: st.DrawFn) -> tuple[dict[str, Any], bool, bool, bool]:
    """``(target state, strict, cast, expected to load)``."""
    model: dict[str, Any] = {}
    for k in TENSOR_KEYS:
        cpu = torch.full_like(SAVED[k], 0) if SAVED[k].dtype != torch.bfloat16 else torch.zeros(5, dtype=torch.bfloat16)
        model[k] = cpu.to("xla") if draw(st.booleans()) else cpu
    state: dict[str, Any] = {"model": model, "step": 0, "name": ""}
    strict, cast = draw(st.booleans()) or draw(st.booleans()), draw(st.booleans())
    fits = True
    mutation = draw(
        st.sampled_from(["none", "none", "shape", "dtype", "drop", "extra", "to_int", "to_tensor", "unsupported"])
    )
    key = draw(st.sampled_from(TENSOR_KEYS))
    if mutation == "shape":
        shape = draw(st.sampled_from([(), (0,), (4, 7), (6, 4), (24,), (3, 1), (5, 1)]))
        model[key] = torch.zeros(shape, dtype=SAVED[key].dtype)
        fits = False
    elif mutation == "dtype":
        dtype = draw(st.sampled_from([torch.float16, torch.int32, torch.float64, torch.bool]))
        model[key] = model[key].to(dtype)
        fits = cast
    elif mutation == "drop":
        del model[key]
        fits = not strict
    elif mutation == "extra":
        model["extra"] = torch.zeros(2)
        fits = not strict
    elif mutation == "to_int":
        model[key] = 0
        fits = False
    elif mutation == "to_tensor":
        state["step"] = torch.zeros(())
        fits = False
    elif mutation == "unsupported":
        state["name"] = object()
        fits = False
    # Shard the xla "w" target over a random mesh: restoring reshards.
    if isinstance(model.get("w"), torch.Tensor) and model["w"].device.type == "xla" and model["w"].dim() == 2:
        mesh_case = draw(meshes())
        spec = draw(specs(mesh_case, 2))
        if spec.valid:
            mark_sharding(model["w"], mesh_case.build(), spec.spec)
    return state, strict, cast, fits


def _cpu_copies(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.cpu().clone() for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def _check_load(saved_checkpoint: tuple[str, str], case: tuple[dict[str, Any], bool, bool, bool]) -> None:
    path, digest = saved_checkpoint
    state, strict, cast, fits = case
    event(f"fits: {fits}")
    before = _cpu_copies(state)
    try:
        out = checkpoint.load(path, state, strict=strict, cast=cast)
    except Exception as e:  # noqa: BLE001 (the point: inspect whatever was raised)
        assert isinstance(e, CheckpointError), f"load raised {type(e).__module__}.{type(e).__name__}: {e}"
        assert not fits, f"a fitting target was refused: {type(e).__name__}: {e}"
        after = _cpu_copies(state)
        for k, v in before.items():
            assert torch.equal(after[k], v), f"a refused load changed target {k!r}"
    else:
        assert fits, "a target that does not fit was loaded"
        for k, v in out["model"].items():
            if k in SAVED:
                assert torch.equal(v.cpu(), SAVED[k].to(v.dtype)), f"{k}: {v.cpu()} != saved {SAVED[k]}"
        assert out["step"] == 7 and out["name"] == "run"
    assert _digest(path) == digest, "load changed the checkpoint's files"


@FAST
@given(case=targets())
def test_load_target_restores_exactly_or_raises_named_error(devices8, saved_checkpoint, case):
    _check_load(saved_checkpoint, case)


@pytest.mark.slow
@SLOW
@given(case=targets())
def test_load_target_restores_exactly_or_raises_named_error_slow(devices8, saved_checkpoint, case):
    _check_load(saved_checkpoint, case)
