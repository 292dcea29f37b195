"""HybridMesh on one process, and the pure DCN/ICI placement on fake devices."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from jax.experimental import mesh_utils

from spmdtorch.mesh import (
    AxisNamesError,
    DeviceRecord,
    HybridMesh,
    HybridMeshError,
    Mesh,
    MeshShapeError,
    hybrid_device_ids,
)

# ------------------------------------------------------------ on the 8 devices


@pytest.mark.parametrize("dcn", [None, (1, 1)])
def test_single_process_equals_plain_mesh(devices8, dcn):
    h = HybridMesh(ici_mesh_shape=(4, 2), dcn_mesh_shape=dcn, axis_names=("data", "model"))
    assert h == Mesh(range(8), (4, 2), ("data", "model"))
    assert h.ici_mesh_shape == (4, 2) and h.dcn_mesh_shape == (1, 1)
    assert h.mesh_shape == (4, 2)
    assert h.shape() == {"data": 4, "model": 2}
    assert h.named_sharding(("data", "model")).spec == h.jax_partition_spec((0, 1))
    assert isinstance(h, Mesh)
    assert "HybridMesh(ici_mesh_shape=(4, 2), dcn_mesh_shape=(1, 1)" in repr(h)


def test_pytorch_xla_3d_example_shape(devices8):
    h = HybridMesh(ici_mesh_shape=(1, 8, 1), axis_names=("data", "fsdp", "tensor"))
    assert list(h.shape().items()) == [("data", 1), ("fsdp", 8), ("tensor", 1)]


def test_unnamed_hybrid(devices8):
    h = HybridMesh(ici_mesh_shape=(8,))
    assert h.axis_names is None and h == Mesh(range(8), (8,))


def test_dcn_on_one_process_is_refused(devices8):
    with pytest.raises(HybridMeshError) as e:
        HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1))
    msg = str(e.value)
    assert "cannot place DCN groups" in msg
    assert "dcn_mesh_shape (2, 1) asks for 2 groups" in msg
    assert "the runtime has 1 process (the devices report no slice_index)" in msg


def test_hybrid_validation(devices8):
    with pytest.raises(HybridMeshError, match=r"\(4, 2\) has 2 axes but dcn_mesh_shape \(1,\) has 1"):
        HybridMesh(ici_mesh_shape=(4, 2), dcn_mesh_shape=(1,))
    with pytest.raises(HybridMeshError, match="covers 4 devices but the runtime has 8"):
        HybridMesh(ici_mesh_shape=(2, 2))
    with pytest.raises(MeshShapeError, match=r"ici_mesh_shape\[0\] must be >= 1"):
        HybridMesh(ici_mesh_shape=(0, 8))
    with pytest.raises(MeshShapeError, match=r"dcn_mesh_shape must be a tuple"):
        HybridMesh(ici_mesh_shape=(8,), dcn_mesh_shape="1")
    with pytest.raises(AxisNamesError):
        HybridMesh(ici_mesh_shape=(4, 2), axis_names=("a",))
    with pytest.raises(TypeError):
        HybridMesh((4, 2))  # keyword-only, as in PyTorch/XLA


# ---------------------------------------------------- pure placement, fake devices


def _hosts(n_proc: int, per: int, slices: bool = False) -> list[DeviceRecord]:
    return [DeviceRecord(p * per + k, p, p if slices else None) for p in range(n_proc) for k in range(per)]


def test_two_processes_dcn_rows():
    recs = _hosts(2, 4)
    ids = hybrid_device_ids(recs, (1, 4), (2, 1))
    assert ids.shape == (2, 4)
    owner = {r.device_id: r.process_index for r in recs}
    for row, proc in zip(ids, (0, 1)):
        assert {owner[int(d)] for d in row} == {proc}  # one process per DCN row
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3], [4, 5, 6, 7]])


def test_dcn_on_inner_axis():
    ids = hybrid_device_ids(_hosts(2, 4), (2, 2), (1, 2))
    np.testing.assert_array_equal(ids, [[0, 1, 4, 5], [2, 3, 6, 7]])


def test_record_order_does_not_matter():
    recs = _hosts(2, 4)
    a = hybrid_device_ids(recs, (2, 2), (2, 1))
    b = hybrid_device_ids(list(reversed(recs)), (2, 2), (2, 1))
    np.testing.assert_array_equal(a, b)


def test_interleaved_process_ids():
    # Ids of one process need not be contiguous: process = id % 2.
    recs = [DeviceRecord(i, i % 2) for i in range(8)]
    ids = hybrid_device_ids(recs, (1, 4), (2, 1))
    np.testing.assert_array_equal(ids, [[0, 2, 4, 6], [1, 3, 5, 7]])


def test_slices_group_over_processes():
    # 2 slices, each of 2 processes x 2 devices: the DCN groups are slices.
    recs = [DeviceRecord(i, i // 2, i // 4) for i in range(8)]
    ids = hybrid_device_ids(recs, (1, 4), (2, 1))
    np.testing.assert_array_equal(ids, [[0, 1, 2, 3], [4, 5, 6, 7]])
    with pytest.raises(HybridMeshError, match=r"span 2 slices but dcn_mesh_shape is \(1, 1\)"):
        hybrid_device_ids(recs, (2, 4), (1, 1))


def test_processes_without_dcn_are_one_block():
    ids = hybrid_device_ids(_hosts(2, 4), (4, 2), (1, 1))
    np.testing.assert_array_equal(ids, np.arange(8).reshape(4, 2))


def test_granule_count_mismatch():
    with pytest.raises(HybridMeshError) as e:
        hybrid_device_ids(_hosts(4, 2), (1, 4), (2, 1))
    assert "asks for 2 groups of 4 devices but the runtime has 4 processes" in str(e.value)
    with pytest.raises(HybridMeshError, match="has 4 slices"):
        hybrid_device_ids(_hosts(4, 2, slices=True), (1, 4), (2, 1))


def test_uneven_granules():
    recs = [DeviceRecord(i, 0 if i < 3 else 1) for i in range(8)]
    with pytest.raises(HybridMeshError, match=r"process 0 has 3 devices but ici_mesh_shape \(1, 4\) needs 4"):
        hybrid_device_ids(recs, (1, 4), (2, 1))


def test_mixed_slice_info():
    recs = _hosts(2, 4, slices=True)
    recs[0] = recs[0]._replace(slice_index=None)
    with pytest.raises(HybridMeshError, match="some devices report a slice_index"):
        hybrid_device_ids(recs, (1, 4), (2, 1))


@dataclasses.dataclass(frozen=True)
class _FakeDevice:
    id: int
    process_index: int
    slice_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


@pytest.mark.parametrize(
    "n_gran, per, ici, dcn",
    [
        (2, 4, (1, 4), (2, 1)),
        (2, 4, (2, 2), (1, 2)),
        (4, 2, (2, 1, 1), (2, 1, 2)),
        (4, 4, (4, 1), (2, 2)),
        (8, 2, (1, 2), (8, 1)),
    ],
)
@pytest.mark.parametrize("granule", ["process", "slice"])
def test_matches_jax_create_hybrid_device_mesh(n_gran, per, ici, dcn, granule):
    """Same placement as jax's mesh_utils on (non-TPU) devices, for both granule kinds."""
    by_slice = granule == "slice"
    fakes = [
        _FakeDevice(id=g * 100 + k, process_index=g if not by_slice else g * per + k, slice_index=g)
        for g in range(n_gran)
        for k in range(per)
    ]
    expected = mesh_utils.create_hybrid_device_mesh(ici, dcn, fakes, process_is_granule=not by_slice)
    recs = [DeviceRecord(i, d.process_index, d.slice_index if by_slice else None) for i, d in enumerate(fakes)]
    ids = hybrid_device_ids(recs, ici, dcn)
    got = np.vectorize(lambda i: fakes[i], otypes=[object])(ids)
    assert got.shape == expected.shape
    assert (got == expected).all()
