"""spmdtorch.checkpoint.distributed_checkpoint's host snapshots: CpuShards, is_sharded, sharded_cpu_state_dict.

Each shard is compared with the CPU tensor's slice it claims to hold; a checkpoint
written from a snapshot loads back into another sharding with the snapshot's values.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dist_cp

import spmdtorch.checkpoint.distributed_checkpoint as xc
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@pytest.mark.parametrize(
    ("mesh_shape", "spec", "n_distinct"), [((8,), (0, None), 8), ((2, 4), (1, 0), 8), ((2, 4), (None, 1), 4)]
)
def test_snapshot_shards_hold_their_slices(devices8, mesh_shape, spec, n_distinct):
    cpu = torch.randn(16, 8)
    t = mark_sharding(cpu.to("xla"), Mesh(np.arange(8), mesh_shape), spec)
    assert xc.is_sharded(t)
    snap = xc.sharded_cpu_state_dict({"t": t, "n": 3})
    assert snap["n"] == 3
    shards = snap["t"]
    assert isinstance(shards, xc.CpuShards) and xc.is_sharded(shards)
    assert shards.global_shape == cpu.shape and len(shards.shards) == 8
    for s in shards.shards:
        torch.testing.assert_close(s.data, cpu[s.indices])
    assert len({tuple((sl.start, sl.stop) for sl in s.indices) for s in shards.shards}) == n_distinct


def test_unsharded_values_go_to_the_cpu(devices8):
    replicated = mark_sharding(torch.ones(4, 2, device="xla"), Mesh(np.arange(8), (8,)), (None, None))
    plain = torch.arange(3.0, device="xla")
    snap = xc.sharded_cpu_state_dict([replicated, plain, "x"])
    assert not xc.is_sharded(replicated) and not xc.is_sharded(plain) and not xc.is_sharded(torch.ones(2))
    assert snap[0].device.type == "cpu" and torch.equal(snap[0], torch.ones(4, 2))
    assert torch.equal(snap[1], torch.arange(3.0)) and snap[2] == "x"


def test_snapshot_checkpoint_loads_into_another_sharding(devices8, tmp_path):
    cpu = torch.randn(9, 5)  # uneven over 8 devices: padded shards
    t = mark_sharding(cpu.to("xla"), Mesh(np.arange(8), (8,)), (0, None))
    snap = xc.sharded_cpu_state_dict({"t": t})
    t.mul_(2)  # later updates do not reach the snapshot
    dist_cp.save(snap, checkpoint_id=tmp_path, planner=xc.SPMDSavePlanner())
    dst = mark_sharding(torch.zeros(9, 5, device="xla"), Mesh(np.arange(8), (2, 4)), (1, 0))
    dist_cp.load({"t": dst}, checkpoint_id=tmp_path, planner=xc.SPMDLoadPlanner())
    torch.testing.assert_close(dst.cpu(), cpu)
