"""PyTorch/XLA reports the output sharding of every program result, ``{replicated}`` included.

In SPMD mode PyTorch/XLA gives each tensor a program computes the sharding of
the executable's output (``PrepareOutputShardingPropagation``), so
``_get_xla_sharding_spec`` of ``t1 @ t2`` after a sync is ``'{replicated}'``;
data transferred from the host, a pending value and a tensor just cleared with
``clear_sharding`` report ``''``. ``spmdtorch.sharding.get_sharding_spec(t,
computed=True)`` and ``XLAShardedTensor.sharding_spec`` follow that rule; the
string is checked against where the data really is (every device holding the
whole value).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.partition import local_shards
from spmdtorch.sharding import clear_sharding, get_sharding_spec, mark_sharding

TILED = "{devices=[8,1]0,1,2,3,4,5,6,7}"


@pytest.fixture
def mesh():
    from spmdtorch.mesh import Mesh

    return Mesh(np.arange(8), (8, 1), ("data", "model"))


def _whole_on_every_device(t, want):
    shards = local_shards(t)
    assert len(shards) == 8
    for s in shards:
        torch.testing.assert_close(s.data, want)


def test_host_data_reports_none_program_result_reports_replicated():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    t1, t2 = a.to("xla"), b.to("xla")
    t3 = t1 @ t2
    assert get_sharding_spec(t3, computed=True) == ""  # pending: no program ran yet
    spmdtorch.sync()
    assert get_sharding_spec(t1, computed=True) == ""  # transferred from the host
    assert get_sharding_spec(t3, computed=True) == "{replicated}"
    _whole_on_every_device(t3, a @ b)  # the string says what the placement is
    assert get_sharding_spec(t3) == ""  # the default keeps "unannotated" as ""


def test_in_place_update_of_host_data_is_a_program_result():
    t = torch.ones(8, 2).to("xla")
    t.add_(1)
    spmdtorch.sync()
    assert get_sharding_spec(t, computed=True) == "{replicated}"
    _whole_on_every_device(t, torch.full((8, 2), 2.0))


def test_sharded_program_result_reports_the_same_either_way(mesh):
    x = mark_sharding(torch.arange(16.0).reshape(8, 2).to("xla"), mesh, ("data", None))
    y = x * 3
    spmdtorch.sync()
    assert get_sharding_spec(y, computed=True) == get_sharding_spec(y) == TILED


def test_cleared_data_reports_none_until_computed_again(mesh):
    w = mark_sharding(torch.arange(16.0).reshape(8, 2).to("xla"), mesh, ("data", None))
    clear_sharding(w)
    assert get_sharding_spec(w, computed=True) == ""
    _whole_on_every_device(w, torch.arange(16.0).reshape(8, 2))  # runs the gather clear_sharding queued
    assert get_sharding_spec(w, computed=True) == ""
    w.mul_(2)
    spmdtorch.sync()
    assert get_sharding_spec(w, computed=True) == "{replicated}"
    clear_sharding(w)  # already replicated: nothing to gather, still reported as cleared
    assert get_sharding_spec(w, computed=True) == ""


def test_sharded_tensor_sharding_spec_of_a_program_result():
    import torch_xla.distributed.spmd as xs

    t = torch.randn(4, 4).to("xla")
    assert xs.XLAShardedTensor(t).sharding_spec == ""
    u = t + 1
    spmdtorch.sync()
    assert xs.XLAShardedTensor(u).sharding_spec == "{replicated}"


def test_loader_batch_without_a_spec_is_host_data():
    from spmdtorch.data import MpDeviceLoader

    (batch,) = list(MpDeviceLoader([torch.arange(8.0)], "xla"))
    assert batch.device.type == "xla"
    assert get_sharding_spec(batch, computed=True) == ""
    doubled = batch * 2
    spmdtorch.sync()
    assert get_sharding_spec(doubled, computed=True) == "{replicated}"


def test_host_data_moved_onto_the_user_mesh_still_reports_no_sharding():
    # A program over a user mesh re-homes replicated host data onto that mesh
    # (a relabelling of the same data); it is still host data, not a program output.
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(list(range(8)), (1, 8))
    host = torch.ones(8, 8).to("xla")
    sharded = torch.ones(8, 8).to("xla")
    xs.mark_sharding(sharded, mesh, (0, 1))
    out = host + sharded
    torch_xla.sync()
    assert torch_xla._XLAC._get_xla_sharding_spec(host) == ""
    assert torch_xla._XLAC._get_xla_sharding_spec(out) != ""
    assert torch.equal(out.cpu(), torch.full((8, 8), 2.0))
