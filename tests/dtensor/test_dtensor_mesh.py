"""spmdtorch.dtensor meshes: torch's DeviceMesh over xla devices in one process, with no process group."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.device_mesh import init_device_mesh as torch_init_device_mesh
from torch.distributed.tensor import Shard

import spmdtorch  # noqa: F401
from spmdtorch.dtensor import (
    DeviceMeshError,
    NoRankError,
    XlaDeviceMesh,
    distribute_tensor,
    init_device_mesh,
    mesh_groups,
    root_axes,
    spmd_mesh,
)


def _groups(ids: np.ndarray, keep: tuple[int, ...]) -> list:
    """Every group of the sub-mesh keeping root dims `keep`: numpy's own transpose of the id array."""
    rest = [d for d in range(ids.ndim) if d not in keep]
    moved = np.transpose(ids, rest + list(keep))
    return moved.reshape((-1,) + tuple(ids.shape[d] for d in keep)).tolist()


def test_init_is_a_torch_device_mesh(devices8):
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    assert isinstance(mesh, DeviceMesh) and isinstance(mesh, XlaDeviceMesh)
    assert mesh.device_type == "xla"
    assert mesh.shape == (2, 4) and mesh.ndim == 2 and mesh.size() == 8 and mesh.size(1) == 4
    assert mesh.mesh_dim_names == ("dp", "tp")
    assert mesh.mesh.tolist() == np.arange(8).reshape(2, 4).tolist()
    # The shape-first form is the same mesh.
    assert init_device_mesh((2, 4), mesh_dim_names=("dp", "tp")) == mesh
    # And it equals (and hashes like) torch's own xla mesh of the same layout.
    theirs = DeviceMesh("xla", torch.arange(8).reshape(2, 4), mesh_dim_names=("dp", "tp"))
    assert mesh == theirs and hash(mesh) == hash(theirs)


@pytest.mark.parametrize(
    ("shape", "names", "keep"),
    [
        ((8,), ("x",), ("x",)),
        ((2, 4), ("dp", "tp"), ("tp",)),
        ((2, 4), ("dp", "tp"), ("dp",)),
        ((2, 2, 2), ("dp", "cp", "tp"), ("dp", "tp")),
        ((2, 2, 2), ("dp", "cp", "tp"), ("cp",)),
        ((2, 2, 2), ("dp", "cp", "tp"), ("dp", "cp", "tp")),
    ],
)
def test_slicing_by_name(devices8, shape, names, keep):
    mesh = init_device_mesh("xla", shape, mesh_dim_names=names)
    sub = mesh[keep if len(keep) > 1 else keep[0]]
    dims = tuple(names.index(k) for k in keep)
    assert isinstance(sub, XlaDeviceMesh)
    assert sub.shape == tuple(shape[d] for d in dims) and sub.mesh_dim_names == keep
    assert root_axes(sub) == tuple((d,) for d in dims)
    ids = np.arange(8).reshape(shape)
    assert mesh_groups(sub).tolist() == _groups(ids, dims)
    assert sub.mesh.tolist() == _groups(ids, dims)[0]  # the group holding device 0
    assert spmd_mesh(sub) == spmd_mesh(mesh)  # a sub-mesh's layouts are over the root mesh


def test_flatten(devices8):
    mesh = init_device_mesh("xla", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    flat = mesh["dp", "cp"]._flatten()
    assert isinstance(flat, XlaDeviceMesh)
    assert flat.mesh_dim_names == ("dp_cp",) and flat.shape == (4,)
    assert root_axes(flat) == ((0, 1),)
    # One group per tp index, each the dp x cp devices in row-major order.
    assert (
        mesh_groups(flat).tolist() == np.array(_groups(np.arange(8).reshape(2, 2, 2), (0, 1))).reshape(-1, 4).tolist()
    )
    whole = mesh._flatten("all")
    assert root_axes(whole) == ((0, 1, 2),) and whole.mesh.tolist() == list(range(8))
    # A flattened dim is a placement target like any other: sharding over it uses both root axes.
    d = distribute_tensor(torch.arange(8.0), flat, [Shard(0)])
    assert d.full_tensor().cpu().tolist() == list(range(8))
    with pytest.raises(DeviceMeshError, match="already a dim"):
        mesh["dp", "cp"]._flatten("tp")


def test_spmd_mesh_keeps_device_order(devices8):
    order = [3, 1, 0, 2, 7, 5, 4, 6]
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"), device_ids=order)
    m = spmd_mesh(mesh)
    assert m.mesh_shape == (2, 4) and m.axis_names == ("dp", "tp")
    assert m.device_ids.tolist() == order == mesh.mesh.flatten().tolist()


@pytest.mark.parametrize("query", ["get_rank", "get_coordinate", "get_group", "get_all_groups", "get_local_rank"])
def test_per_rank_queries_are_named_errors(devices8, query):
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    with pytest.raises(NoRankError, match="mesh_groups"):
        getattr(mesh["tp"], query)()


def test_bad_meshes(devices8):
    with pytest.raises(DeviceMeshError, match="'cuda'"):
        init_device_mesh("cuda", (8,))
    with pytest.raises(DeviceMeshError, match="all 8 devices"):
        init_device_mesh("xla", (2, 2))
    with pytest.raises(DeviceMeshError, match="unique"):
        init_device_mesh("xla", (2, 4), mesh_dim_names=("a", "a"))
    with pytest.raises(DeviceMeshError, match="positive ints"):
        init_device_mesh("xla", (2, 0))
    with pytest.raises(DeviceMeshError, match="DeviceMesh"):
        distribute_tensor(torch.ones(8), "not a mesh", [Shard(0)])  # type: ignore[arg-type]


def test_torch_built_root_mesh_is_accepted(devices8):
    # torch's own init_device_mesh("xla", ...) needs no process group for the root mesh (only slicing would).
    theirs = torch_init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    d = distribute_tensor(torch.arange(8.0).reshape(8, 1), theirs, [Shard(0), Shard(1)])
    assert isinstance(d.device_mesh, XlaDeviceMesh) and d.device_mesh == theirs
    assert d.full_tensor().cpu().flatten().tolist() == list(range(8))
