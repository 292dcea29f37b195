"""export: single-file safetensors/torch state_dicts, streamed in bounded batches."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from safetensors import safe_open

from spmdtorch import checkpoint
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

export_mod = importlib.import_module("spmdtorch.checkpoint.export")  # the package re-exports the function


@pytest.fixture
def saved(tmp_path):
    src = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).to("xla")
    model.load_state_dict(src.state_dict())
    mark_sharding(model[0].weight, Mesh(np.arange(8), (4, 2), ("a", "b")), ("a", "b"))  # uneven
    state = {
        "model": model.state_dict(),
        "ids": torch.tensor([2**40, 3], device="cpu"),
        "idx": torch.tensor([5, -1], device="xla"),
        "step": 12,
        "cfg": {"name": "x", "lr": 0.1},
    }
    checkpoint.save(tmp_path / "c", state)
    return tmp_path, src


def test_safetensors_export_loads_into_a_plain_model(saved, monkeypatch):
    tmp_path, src = saved
    batches = []
    read = export_mod._read_batch
    monkeypatch.setattr(export_mod, "_read_batch", lambda p, infos, b: (batches.append(list(b)), read(p, infos, b))[1])
    checkpoint.export(tmp_path / "c", tmp_path / "m.safetensors", prefix="model", max_host_bytes=200)
    # 0.weight (240 B) exceeds the budget and goes alone; the other three (40 + 120 + 12 B) fit in one batch.
    assert batches == [[0], [1, 2, 3]]
    plain = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    with safe_open(tmp_path / "m.safetensors", "pt") as f:
        plain.load_state_dict({k: f.get_tensor(k) for k in f.keys()})
    for k, v in src.state_dict().items():
        assert torch.equal(plain.state_dict()[k], v), k
    checkpoint.export(tmp_path / "c", tmp_path / "all.safetensors")
    with safe_open(tmp_path / "all.safetensors", "pt") as f:
        assert set(f.keys()) == {"model.0.weight", "model.0.bias", "model.1.weight", "model.1.bias", "ids", "idx"}
        assert f.get_tensor("ids").tolist() == [2**40, 3] and f.get_tensor("idx").dtype == torch.int64
        assert f.metadata()["step"] == "12" and f.metadata()["cfg.lr"] == "0.1"


def test_torch_export_is_what_torch_save_would_write(saved):
    tmp_path, src = saved
    checkpoint.export(tmp_path / "c", tmp_path / "all.pt", "torch", max_host_bytes=1)
    got = torch.load(tmp_path / "all.pt", weights_only=True)
    assert got["step"] == 12 and got["cfg"] == {"name": "x", "lr": 0.1}
    assert got["ids"].tolist() == [2**40, 3] and got["idx"].tolist() == [5, -1]
    assert got["idx"].dtype == torch.int64
    for k, v in src.state_dict().items():
        assert torch.equal(got["model"][k], v), k


def test_export_errors(saved):
    tmp_path, _ = saved
    with pytest.raises(ValueError, match="format"):
        checkpoint.export(tmp_path / "c", tmp_path / "x", "npz")
    with pytest.raises(KeyError, match="optimizer"):
        checkpoint.export(tmp_path / "c", tmp_path / "x", prefix="optimizer")
    with pytest.raises(checkpoint.NotACheckpointError):
        checkpoint.export(tmp_path / "nope", tmp_path / "x")


def test_export_prefix_into_a_list_names_the_missing_entry(tmp_path):
    # A str key or an out-of-range index into a saved list is a missing entry
    # (KeyError naming the prefix), not a TypeError/IndexError from indexing.
    checkpoint.save(tmp_path / "c", {"layers": [{"w": torch.ones(2)}], "step": 1})
    checkpoint.export(tmp_path / "c", tmp_path / "ok.pt", "torch", prefix=("layers", 0))
    assert torch.equal(torch.load(tmp_path / "ok.pt", weights_only=True)["w"], torch.ones(2))
    for prefix in [("layers", "0"), ("layers", 1), ("layers", True), ("step", "x")]:
        with pytest.raises(KeyError, match="no entry"):
            checkpoint.export(tmp_path / "c", tmp_path / "x.pt", "torch", prefix=prefix)
