"""``torch_xla.experimental.distributed_checkpoint`` (``_helpers``, planners, manager) under compat, 8 devices.

Host snapshots (``_sharded_cpu_state_dict``) are checked against the CPU
tensors they came from; checkpoints written from them are read back into
other shardings and compared with the original values.
"""

from __future__ import annotations

import collections
import tempfile
import threading

import numpy as np
import torch
import torch.distributed.checkpoint as dist_cp
import torch.nn as nn


def _mesh(shape):
    import torch_xla.distributed.spmd as xs

    return xs.Mesh(np.arange(8), shape)


def _sharded_model(mesh_shape=(1, 8), seed=0):
    import torch_xla.distributed.spmd as xs

    torch.manual_seed(seed)
    cpu = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 5))
    model = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 5))
    model.load_state_dict(cpu.state_dict())
    model = model.to("xla")
    mesh = _mesh(mesh_shape)
    xs.mark_sharding(model[0].weight, mesh, (0, 1))
    xs.mark_sharding(model[2].weight, mesh, (None, None))  # explicitly replicated: not sharded
    return model, cpu


def test_sharded_cpu_state_dict_copies_shards_and_tensors_to_the_host():
    from torch_xla.experimental.distributed_checkpoint._helpers import _CpuShards, _sharded_cpu_state_dict

    model, cpu = _sharded_model(mesh_shape=(2, 4))
    state = {"model": model.state_dict(), "step": 7, "extra": [torch.ones(3, device="xla"), torch.zeros(2)]}
    host = _sharded_cpu_state_dict(state)
    assert isinstance(host["model"], collections.OrderedDict) and host["step"] == 7
    assert list(host["model"]) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    shards = host["model"]["0.weight"]
    assert isinstance(shards, _CpuShards)
    assert shards.global_shape == torch.Size([24, 16])
    want = cpu[0].weight.detach()
    assert len(shards.shards) == 8
    for s in shards.shards:
        assert s.data.device.type == "cpu"
        torch.testing.assert_close(s.data, want[s.indices])
    covered = torch.zeros(24, 16, dtype=torch.int32)
    for s in shards.shards:
        covered[s.indices] += 1
    assert torch.equal(covered, torch.ones_like(covered))  # (0, 1) over (2, 4): every element on one device
    for key in ("0.bias", "2.weight", "2.bias"):
        value = host["model"][key]
        assert type(value) is torch.Tensor and value.device.type == "cpu"
        torch.testing.assert_close(value, cpu.state_dict()[key])
    assert host["extra"][0].device.type == "cpu" and torch.equal(host["extra"][0], torch.ones(3))
    assert host["extra"][1].device.type == "cpu" and torch.equal(host["extra"][1], torch.zeros(2))


def test_is_sharded_tensor_and_unwrap():
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.distributed_checkpoint._helpers import (
        _cpu_shards_from_tensors,
        _is_sharded_tensor,
        _sharded_cpu_state_dict,
        _unwrap_xla_sharded_tensor,
    )

    mesh = _mesh((8,))
    plain = torch.arange(16.0).reshape(8, 2)
    t = plain.to("xla")
    wrapped = xs.mark_sharding(t, mesh, (0, None))
    assert _is_sharded_tensor(t) and _is_sharded_tensor(wrapped)
    assert _unwrap_xla_sharded_tensor(wrapped) is getattr(wrapped, "global_tensor", wrapped)
    assert _unwrap_xla_sharded_tensor(plain) is plain
    replicated = xs.mark_sharding(torch.zeros(8, 2, device="xla"), mesh, (None, None))
    assert not _is_sharded_tensor(replicated)
    assert not _is_sharded_tensor(torch.zeros(8, 2, device="xla"))
    assert not _is_sharded_tensor(plain)
    host = _sharded_cpu_state_dict({"w": wrapped})["w"]
    assert not _is_sharded_tensor(host)  # a _CpuShards is not a tensor (as in PyTorch/XLA)
    (from_list,) = _cpu_shards_from_tensors([wrapped])
    assert [s.data.tolist() for s in from_list.shards] == [plain[i : i + 1].tolist() for i in range(8)]


def test_planners_separate_sharded_and_unsharded_entries():
    from torch.distributed.checkpoint.default_planner import (
        create_default_global_save_plan,
        create_default_local_save_plan,
    )
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
    from torch_xla.experimental.distributed_checkpoint._helpers import _CpuShards, _sharded_cpu_state_dict

    model, cpu = _sharded_model()
    save = SPMDSavePlanner()
    save.set_up_planner(model.state_dict(), None, True)
    assert sorted(save.sharded_state_dict) == ["0.weight"]
    assert sorted(save.unsharded_state_dict) == ["0.bias", "2.bias", "2.weight"]

    nested = SPMDSavePlanner()
    nested.set_up_planner(_sharded_cpu_state_dict({"model": model.state_dict()}), None, True)
    assert sorted(nested.sharded_state_dict) == ["model.0.weight"]
    assert isinstance(nested.sharded_state_dict["model.0.weight"], _CpuShards)

    _, metadata = create_default_global_save_plan([create_default_local_save_plan(cpu.state_dict(), True)])
    load = SPMDLoadPlanner()
    load.set_up_planner(model.state_dict(), metadata, True)
    assert sorted(load.sharded_state_dict) == ["0.weight"]
    assert sorted(load.unsharded_state_dict) == ["0.bias", "2.bias", "2.weight"]
    plan = load.create_local_plan()
    assert sum(item.dest_index.fqn == "0.weight" for item in plan.items) == 8  # one region per device
    assert len(plan.items) == 8 + 3


