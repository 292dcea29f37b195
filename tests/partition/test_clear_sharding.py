"""clear_sharding leaves a tensor unannotated, i.e. replicated, and every inspection agrees at once.

PyTorch/XLA: after ``xs.clear_sharding(t)``, ``_get_xla_sharding_spec(t)`` is "".
spmdtorch's inspection API (get_sharding_spec, sharding_type, tensor_sharding,
visualize_tensor_sharding, local_shards) reports the same from then on, and
programs that overwrite the tensor keep it replicated.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.lazy import executor
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import (
    ShardingType,
    clear_sharding,
    get_sharding_spec,
    local_shards,
    mark_sharding,
    sharding_type,
    tensor_sharding,
    visualize_tensor_sharding,
)
from spmdtorch.tensor.dispatch import read_value

TILED = "{devices=[4,2]0,1,2,3,4,5,6,7}"


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def assert_unsharded(t, values):
    """Every inspection says "no sharding", and the data is whole on each device."""
    assert get_sharding_spec(t) == ""
    assert sharding_type(t) is ShardingType.REPLICATED
    table = visualize_tensor_sharding(t, print_=False)
    assert (len(table.columns), table.row_count) == (1, 1)  # one block: every device holds all of it
    shards = local_shards(t)
    assert len(shards) == 8 and all(tuple(s.data.shape) == tuple(t.shape) for s in shards)
    for s in shards:
        torch.testing.assert_close(s.data, values)
    sharding = tensor_sharding(t)
    assert sharding is None or sharding.is_fully_replicated
    torch.testing.assert_close(t.cpu(), values)


def test_concrete_data(mesh):
    src = torch.arange(32.0).reshape(8, 4)
    w = mark_sharding(src.to("xla"), mesh, ("data", "model"))
    assert get_sharding_spec(w) == TILED
    assert clear_sharding(w) is w
    # At once, before any program ran: no sharding reported anywhere.
    assert get_sharding_spec(w) == ""
    assert sharding_type(w) is ShardingType.REPLICATED
    assert tensor_sharding(w) is None
    assert_unsharded(w, src)  # local_shards computes the pending gather
    assert read_value(w).is_fully_replicated


def test_a_parameter_stays_replicated_after_updates(mesh):
    lin = torch.nn.Linear(4, 8).to("xla")
    mark_sharding(lin.weight, mesh, ("data", "model"))
    ref = torch.nn.Linear(4, 8)
    ref.load_state_dict({k: v.cpu() for k, v in lin.state_dict().items()})
    clear_sharding(lin.weight)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (lin, ref)]
    x = torch.randn(6, 4)
    for m, opt, xx in ((lin, opts[0], x.to("xla")), (ref, opts[1], x)):
        for _ in range(2):
            m(xx).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    spmdtorch.sync()
    assert_unsharded(lin.weight, ref.weight.detach())


def test_clear_then_mark_reshards_once_without_a_gather(mesh):
    src = torch.arange(32.0).reshape(8, 4)
    w = mark_sharding(src.to("xla"), mesh, ("data", "model"))
    clear_sharding(w)
    mark_sharding(w, mesh, ("model", "data"))
    assert executor.pending_storages() == []  # the data was resharded directly, nothing pending
    assert get_sharding_spec(w) == "{devices=[2,4]0,2,4,6,1,3,5,7}"
    torch.testing.assert_close(w.cpu(), src)


def test_pending_value_loses_its_constraint(mesh):
    x = torch.randn(8, 4).to("xla")
    y = x * 2
    mark_sharding(y, mesh, ("data", "model"))
    assert 'custom_call_target="Sharding"' in spmdtorch.debug.get_hlo_text([y])
    clear_sharding(y)
    assert get_sharding_spec(y) == ""
    assert 'custom_call_target="Sharding"' not in spmdtorch.debug.get_hlo_text([y])
    torch.testing.assert_close(y.cpu(), x.cpu() * 2)


def test_uneven_padded_data(mesh):
    src = torch.arange(30.0).reshape(6, 5)  # 4 does not divide 6: padded storage
    w = mark_sharding(src.to("xla"), mesh, ("data", "model"))
    clear_sharding(w)
    assert get_sharding_spec(w) == ""
    assert_unsharded(w, src)
    mark_sharding(w, mesh, (None, "model"))
    torch.testing.assert_close(w.cpu(), src)


def test_view(mesh):
    base = mark_sharding(torch.arange(32.0).reshape(8, 4).to("xla"), mesh, ("data", "model"))
    v = base.t()  # unannotated view of a tiled base: reports the placement it computes to
    assert get_sharding_spec(v) != ""
    clear_sharding(v)
    assert get_sharding_spec(v) == ""
    assert_unsharded(v, torch.arange(32.0).reshape(8, 4).t())
    assert get_sharding_spec(base) == TILED  # the base keeps its own annotation


def test_clearing_an_unannotated_tensor_is_harmless(mesh):
    t = torch.ones(8, 4).to("xla")
    clear_sharding(t)
    assert_unsharded(t, torch.ones(8, 4))
