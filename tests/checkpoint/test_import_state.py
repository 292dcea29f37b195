"""import_state_dict: plain state_dicts into sharded models, one tensor at a time."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from spmdtorch import checkpoint
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def _sharded():
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).to("xla")
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    mark_sharding(model[0].weight, mesh, ("a", "b"))  # uneven: padded storage
    mark_sharding(model[1].weight, mesh, (None, "a"))
    return model


@pytest.mark.parametrize("kind", ["safetensors", "torch", "dict"])
def test_imports_into_the_parameters_own_shardings(tmp_path, kind, monkeypatch):
    src = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3))
    sd = src.state_dict()
    if kind == "safetensors":
        save_file({k: v.contiguous() for k, v in sd.items()}, tmp_path / "m.safetensors")
        source = tmp_path / "m.safetensors"
    elif kind == "torch":
        torch.save(sd, tmp_path / "m.pt")
        source = tmp_path / "m.pt"
    else:
        source = sd
    model = _sharded()
    before = {k: (v._st.value.sharding, v._st.value.shape) for k, v in model.state_dict().items()}
    placed = []
    real_put = jax.device_put
    monkeypatch.setattr(jax, "device_put", lambda x, s=None, **kw: (placed.append(s), real_put(x, s, **kw))[1])
    assert checkpoint.import_state_dict(source, model) == ([], [])
    # Every parameter went straight to its own sharding: no replicated staging copy.
    assert placed == [before[k][0] for k in sd]
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), sd[k]), k
        assert (v._st.value.sharding, v._st.value.shape) == before[k], k
    assert before["0.weight"][1] == (12, 6)


def test_import_errors():
    model = _sharded()
    sd = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Linear(10, 3)).state_dict()
    with pytest.raises(checkpoint.ShapeMismatchError, match=r"'0.weight'.*\(10, 5\).*\(10, 6\)"):
        checkpoint.import_state_dict({**sd, "0.weight": torch.zeros(10, 5)}, model)
    with pytest.raises(checkpoint.DtypeMismatchError, match="cast=True"):
        checkpoint.import_state_dict({**sd, "0.bias": torch.zeros(10, dtype=torch.float64)}, model)
    checkpoint.import_state_dict({**sd, "0.bias": torch.ones(10, dtype=torch.float64)}, model, cast=True)
    assert torch.equal(model[0].bias.cpu(), torch.ones(10))
    with pytest.raises(checkpoint.MissingKeysError, match="1.bias"):
        checkpoint.import_state_dict({k: v for k, v in sd.items() if k != "1.bias"}, model)
    with pytest.raises(checkpoint.UnexpectedKeysError, match="extra"):
        checkpoint.import_state_dict({**sd, "extra": torch.zeros(1)}, model)
    assert checkpoint.import_state_dict({**sd, "extra": torch.zeros(1)}, model, strict=False) == ([], ["extra"])
