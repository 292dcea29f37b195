"""``torch.save``/``torch.load`` of xla tensors, parameters and state dicts.

As stock torch does for devices without host storage: the values are saved;
``torch.load`` rebuilds them on "xla" by default, or where ``map_location``
says (CPU included), with ``weights_only=True`` (torch's default) too.
"""

import io
import pickle

import numpy as np
import pytest
import torch

import spmdtorch  # noqa: F401  (registers the xla device)
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding
from spmdtorch.tensor import XlaTensor


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("map_location", [None, "xla", torch.device("xla", 0)])
def test_tensor_loads_back_on_xla(dtype, map_location):
    want = (torch.randn(3, 5) * 10).to(dtype)
    got = _roundtrip(want.to("xla"), map_location=map_location)
    assert isinstance(got, XlaTensor) and got.device.type == "xla"
    assert got.dtype == dtype and not got.requires_grad
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("map_location", ["cpu", torch.device("cpu"), {"xla:0": "cpu"}])
def test_map_location_cpu_gives_plain_cpu_tensors(map_location):
    want = torch.randn(4, 2)
    got = _roundtrip({"w": want.to("xla"), "n": 3}, map_location=map_location)
    assert type(got["w"]) is torch.Tensor and got["w"].device.type == "cpu"
    assert got["n"] == 3
    torch.testing.assert_close(got["w"], want, rtol=0, atol=0)


def test_lazy_result_and_view_save_their_values():
    x = torch.arange(12.0).reshape(3, 4)
    xx = x.to("xla")
    y = xx * 2 + 1  # pending, never synced before the save
    got = _roundtrip({"y": y, "view": xx[1:, ::2], "t": xx.t()})
    torch.testing.assert_close(got["y"].cpu(), x * 2 + 1)
    torch.testing.assert_close(got["view"].cpu(), x[1:, ::2])
    torch.testing.assert_close(got["t"].cpu(), x.t())


def test_state_dict_roundtrip_matches_eager_and_loads_into_a_model():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to("xla")
    model.load_state_dict(cpu_model.state_dict())
    sd = _roundtrip(model.state_dict())
    assert set(sd) == set(cpu_model.state_dict())
    for k, v in cpu_model.state_dict().items():
        assert isinstance(sd[k], XlaTensor)
        torch.testing.assert_close(sd[k].cpu(), v, rtol=0, atol=0)
    # A CPU load goes straight into a fresh CPU model, as a CUDA checkpoint would.
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fresh.load_state_dict(_roundtrip(model.state_dict(), map_location="cpu"))
    x = torch.randn(5, 4)
    torch.testing.assert_close(fresh(x), cpu_model(x), rtol=0, atol=0)


def test_parameter_keeps_requires_grad_and_trains_after_load():
    p = torch.nn.Parameter(torch.randn(3).to("xla"))
    got = _roundtrip(p)
    assert isinstance(got, torch.nn.Parameter) and isinstance(got, XlaTensor)
    assert got.requires_grad and got.is_leaf
    (got * 2).sum().backward()
    torch.testing.assert_close(got.grad.cpu(), torch.full((3,), 2.0))
    cpu = _roundtrip(p, map_location="cpu")
    assert type(cpu) is torch.nn.Parameter and cpu.requires_grad
    torch.testing.assert_close(cpu, p.detach().cpu(), rtol=0, atol=0)


def test_optimizer_state_and_whole_module_roundtrip():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(4, 3).to("xla")).sum().backward()
    opt.step()
    state = _roundtrip(opt.state_dict())
    for i, s in opt.state_dict()["state"].items():
        for k, v in s.items():
            assert state["state"][i][k].device == v.device
            torch.testing.assert_close(state["state"][i][k].cpu(), v.cpu(), rtol=0, atol=0)
    whole = _roundtrip(model, weights_only=False)
    assert whole.weight.device.type == "xla" and whole.weight.requires_grad
    x = torch.randn(2, 3)
    torch.testing.assert_close(whole(x.to("xla")).cpu(), model(x.to("xla")).cpu(), rtol=0, atol=0)


def test_sharded_tensor_saves_its_full_value(devices8):
    mesh = Mesh(np.arange(8), (8,), ("data",))
    want = torch.randn(16, 3)
    x = mark_sharding(want.to("xla"), mesh, ("data", None))
    got = _roundtrip(x)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)


def test_plain_pickle_and_cpu_saves_are_unchanged():
    x = torch.randn(2, 2)
    torch.testing.assert_close(pickle.loads(pickle.dumps(x.to("xla"))).cpu(), x, rtol=0, atol=0)
    # A CPU checkpoint still loads as CPU; map_location="xla" cannot move a
    # host storage onto the device (the documented limit), so it stays CPU.
    got = _roundtrip({"a": x}, map_location="xla")
    assert got["a"].device.type == "cpu"
    torch.testing.assert_close(got["a"], x, rtol=0, atol=0)
