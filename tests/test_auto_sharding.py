"""spmdtorch's auto-sharding (``runtime.use_spmd(auto=True)``): the rule, the placement, the values.

Auto mode shards each large, unannotated, default-placed program input once
along its largest evenly divisible dimension (``spmdtorch.plan._auto``); the
values must equal eager PyTorch on CPU.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec
from torch import nn

import spmdtorch
from spmdtorch import config, debug, runtime
from spmdtorch.mesh import Mesh
from spmdtorch.plan import auto_partition_spec
from spmdtorch.sharding import get_sharding_spec, mark_sharding, tensor_sharding

EIGHT_WAY_ON_DIM1 = "{devices=[1,8]0,1,2,3,4,5,6,7}"


@pytest.fixture
def auto(devices8, monkeypatch):
    """Auto mode on for one test (off again after), with no ``XLA_AUTO_SPMD_MESH``."""
    monkeypatch.delenv("XLA_AUTO_SPMD_MESH", raising=False)
    runtime.use_spmd(auto=True)
    try:
        yield
    finally:
        runtime.set_auto_sharding(False)


def _placement(t):
    """The sharding of the array behind an xla tensor (read after a sync)."""
    sh = tensor_sharding(t)
    assert sh is not None, "the tensor has no placed data"
    return sh


def test_rule_shards_the_largest_evenly_divisible_dimension():
    assert auto_partition_spec((64, 128), {"x": 8}) == PartitionSpec(None, "x")
    assert auto_partition_spec((128, 64), {"x": 8}) == PartitionSpec("x", None)
    assert auto_partition_spec((12, 16), {"x": 8}) == PartitionSpec(None, "x")  # 12 is not divisible by 8
    assert auto_partition_spec((5, 7), {"x": 8}) is None
    # Whole mesh first, then one axis (largest first).
    assert auto_partition_spec((6, 16), {"a": 2, "b": 4}) == PartitionSpec(None, ("a", "b"))
    assert auto_partition_spec((6, 12), {"a": 2, "b": 4}) == PartitionSpec(None, "b")
    assert auto_partition_spec((6, 10), {"a": 2, "b": 4}) == PartitionSpec(None, "a")


def test_use_spmd_auto_is_a_switch():
    assert not runtime.auto_sharding_enabled() and runtime.auto_sharding() is None
    runtime.use_spmd(auto=True)
    try:
        runtime.use_spmd()  # as in PyTorch/XLA, plain use_spmd() leaves auto mode on
        assert runtime.auto_sharding_enabled()
    finally:
        runtime.set_auto_sharding(False)
    assert not runtime.auto_sharding_enabled()
    with pytest.raises(spmdtorch.ArgumentTypeError, match="auto"):
        runtime.use_spmd(auto="yes")


def test_matmul_shards_inputs_and_equals_cpu(auto):
    t1, t2 = torch.randn(64, 128), torch.randn(128, 256)
    debug.clear_caches()  # a cached program is not compiled (nor counted) again
    debug.clear_counters()
    x1, x2 = t1.to("xla"), t2.to("xla")
    got = (x1 @ x2).sum()
    spmdtorch.sync()
    assert debug.counter_value("CompileWithAutoSharding") == 1
    torch.testing.assert_close(got.cpu(), (t1 @ t2).sum(), rtol=1e-4, atol=1e-3)
    # The inputs were re-placed once and keep that placement (8-way along the larger dimension).
    assert get_sharding_spec(x1) == EIGHT_WAY_ON_DIM1
    assert get_sharding_spec(x2) == EIGHT_WAY_ON_DIM1
    assert [s.data.shape for s in spmdtorch.sharding.local_shards(x1)] == [(64, 16)] * 8
    torch.testing.assert_close(x1.cpu(), t1)  # the data itself is unchanged


def test_threshold_and_indivisible_inputs_stay_replicated(auto):
    small = torch.arange(15, dtype=torch.float32)  # < 2 elements per device
    even = torch.arange(16, dtype=torch.float32)  # exactly 2 per device
    odd = torch.randn(5, 7)  # large enough, but no dimension divisible by 8
    xs, xe, xo = small.to("xla"), even.to("xla"), odd.to("xla")
    out = xs.sum() + xe.sum() + xo.sum()
    spmdtorch.sync()
    torch.testing.assert_close(out.cpu(), small.sum() + even.sum() + odd.sum())
    assert _placement(xs).is_fully_replicated
    assert _placement(xo).is_fully_replicated
    assert not _placement(xe).is_fully_replicated
    assert get_sharding_spec(xe) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_user_annotation_wins_before_and_after(auto):
    mesh = Mesh(np.arange(8), (8, 1), ("x", "y"))
    t = torch.randn(64, 128)
    marked = mark_sharding(t.to("xla"), mesh, ("x", None))  # rows, though auto would pick columns
    plain = t.to("xla")
    out = (marked + plain).sum()
    spmdtorch.sync()
    torch.testing.assert_close(out.cpu(), (t + t).sum(), rtol=1e-5, atol=1e-3)
    assert get_sharding_spec(marked) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    # The unannotated input was placed by the rule, on the user's mesh (one program, one mesh).
    assert _placement(plain).spec == PartitionSpec(None, ("x", "y"))
    # The auto placement is no annotation: a later mark_sharding replaces it.
    mark_sharding(plain, mesh, ("x", None))
    assert get_sharding_spec(plain) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(plain.cpu(), t)


def test_off_again_places_nothing(auto):
    runtime.set_auto_sharding(False)
    debug.clear_counters()
    t = torch.randn(64, 128)
    x = t.to("xla")
    out = (x * 2).sum()
    spmdtorch.sync()
    torch.testing.assert_close(out.cpu(), (t * 2).sum(), rtol=1e-5, atol=1e-3)
    assert debug.counter_value("CompileWithAutoSharding") == 0
    assert _placement(x).is_fully_replicated


def test_linear_training_equals_cpu(auto):
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 8))
    model = copy.deepcopy(cpu_model).to("xla")
    data, target = torch.randn(128, 128), torch.randint(0, 8, (128,))
    xdata, xtarget = data.to("xla"), target.to("xla")
    opt_cpu = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()
    debug.clear_counters()
    for _ in range(5):
        for m, o, d, y in ((cpu_model, opt_cpu, data, target), (model, opt, xdata, xtarget)):
            o.zero_grad()
            loss = loss_fn(m(d), y)
            loss.backward()
            o.step()
        spmdtorch.sync()
    assert 1 <= debug.counter_value("CompileWithAutoSharding") <= 3
    for p_cpu, p in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu, rtol=1e-4, atol=1e-5)
    # The first layer's weight (64x128) and the data were sharded; updates kept the placement.
    assert get_sharding_spec(model[0].weight) == EIGHT_WAY_ON_DIM1
    assert get_sharding_spec(xdata) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # 128x128: a tie goes to the first


def test_auto_mesh_from_environment(auto, monkeypatch):
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "2,4")
    assert runtime.auto_sharding() == runtime.AutoSharding((2, 4))
    t1, t2, t3 = torch.randn(6, 10), torch.randn(10, 12), torch.randn(16)
    x1, x2, x3 = t1.to("xla"), t2.to("xla"), t3.to("xla")
    got = (x1 @ x2).sum() + x3.sum()
    spmdtorch.sync()
    torch.testing.assert_close(got.cpu(), (t1 @ t2).sum() + t3.sum(), rtol=1e-4, atol=1e-4)
    assert _placement(x3).spec == PartitionSpec(("auto_0", "auto_1"))  # the whole mesh divides 16
    assert _placement(x2).spec == PartitionSpec(None, "auto_1")  # only the 4-device axis divides 12
    assert _placement(x1).spec == PartitionSpec(None, "auto_0")  # only the 2-device axis divides 10


def test_auto_mesh_that_does_not_fit_the_devices_is_named(auto, monkeypatch):
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "2,2")
    x = torch.randn(64, 128).to("xla")
    with pytest.raises(runtime.SpmdModeError, match=r"XLA_AUTO_SPMD_MESH=2,2 has 4 devices, expected 8"):
        (x + 1).cpu()
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "2,x")
    with pytest.raises(config.ConfigError, match="XLA_AUTO_SPMD_MESH"):
        runtime.auto_sharding()


def test_inspecting_a_graph_does_not_re_place_storages(auto):
    x = torch.randn(64, 128).to("xla")
    text = debug.get_hlo_text([x + 1])
    assert "devices=[1,8]" in text  # the program as it would compile
    assert _placement(x).is_fully_replicated  # but the tensor was not moved


def test_compiled_step_replays_with_the_auto_placement(auto):
    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 8))
    model = copy.deepcopy(cpu_model).to("xla")
    opt_cpu = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    @spmdtorch.compile
    def step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    for _ in range(4):  # trace, then replays with new (replicated) batches placed like the traced ones
        x, y = torch.randn(128, 128), torch.randint(0, 8, (128,))
        got = step(x.to("xla"), y.to("xla"))
        opt_cpu.zero_grad()
        want = nn.functional.cross_entropy(cpu_model(x), y)
        want.backward()
        opt_cpu.step()
        torch.testing.assert_close(got.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for p_cpu, p in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu, rtol=1e-4, atol=1e-5)
    assert get_sharding_spec(model[0].weight) == EIGHT_WAY_ON_DIM1


def test_auto_mode_is_part_of_the_program_key(devices8, caplog):
    x = torch.arange(4.0).to("xla")  # too small to be placed: only the mode differs
    (x + 1).cpu()
    debug.clear_counters()
    runtime.use_spmd(auto=True)
    try:
        with caplog.at_level(logging.INFO, logger="spmdtorch.compile"):
            torch.testing.assert_close((x + 1).cpu(), torch.arange(4.0) + 1)
    finally:
        runtime.set_auto_sharding(False)
    assert debug.counter_value("CompileWithAutoSharding") == 1  # compiled anew, not the cached program
    assert "input placement mode changed: None -> ('auto', (8,))" in caplog.text
