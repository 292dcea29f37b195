"""spmdtorch.sharding.full_to_shard_shape / shard_to_full_shape / mark_manual_sharding on xla tensors.

Values are compared with eager CPU torch doing the same computation on each
device's block; a manual value never leaves a program without shard_to_full
(a sync keeps it pending, a read is a named error).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.lazy.manual import ManualValueError
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import (
    ManualShardingError,
    ShardingSpec,
    ShardingType,
    full_to_shard_shape,
    get_sharding_spec,
    mark_manual_sharding,
    mark_sharding,
    shard_to_full_shape,
    sharding_type,
)


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (2, 4), ("a", "b"))


def _blocks(x: torch.Tensor, rows: int, cols: int, fn) -> torch.Tensor:
    """Eager CPU: ``fn`` on each block of a rows x cols grid of ``x``, reassembled."""
    return torch.cat([torch.cat([fn(b) for b in r.chunk(cols, dim=1)], dim=1) for r in x.chunk(rows, dim=0)], dim=0)


def _local_op(b: torch.Tensor) -> torch.Tensor:
    # Not elementwise: per block it differs from the same op on the whole tensor.
    return torch.cumsum(b, dim=1) * 2 + b.sum(dim=0, keepdim=True)


@pytest.mark.parametrize(("spec", "rows", "cols"), [(("a", "b"), 2, 4), ((None, "b"), 1, 4), (("a", None), 2, 1)])
def test_blocks_between_the_two_ends_equal_eager_per_block(mesh, spec, rows, cols):
    data = torch.randn(6, 8, generator=torch.Generator().manual_seed(0))
    x = mark_sharding(data.to("xla"), mesh, spec)
    block = full_to_shard_shape(x)
    assert tuple(block.shape) == (6 // rows, 8 // cols)
    y = shard_to_full_shape(_local_op(block), ShardingSpec(mesh, spec), (6, 8))
    expected = _blocks(data, rows, cols, _local_op)
    torch.testing.assert_close(y.cpu(), expected)
    assert not torch.allclose(expected, _local_op(data))  # the blocks really were computed apart
    assert get_sharding_spec(y) == get_sharding_spec(x)


def test_a_pending_sharded_value_enters_too(mesh):
    data = torch.arange(32.0).reshape(4, 8)
    x = mark_sharding(data.to("xla") * 3, mesh, (None, "b"))  # a pending value with a constraint
    y = shard_to_full_shape(full_to_shard_shape(x).flip(1), ShardingSpec(mesh, (None, "b")), (4, 8))
    torch.testing.assert_close(y.cpu(), _blocks(data * 3, 1, 4, lambda b: b.flip(1)))


def test_replicated_annotation_gives_the_whole_tensor(mesh):
    data = torch.arange(12.0).reshape(3, 4)
    x = mark_sharding(data.to("xla"), mesh, (None, None))
    block = full_to_shard_shape(x)
    assert tuple(block.shape) == (3, 4)
    y = shard_to_full_shape(block.cumsum(0), ShardingSpec(mesh, (None, None)), (3, 4))
    torch.testing.assert_close(y.cpu(), data.cumsum(0))
    assert get_sharding_spec(y) == "{replicated}"


def test_manual_values_report_manual(mesh):
    x = mark_sharding(torch.zeros(8, 8).to("xla"), mesh, ("a", "b"))
    block = full_to_shard_shape(x)
    assert sharding_type(block) == ShardingType.MANUAL
    assert get_sharding_spec(block) == "{manual}"
    assert sharding_type(block + 1) == ShardingType.MANUAL  # ops on a manual value stay manual
    assert sharding_type(x) == ShardingType.TILED


def test_mark_manual_in_place_then_replicated_exit(mesh):
    data = torch.arange(16.0).reshape(4, 4)
    t = data.to("xla") + 1
    assert mark_manual_sharding(t) is t
    assert get_sharding_spec(t) == "{manual}"
    y = shard_to_full_shape(t * 2, spmdtorch.lazy.replicated_sharding(), (4, 4))
    torch.testing.assert_close(y.cpu(), (data + 1) * 2)
    assert get_sharding_spec(y) == "{replicated}"


def test_a_sync_keeps_manual_values_pending_and_computes_the_rest(mesh):
    data = torch.arange(16.0).reshape(2, 8)
    x = mark_sharding(data.to("xla"), mesh, (None, "b"))
    block = full_to_shard_shape(x) + 1
    other = data.to("xla") * 5
    spmdtorch.sync()  # would be an XLA failure if the manual value were an output
    torch.testing.assert_close(other.cpu(), data * 5)
    with pytest.raises(ManualValueError, match=r"manually sharded.*shard_to_full_shape"):
        block.cpu()
    y = shard_to_full_shape(block, ShardingSpec(mesh, (None, "b")), (2, 8))
    torch.testing.assert_close(y.cpu(), data + 1)


def test_entering_needs_a_sharding(mesh):
    with pytest.raises(ManualShardingError, match="has no sharding.*mark_sharding") as e:
        full_to_shard_shape(torch.zeros(8, 8).to("xla"))
    assert isinstance(e.value, RuntimeError)  # PyTorch/XLA's type for it


def test_entering_twice_and_leaving_without_entering_are_named(mesh):
    x = mark_sharding(torch.zeros(8, 8).to("xla"), mesh, ("a", "b"))
    block = full_to_shard_shape(x)
    with pytest.raises(ManualShardingError, match="already manually sharded"):
        full_to_shard_shape(block)
    with pytest.raises(ManualShardingError, match="not manually sharded"):
        shard_to_full_shape(x, ShardingSpec(mesh, ("a", "b")), (8, 8))
    with pytest.raises(ManualShardingError, match=r"shape \(4, 2\).*block of full_shape \(8, 16\).*is \(4, 4\)"):
        shard_to_full_shape(block, ShardingSpec(mesh, ("a", "b")), (8, 16))


def test_indivisible_dims_are_named(mesh):
    x = mark_sharding(torch.zeros(4, 6).to("xla"), mesh, (None, "b"))
    with pytest.raises(ManualShardingError, match="dim 1 of size 6 is split 4 ways"):
        full_to_shard_shape(x)


def test_mark_manual_refuses_data_views_and_grad(mesh):
    with pytest.raises(ManualShardingError, match="holds data") as e:
        mark_manual_sharding(torch.zeros(3, 2).to("xla"))
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(ManualShardingError, match="is a view"):
        mark_manual_sharding((torch.zeros(3, 2).to("xla") + 1)[1:])
    w = torch.zeros(8, 8, device="xla", requires_grad=True)
    with pytest.raises(ManualShardingError, match="requires grad.*detach"):
        full_to_shard_shape(mark_sharding(w, mesh, ("a", "b")))


def test_bad_arguments_are_named(mesh):
    block = full_to_shard_shape(mark_sharding(torch.zeros(8, 8).to("xla"), mesh, ("a", "b")))
    with pytest.raises(TypeError, match="sharding"):
        shard_to_full_shape(block, ("a", "b"), (8, 8))
    with pytest.raises(TypeError, match="t must be a tensor on the xla device"):
        full_to_shard_shape(torch.zeros(2))


def test_hlo_text_of_a_manual_value(mesh):
    x = mark_sharding(torch.zeros(8, 8).to("xla"), mesh, ("a", "b"))
    block = full_to_shard_shape(x)
    text = spmdtorch.debug.get_hlo_text([block])  # the program before partitioning: fine to print
    assert 'custom_call_target="SPMDFullToShardShape", sharding={manual}' in text
    with pytest.raises(ManualValueError, match=r"get_hlo_text\(optimized=True\).*manually sharded"):
        spmdtorch.debug.get_hlo_text([block], optimized=True)


def test_inside_a_compiled_function(mesh):
    data = torch.arange(64.0).reshape(8, 8)
    x = mark_sharding(data.to("xla"), mesh, ("a", "b"))

    def step(x):
        return shard_to_full_shape(full_to_shard_shape(x).cumsum(0), ShardingSpec(mesh, ("a", "b")), (8, 8))

    compiled = spmdtorch.compile(step)
    for _ in range(2):  # the trace, then a replay
        torch.testing.assert_close(compiled(x).cpu(), _blocks(data, 2, 4, lambda b: b.cumsum(0)))

    leaked = spmdtorch.compile(lambda x: full_to_shard_shape(x) + 1)(x)  # a manual result stays pending
    with pytest.raises(ManualValueError, match="manually sharded"):
        leaked.cpu()


def test_views_of_manual_values(mesh):
    data = torch.arange(64.0).reshape(8, 8)
    block = full_to_shard_shape(mark_sharding(data.to("xla"), mesh, ("a", "b")))  # (4, 2) per device
    top = block[:2]
    assert sharding_type(top) == ShardingType.MANUAL  # reported, not computed (which would fail)
    y = shard_to_full_shape(top.t(), ShardingSpec(mesh, ("a", "b")), (4, 8))
    expected = torch.empty(4, 8)
    for i in range(2):  # device (i, j) holds data[4i:4i+4, 2j:2j+2]; its result lands at block (i, j) of (4, 8)
        for j in range(4):
            expected[2 * i : 2 * i + 2, 2 * j : 2 * j + 2] = data[4 * i : 4 * i + 2, 2 * j : 2 * j + 2].t()
    torch.testing.assert_close(y.cpu(), expected)
