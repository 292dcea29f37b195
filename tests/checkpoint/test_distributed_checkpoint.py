"""PyTorch/XLA's checkpoint API: torch.distributed.checkpoint with SPMDSavePlanner/SPMDLoadPlanner
(resharding on load), and CheckpointManager with PyTorch/XLA's signature, save_async, prime_optimizer.

Values are compared with the CPU tensors they came from, and resumed training with eager CPU torch.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp
from checkpoint_placement import place
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException

import spmdtorch
import spmdtorch.checkpoint.distributed_checkpoint as xc
from spmdtorch import checkpoint
from spmdtorch.checkpoint import StepNotFoundError, UnsupportedValueError
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _mesh():
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def _chunks(path, fqn):
    return FileSystemReader(str(path)).read_metadata().state_dict_metadata[fqn].chunks


@pytest.mark.parametrize(
    "save_spec,load_spec",
    [
        (("data", "model"), ("model", None)),  # 2-D -> other axis
        (("data", "model"), (None, None)),  # sharded -> replicated
        ((None, None), ("data", "model")),  # replicated -> sharded
        (("model", "data"), ("data", None)),  # uneven (10 rows over 4) both ways
    ],
)
def test_save_and_load_reshard_in_place(devices8, tmp_path, save_spec, load_spec):
    mesh = _mesh()
    w = torch.randn(10, 6)
    b = torch.arange(5, dtype=torch.int64)
    state = {
        "model": {"w": mark_sharding(w.clone().to("xla"), mesh, save_spec), "b": b.to("xla")},
        "step": 7,
        "name": "run",
        "cpu": torch.ones(3),
    }
    dist_cp.save(state, checkpoint_id=str(tmp_path), planner=xc.SPMDSavePlanner())
    assert (tmp_path / ".metadata").is_file()  # DCP's format, not Orbax's
    target_w = mark_sharding(torch.zeros(10, 6).to("xla"), mesh, load_spec)
    sharding_before = target_w._st.value.sharding
    target = {
        "model": {"w": target_w, "b": torch.zeros(5, dtype=torch.int64).to("xla")},
        "step": 0,
        "name": "",
        "cpu": torch.zeros(3),
    }
    dist_cp.load(target, checkpoint_id=str(tmp_path), planner=xc.SPMDLoadPlanner())
    assert target["model"]["w"] is target_w  # in place
    torch.testing.assert_close(target_w.cpu(), w, rtol=0, atol=0)
    assert target_w._st.value.sharding == sharding_before  # the target keeps its own sharding
    assert torch.equal(target["model"]["b"].cpu(), b)
    assert (target["step"], target["name"]) == (7, "run")
    assert torch.equal(target["cpu"], torch.ones(3))
    # The restored tensor computes like the original.
    torch.testing.assert_close((target_w @ target_w.T).cpu(), w @ w.T)


def test_each_distinct_shard_is_written_once(devices8, tmp_path):
    mesh = _mesh()
    state = {
        "sharded": mark_sharding(torch.randn(8, 4).to("xla"), mesh, ("data", "model")),
        "half": mark_sharding(torch.randn(8, 4).to("xla"), mesh, ("data", None)),  # replicated over "model"
        "replicated": torch.randn(8, 4).to("xla"),
    }
    dist_cp.save(state, checkpoint_id=str(tmp_path), planner=xc.SPMDSavePlanner())
    assert len(_chunks(tmp_path, "sharded")) == 8
    assert len(_chunks(tmp_path, "half")) == 4
    assert len(_chunks(tmp_path, "replicated")) == 1
    assert {tuple(c.sizes) for c in _chunks(tmp_path, "sharded")} == {(2, 2)}


def test_load_a_plain_torch_dcp_checkpoint_into_sharded_tensors(devices8, tmp_path):
    # A checkpoint written by CPU torch (or PyTorch/XLA's planner: one chunk per shard) loads into any sharding.
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    dist_cp.save({"model": model.state_dict()}, checkpoint_id=str(tmp_path), planner=DefaultSavePlanner())
    xla_model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).to("xla")
    mesh = _mesh()
    mark_sharding(xla_model[0].weight, mesh, ("model", "data"))  # 8 x 6: uneven over "data"
    mark_sharding(xla_model[2].weight, mesh, (None, "data"))
    state = {"model": xla_model.state_dict()}
    dist_cp.load(state, checkpoint_id=str(tmp_path), planner=xc.SPMDLoadPlanner())
    x = torch.randn(5, 6)
    torch.testing.assert_close(xla_model(x.to("xla")).cpu(), model(x), rtol=1e-5, atol=1e-6)


def _load_error(state, path) -> BaseException:
    """The planner's own exception (DCP wraps it, per rank, in a CheckpointException)."""
    with pytest.raises(CheckpointException) as info:
        dist_cp.load(state, checkpoint_id=str(path), planner=xc.SPMDLoadPlanner())
    (failure,) = info.value.failures.values()
    return failure[0]


