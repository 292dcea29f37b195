"""Manual regions: shard_map, enable/disable_manual_sharding, collectives."""

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.mesh import Mesh, get_1d_mesh
from spmdtorch.partition import (
    ManualRegionError,
    all_gather,
    all_reduce,
    axis_index,
    disable_manual_sharding,
    enable_manual_sharding,
    get_sharding_spec,
    mark_sharding,
    ppermute,
    reduce_scatter,
    shard_map,
)


@pytest.fixture
def mesh1d():
    return get_1d_mesh("x")


def test_local_blocks_and_all_reduce(mesh1d):
    src = torch.arange(16.0).reshape(8, 2)
    seen = []

    def body(t):
        seen.append(tuple(t.shape))
        return all_reduce(t.sum(0, keepdim=True), "x")

    out = shard_map(body, mesh1d, [("x", None)], (None, None))(src.to("xla"))
    assert seen == [(1, 2)]  # the body sees one row per device
    torch.testing.assert_close(out.cpu(), src.sum(0, keepdim=True))


def test_sharded_output_and_axis_index(mesh1d):
    def body(t):
        return t * 0 + axis_index("x").float()

    out = shard_map(body, mesh1d, [("x",)], ("x",))(torch.zeros(8).to("xla"))
    torch.testing.assert_close(out.cpu(), torch.arange(8.0))
    assert get_sharding_spec(out) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_all_gather_reduce_scatter_ppermute(mesh1d):
    src = torch.arange(8.0)
    x = src.to("xla")
    gathered = shard_map(lambda t: all_gather(t, "x"), mesh1d, [("x",)], (None,))(x)
    torch.testing.assert_close(gathered.cpu()[:8], src)
    rs = shard_map(lambda t: reduce_scatter(t, "x"), mesh1d, [(None,)], ("x",))(x)
    torch.testing.assert_close(rs.cpu(), src * 8)
    perm = [(i, (i + 1) % 8) for i in range(8)]
    shifted = shard_map(lambda t: ppermute(t, "x", perm), mesh1d, [("x",)], ("x",))(x)
    torch.testing.assert_close(shifted.cpu(), torch.roll(src, 1))


def test_two_d_mesh_and_multiple_outputs():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    a = torch.randn(8, 4)
    b = torch.randn(4, 6)
    xa = mark_sharding(a.to("xla"), mesh, ("data", "model"))
    xb = mark_sharding(b.to("xla"), mesh, ("model", None))

    def body(la, lb):
        partial = la @ lb  # local contraction over this device's slice of k
        return all_reduce(partial, "model"), axis_index("model").float().reshape(1, 1) + 0 * partial[:1, :1]

    out, idx = shard_map(body, mesh, [("data", "model"), ("model", None)], [("data", None), ("data", "model")])(xa, xb)
    torch.testing.assert_close(out.cpu(), a @ b, rtol=1e-5, atol=1e-5)
    assert idx.shape == (4, 2)


def test_enable_disable_manual_sharding(mesh1d):
    x = torch.arange(8.0).to("xla")
    local = enable_manual_sharding(x, ("x",), mesh=mesh1d)
    assert tuple(local.shape) == (1,)
    y = disable_manual_sharding(local * 10, ("x",), (8,), mesh=mesh1d)
    torch.testing.assert_close(y.cpu(), torch.arange(8.0) * 10)


def test_errors(mesh1d):
    with pytest.raises(ManualRegionError, match="only available inside shard_map"):
        all_reduce(torch.ones(2, device="xla"), "x")
    with pytest.raises(Exception, match="not divisible"):
        shard_map(lambda t: t, mesh1d, [("x",)], ("x",))(torch.ones(6, device="xla"))
    with pytest.raises(ManualRegionError, match="requires grad"):
        shard_map(lambda t: t, mesh1d, [("x",)], ("x",))(torch.ones(8, device="xla", requires_grad=True))
    with pytest.raises(ManualRegionError, match="without a matching"):
        disable_manual_sharding(torch.ones(1, device="xla"), ("x",), (8,), mesh=mesh1d)


def test_region_is_cached_across_steps(mesh1d):
    f = shard_map(lambda t: all_reduce(t, "x"), mesh1d, [("x",)], ("x",))
    before = spmdtorch.debug.counter_value("UncachedCompile")
    for i in range(4):
        out = f(torch.full((8,), float(i)).to("xla"))
        spmdtorch.sync()
    assert spmdtorch.debug.counter_value("UncachedCompile") - before == 1
    torch.testing.assert_close(out.cpu(), torch.full((8,), 24.0))
