"""PyTorch/XLA's auto-sharding names under compat: ``xr.use_spmd(auto=True)``, ``auto_policy``, the metric, the hash.

spmdtorch's auto mode is its own rule (tests/test_auto_sharding.py), not XLA's
solver; these tests check that PyTorch/XLA's code drives it and reads it back,
and that the values equal eager PyTorch on CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn


@pytest.fixture
def auto_off(monkeypatch):
    """Auto mode is process-wide: every test leaves it off, as it found it."""
    import spmdtorch

    monkeypatch.delenv("XLA_AUTO_SPMD_MESH", raising=False)
    assert not spmdtorch.runtime.auto_sharding_enabled()
    yield
    spmdtorch.runtime.set_auto_sharding(False)


def test_switch_and_graph_hash_follow_auto_mode_and_mesh(auto_off, monkeypatch):
    import torch_xla
    import torch_xla.runtime as xr

    assert not torch_xla._XLAC._xla_get_auto_sharding()
    x = torch.ones(2, 2).to("xla")
    no_auto = torch_xla._XLAC._get_graph_hash([x + 0])
    assert torch_xla._XLAC._get_graph_hash([x + 0]) == no_auto  # the same graph hashes the same
    xr.use_spmd(auto=True)
    assert torch_xla._XLAC._xla_get_auto_sharding()
    auto = torch_xla._XLAC._get_graph_hash([x + 0])
    assert auto != no_auto
    monkeypatch.setenv("XLA_AUTO_SPMD_MESH", "2,4")
    auto_2x4 = torch_xla._XLAC._get_graph_hash([x + 0])
    assert auto_2x4 not in (auto, no_auto)
    monkeypatch.delenv("XLA_AUTO_SPMD_MESH")
    assert torch_xla._XLAC._get_graph_hash([x + 0]) == auto
    import spmdtorch

    spmdtorch.runtime.set_auto_sharding(False)
    assert not torch_xla._XLAC._xla_get_auto_sharding()
    assert torch_xla._XLAC._get_graph_hash([x + 0]) == no_auto


def test_matmul_counts_one_auto_compile_and_equals_cpu(auto_off):
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.runtime as xr

    import spmdtorch

    xr.use_spmd(auto=True)
    spmdtorch.debug.clear_caches()  # a cached program is not compiled (nor counted) again
    met.clear_counters()
    t1, t2 = torch.randn(64, 128), torch.randn(128, 256)
    x1, x2 = t1.to("xla"), t2.to("xla")
    got = (x1 @ x2).sum()
    torch_xla.sync()
    assert met.counter_value("CompileWithAutoSharding") == 1
    torch.testing.assert_close(got.cpu(), (t1 @ t2).sum(), rtol=1e-4, atol=1e-3)
    # Really sharded: PyTorch/XLA's sharding string for each input names 8 devices.
    assert torch_xla._XLAC._get_xla_sharding_spec(x1) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    assert torch_xla._XLAC._get_xla_sharding_spec(x2) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    # Off again: a new program compiles without it.
    spmdtorch.runtime.set_auto_sharding(False)
    met.clear_counters()
    (x1 * 3).sum().cpu()
    assert met.counter_value("CompileWithAutoSharding") is None


def test_distribute_module_auto_policy_trains_like_cpu(auto_off):
    import torch_xla
    import torch_xla.debug.metrics as met
    from torch.distributed.device_mesh import DeviceMesh
    from torch_xla.distributed.spmd import auto_policy, xla_distribute_module

    torch.manual_seed(0)
    cpu_model = nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 1))
    model = xla_distribute_module(copy.deepcopy(cpu_model), DeviceMesh("xla", list(range(8))), auto_policy)
    assert torch_xla._XLAC._xla_get_auto_sharding()
    data, target = torch.randn(128, 128), torch.randn(128, 1)
    xdata, xtarget = data.to("xla"), target.to("xla")
    opt_cpu = torch.optim.SGD(cpu_model.parameters(), lr=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    met.clear_counters()
    for _ in range(5):
        for m, o, d, y in ((cpu_model, opt_cpu, data, target), (model, opt, xdata, xtarget)):
            o.zero_grad()
            nn.functional.mse_loss(m(d), y).backward()
            o.step()
        torch_xla.sync()
    count = met.counter_value("CompileWithAutoSharding")
    assert count is not None and 1 <= count <= 3
    for p_cpu, p in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_cpu, rtol=1e-4, atol=1e-5)
    assert torch_xla._XLAC._get_xla_sharding_spec(model[0].weight) == "{devices=[1,8]0,1,2,3,4,5,6,7}"


def test_mark_sharding_wins_over_auto(auto_off):
    import numpy as np
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd(auto=True)
    mesh = xs.Mesh(np.arange(8), (8, 1))
    t = torch.randn(64, 128)
    x = t.to("xla")
    xs.mark_sharding(x, mesh, (0, None))  # auto would shard the columns
    (x + 1).sum().cpu()
    assert torch_xla._XLAC._get_xla_sharding_spec(x) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
