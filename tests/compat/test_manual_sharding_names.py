"""PyTorch/XLA's low-level manual sharding under compat: ``_XLAC._spmd_full_to_shard_shape``,
``_spmd_shard_to_full_shape``, ``_XLAC.OpSharding``, ``_XLAC._mark_manual_sharding`` and ``xs._mark_manual_sharding``.

Values are compared with eager CPU torch computing the same thing per block.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture
def xla():
    import torch_xla
    import torch_xla.distributed.spmd as xs

    return torch_xla, xs


def test_full_to_shard_then_local_op_then_shard_to_full_equals_eager_per_block(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    data = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    mesh = xs.Mesh(np.arange(8), (1, 8))
    xt = xs.mark_sharding(data.to("xla"), mesh, (0, 1))
    block = X._spmd_full_to_shard_shape(xt.global_tensor)
    assert block.shape == (4, 1)
    assert X._get_xla_sharding_spec(block) == "{manual}"
    local = block.cumsum(0) - block.mean()
    wrapped = xs._mark_manual_sharding(local)
    assert wrapped.global_tensor is local and wrapped.sharding_type == xs.ShardingType.MANUAL
    full = X._spmd_shard_to_full_shape(local, mesh.get_op_sharding((0, 1)), data.shape, data.dtype)
    assert full.shape == (4, 8)
    expected = torch.cat([b.cumsum(0) - b.mean() for b in data.chunk(8, dim=1)], dim=1)
    torch.testing.assert_close(full.cpu(), expected)
    assert X._get_xla_sharding_spec(full) == X._get_xla_sharding_spec(xt.global_tensor)


def test_hlo_holds_the_custom_calls(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    xt = xs.mark_sharding(torch.zeros(8, 4).to("xla"), xs.Mesh(np.arange(8), (8, 1)), (None, None))
    block = X._spmd_full_to_shard_shape(xt.global_tensor)
    assert block.shape == (8, 4)
    hlo = X._get_xla_tensors_hlo([block])
    assert "f32[8,4]{1,0} custom-call(" in hlo
    assert 'custom_call_target="SPMDFullToShardShape", sharding={manual}' in hlo
    out = X._spmd_shard_to_full_shape(
        block + 1, X.OpSharding([], [], [], xs.ShardingType.REPLICATED), (8, 4), torch.float32
    )
    assert 'custom_call_target="SPMDShardToFullShape", sharding={replicated}' in X._get_xla_tensors_hlo([out])
    assert X._get_xla_sharding_spec(out) == "{replicated}"
    torch.testing.assert_close(out.cpu(), torch.ones(8, 4))


def test_xlac_mark_manual_takes_a_manual_op_sharding(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    t = torch.arange(6.0).reshape(2, 3).to("xla") * 2
    X._mark_manual_sharding(t, X.OpSharding([], [], [], xs.ShardingType.MANUAL))
    assert xs.wrap_as_sharded_tensor(t).sharding_spec == "{manual}"
    assert "sharding={manual}" in X._get_xla_tensors_hlo([t])
    with pytest.raises(X.OpShardingError, match="ShardingType.MANUAL"):
        X._mark_manual_sharding(t, X.OpSharding([], [], [], xs.ShardingType.REPLICATED))


def test_tiled_op_sharding_from_a_tile_assignment(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    data = torch.arange(32.0).reshape(4, 8)
    tiled = X.OpSharding([[0, 1, 2, 3], [4, 5, 6, 7]], [], [], xs.ShardingType.TILED)
    t = data.to("xla") + 0
    xs._mark_manual_sharding(t)  # each device's block is the whole (4, 8): not a (2, 2) block of (4, 8)
    with pytest.raises(RuntimeError, match=r"block of full_shape \(4, 8\).*is \(2, 2\)"):
        X._spmd_shard_to_full_shape(t, tiled, (4, 8), torch.float32)
    corner = X._spmd_full_to_shard_shape(xs.mark_sharding(data.to("xla"), xs.Mesh(np.arange(8), (2, 4)), (0, 1)))
    full = X._spmd_shard_to_full_shape(corner * 10, tiled, (4, 8), torch.float32)
    torch.testing.assert_close(full.cpu(), data * 10)
    assert X._get_xla_sharding_spec(full) == "{devices=[2,4]0,1,2,3,4,5,6,7}"


def test_pytorch_xla_refusals_are_runtime_errors(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    data = torch.zeros(8, 8).to("xla")
    with pytest.raises(RuntimeError, match="holds data"):
        xs._mark_manual_sharding(data)
    with pytest.raises(RuntimeError, match="has no sharding"):
        X._spmd_full_to_shard_shape(data)
    replicated = X.OpSharding([], [], [], xs.ShardingType.REPLICATED)
    with pytest.raises(RuntimeError, match="not manually sharded"):
        X._spmd_shard_to_full_shape(data + 1, replicated, (8, 8), torch.float32)


def test_bad_arguments_are_named(xla):
    torch_xla, xs = xla
    X = torch_xla._XLAC
    t = torch.zeros(2, 2).to("xla") + 1
    xs._mark_manual_sharding(t)
    with pytest.raises(X.OpShardingError, match="non-manual OpSharding"):
        X._spmd_shard_to_full_shape(t, X.OpSharding([], [], [], xs.ShardingType.MANUAL), (2, 2), torch.float32)
    with pytest.raises(X.OpShardingError, match="dtype torch.bfloat16 is not the tensor's torch.float32"):
        X._spmd_shard_to_full_shape(t, X.OpSharding([], [], [], xs.ShardingType.REPLICATED), (2, 2), torch.bfloat16)
    with pytest.raises(X.OpShardingError, match="get_op_sharding"):
        X.OpSharding([[0, 1]], [[0], [1]], [], xs.ShardingType.PARTIAL)
    with pytest.raises(X.OpShardingError, match="sharding_type must be"):
        X.OpSharding([], [], [], 42)
    with pytest.raises(X.OpShardingError, match="empty tile_assignment"):
        X.OpSharding([0, 1], [], [], xs.ShardingType.REPLICATED)
    with pytest.raises(TypeError, match="expected a tensor on the xla device"):
        X._spmd_full_to_shard_shape(torch.zeros(2))