def test_save_plan_indexes_local_shards_and_resolves_their_data():
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.distributed_checkpoint import SPMDSavePlanner
    from torch_xla.experimental.distributed_checkpoint._helpers import _sharded_cpu_state_dict

    model, _ = _sharded_model()
    shards = xs.wrap_if_sharded(model[0].weight).local_shards
    for state in (model.state_dict(), _sharded_cpu_state_dict(model.state_dict())):
        planner = SPMDSavePlanner()
        planner.set_up_planner(state, None, True)
        plan = planner.create_local_plan()
        items = [wi for wi in plan.items if wi.index.fqn == "0.weight"]
        assert sorted(wi.index.index for wi in items) == list(range(8))
        for wi in items:
            shard = shards[wi.index.index]
            assert tuple(wi.index.offset) == tuple(sl.start for sl in shard.indices)
            torch.testing.assert_close(planner.resolve_data(wi), shard.data)
        assert len(plan.items) == 8 + 3


def _save_and_load(state_in, target, save_planner, load_planner):
    with tempfile.TemporaryDirectory() as d:
        dist_cp.save(state_in, storage_writer=dist_cp.FileSystemWriter(d, sync_files=False), planner=save_planner)
        dist_cp.load(target, storage_reader=dist_cp.FileSystemReader(d), planner=load_planner)


def test_checkpoint_from_host_shards_loads_into_another_sharding():
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner, SPMDSavePlanner
    from torch_xla.experimental.distributed_checkpoint._helpers import _sharded_cpu_state_dict

    model, cpu = _sharded_model(mesh_shape=(2, 4), seed=1)
    snapshot = _sharded_cpu_state_dict(model.state_dict())
    with torch.no_grad():  # training goes on after the snapshot: the checkpoint keeps the snapshot's values
        model[0].weight.add_(1.0)
    target, _ = _sharded_model(mesh_shape=(8, 1), seed=2)
    spec_before = torch_xla._XLAC._get_xla_sharding_spec(target[0].weight)
    _save_and_load(snapshot, target.state_dict(), SPMDSavePlanner(), SPMDLoadPlanner())
    for key, value in target.state_dict().items():
        torch.testing.assert_close(value.cpu(), cpu.state_dict()[key])
    assert torch_xla._XLAC._get_xla_sharding_spec(target[0].weight) == spec_before  # loaded in place

    # Uneven shapes (padded shards) round-trip through host shards too.
    src = torch.randn(13, 7)
    t = src.to("xla")
    xs.mark_sharding(t, _mesh((8,)), (0, None))
    dst = torch.zeros(13, 7, device="xla")
    xs.mark_sharding(dst, _mesh((8,)), (None, 0))
    _save_and_load(_sharded_cpu_state_dict({"t": t}), {"t": dst}, SPMDSavePlanner(), SPMDLoadPlanner())
    torch.testing.assert_close(dst.cpu(), src)


def test_manager_save_async_does_not_run_a_patched_save_on_the_callers_thread():
    from torch_xla.experimental.distributed_checkpoint import CheckpointManager

    model, cpu = _sharded_model()
    with tempfile.TemporaryDirectory() as d:
        mgr = CheckpointManager(d, save_interval=10, chkpt_on_preemption=False)
        blocked = threading.Event()

        def blocking_save(*args, **kwargs):  # what PyTorch/XLA's own test patches in
            blocked.wait(30)

        mgr._save = blocking_save
        done = []
        worker = threading.Thread(target=lambda: done.append(mgr.save_async(10, model.state_dict())))
        worker.start()
        worker.join(20)
        blocked.set()
        assert done == [True], "save_async blocked in a patched _save"
        del mgr._save
        assert mgr.save_async(11, model.state_dict()) is False  # not due
        mgr.join()
        assert mgr.all_steps() == [10]
        fresh, _ = _sharded_model(seed=3)
        state = fresh.state_dict()
        mgr.restore(10, state)
        for key, value in state.items():
            torch.testing.assert_close(value.cpu(), cpu.state_dict()[key])
        mgr.close()


def test_manager_max_to_keep_retires_the_oldest_written_also_after_a_restart():
    from torch_xla.experimental.distributed_checkpoint import CheckpointManager

    state = {"w": torch.arange(4.0, device="xla")}
    with tempfile.TemporaryDirectory() as d:
        mgr = CheckpointManager(d, save_interval=10, max_to_keep=2, chkpt_on_preemption=False)
        for step, kept in ((10, {10}), (20, {10, 20}), (30, {20, 30}), (10, {30, 10})):
            assert mgr.save(step, state)
            assert set(mgr.all_steps()) == kept
        mgr.close()
        again = CheckpointManager(d, save_interval=10, max_to_keep=2, chkpt_on_preemption=False)
        assert again.save(20, state)
        assert set(again.all_steps()) == {10, 20}  # 30 was written before 10: it goes, not the lower 10
        restored = {"w": torch.zeros(4, device="xla")}
        again.restore(10, restored)
        torch.testing.assert_close(restored["w"].cpu(), torch.arange(4.0))
        again.close()


def test_default_planner_saves_xla_tensors_and_spmd_planner_loads_them_sharded():
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner

    _, cpu = _sharded_model(seed=4)  # the values to checkpoint, on the CPU
    src = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 5))
    src.load_state_dict(cpu.state_dict())
    src = src.to("xla")  # unsharded
    assert src[0].weight.is_pinned() is False  # DCP's default planner asks it of every tensor
    target, _ = _sharded_model(seed=5)
    _save_and_load(src.state_dict(), target.state_dict(), None, SPMDLoadPlanner())  # None: DefaultSavePlanner
    for key, value in target.state_dict().items():
        torch.testing.assert_close(value.cpu(), cpu.state_dict()[key])