def test_planner_errors(devices8, tmp_path):
    dist_cp.save({"w": torch.ones(4, 2).to("xla")}, checkpoint_id=str(tmp_path), planner=xc.SPMDSavePlanner())
    err = _load_error({"w": torch.zeros(3, 2).to("xla")}, tmp_path)
    assert isinstance(err, ValueError)
    assert "Size mismatch between saved torch.Size([4, 2]) and current: torch.Size([3, 2]) for w" in str(err)
    base = torch.zeros(8, 2).to("xla")
    err = _load_error({"w": base[:4]}, tmp_path)
    assert isinstance(err, UnsupportedValueError) and "state_dict['w'] is a view of another tensor" in str(err)
    err = _load_error({"v": torch.zeros(1).to("xla")}, tmp_path)
    assert "Missing key in checkpoint state_dict: v" in str(err)


# -- CheckpointManager (PyTorch/XLA's signature) ------------------------------------------------


def _train(model, opt, xs, ys):
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def test_manager_resumes_training_like_eager_torch(devices8, tmp_path):
    torch.manual_seed(0)
    cpu_model = torch.nn.Linear(4, 3)
    xs, ys = torch.randn(6, 8, 4), torch.randn(6, 8, 3)
    init = {k: v.clone() for k, v in cpu_model.state_dict().items()}
    cpu_opt = torch.optim.AdamW(cpu_model.parameters(), lr=0.05)
    eager = _train(cpu_model, cpu_opt, xs, ys)
    xs_x, ys_x = xs.to("xla"), ys.to("xla")

    mesh = _mesh()

    def build():
        m = torch.nn.Linear(4, 3)
        m.load_state_dict(init)
        m = m.to("xla")
        mark_sharding(m.weight, mesh, ("model", None))
        return m, torch.optim.AdamW(m.parameters(), lr=0.05)

    model, opt = build()
    mgr = xc.CheckpointManager(str(tmp_path), 3, max_to_keep=2)
    first = []
    for step in range(4):
        first += _train(model, opt, xs_x[step : step + 1], ys_x[step : step + 1])
        state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        took = mgr.save_async(step, state) if step % 2 else mgr.save(step, state)
        assert took == (step % 3 == 0)  # PyTorch/XLA's rule: step % save_interval == 0
    mgr.join()
    assert mgr.all_steps() == [0, 3]
    mgr.close()

    # A new process would do this: a fresh model, a primed optimizer, restore the newest step.
    model2, opt2 = build()
    assert xc.prime_optimizer(opt2) is opt2
    mgr2 = xc.CheckpointManager(str(tmp_path), 3)
    state = {"model": model2.state_dict(), "optim": opt2.state_dict(), "step": -1}
    assert mgr2.restore(max(mgr2.all_steps()), state) is None
    assert state["step"] == 3  # plain values are written into the caller's dict
    opt2.load_state_dict(state["optim"])
    rest = _train(model2, opt2, xs_x[4:], ys_x[4:])
    np.testing.assert_allclose(first + rest, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model2.weight.cpu(), cpu_model.weight, rtol=1e-5, atol=1e-6)
    with pytest.raises(StepNotFoundError, match="step 1 is not saved"):
        mgr2.restore(1, state)
    assert not mgr2.reached_preemption(4)
    mgr2.close()


def test_manager_max_to_keep_and_written_format(devices8, tmp_path):
    w = torch.zeros(4, device="xla")
    with xc.CheckpointManager(tmp_path, 1, max_to_keep=2) as mgr:
        for step in range(4):
            w.add_(1)
            assert mgr.save_async(step, {"w": w})
        mgr.join()
        assert mgr.all_steps() == [2, 3] and mgr.base_path == str(tmp_path)
    # Orbax (spmdtorch's native format): the step directory loads with spmdtorch.checkpoint.load.
    assert (tmp_path / "3" / "arrays").is_dir() and json.loads((tmp_path / "3" / "meta" / "metadata").read_text())
    assert torch.equal(checkpoint.load(tmp_path / "3", {"w": torch.zeros(4)})["w"], torch.full((4,), 4.0))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"save_interval": 0}, "save_interval must be an int >= 1, got 0"),
        ({"save_interval": 1, "max_to_keep": -1}, "max_to_keep must be an int >= 0, got -1"),
        ({"save_interval": 1, "max_pending_async": 0}, "max_pending_async must be an int >= 1, got 0"),
        ({"save_interval": 1, "process_group": object()}, "process_group must be None"),
    ],
)
def test_manager_argument_errors(devices8, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        xc.CheckpointManager(str(tmp_path), **kwargs)


def test_native_manager_save_async_and_join(devices8, tmp_path):
    w = torch.zeros(2, device="xla")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with checkpoint.CheckpointManager(tmp_path, save_interval_steps=1, async_save=False) as mgr:
            w.add_(1)
            assert mgr.save_async(0, {"w": w})
            mgr.join()
            assert mgr.all_steps() == [0]
            assert torch.equal(mgr.restore({"w": torch.zeros(2)})["w"], torch.ones(2))


def test_place_helper_targets_on_a_device_subset(devices8, tmp_path):
    # Save on 8 devices, load onto 4 of them (a smaller slice), as the native API does.
    w = torch.randn(8, 3)
    dist_cp.save({"w": place(w, 8, ("x",))}, checkpoint_id=str(tmp_path), planner=xc.SPMDSavePlanner())
    target = place(torch.zeros(8, 3), 4, (None, None))
    dist_cp.load({"w": target}, checkpoint_id=str(tmp_path), planner=xc.SPMDLoadPlanner())
    assert torch.equal(target.cpu(), w)
    assert len(target._st.value.sharding.device_set) == 4
    assert spmdtorch.runtime.process_count() == 1
