"""Mesh: construction, validation messages, value semantics, JAX mapping."""

from __future__ import annotations

import collections
import copy
import pickle

import jax
import numpy as np
import pytest

from spmdtorch.mesh import (
    AxisNamesError,
    DeviceIdsError,
    HybridMesh,
    Mesh,
    MeshError,
    MeshShapeError,
    UnknownAxisError,
    global_devices,
)


@pytest.fixture(autouse=True)
def _eight(devices8):
    return devices8


# ---------------------------------------------------------------- construction


def test_pytorch_xla_doc_example():
    mesh = Mesh(np.array(range(8)), (4, 2), ("x", "y"))
    np.testing.assert_array_equal(mesh.get_logical_mesh(), [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert mesh.shape() == collections.OrderedDict([("x", 4), ("y", 2)])
    assert isinstance(mesh.shape(), collections.OrderedDict)
    assert mesh.size() == 8 and type(mesh.size()) is int
    assert mesh.mesh_shape == (4, 2)
    assert mesh.axis_names == ("x", "y")
    assert mesh.get_axis_name_idx("x") == 0
    assert mesh.get_axis_name_idx("y") == 1


@pytest.mark.parametrize(
    "ids",
    [
        list(range(8)),
        tuple(range(8)),
        range(8),
        np.arange(8),
        np.arange(8, dtype=np.int32),
        np.arange(8, dtype=np.uint8),
        [np.int64(i) for i in range(8)],
    ],
    ids=["list", "tuple", "range", "int64", "int32", "uint8", "np-scalars"],
)
def test_device_ids_accepted_forms(ids):
    mesh = Mesh(ids, [2, 4], ["a", "b"])  # lists for shape/names are fine too
    assert mesh.mesh_shape == (2, 4) and mesh.axis_names == ("a", "b")
    assert mesh.device_ids.tolist() == list(range(8))
    assert mesh == Mesh(range(8), (2, 4), ("a", "b"))


def test_permuted_ids_logical_mesh():
    perm = [3, 1, 7, 5, 0, 2, 6, 4]
    mesh = Mesh(perm, (2, 4))
    np.testing.assert_array_equal(mesh.get_logical_mesh(), np.array(perm).reshape(2, 4))


def test_unnamed_mesh_matches_pytorch_xla():
    mesh = Mesh(range(8), (2, 4))
    assert mesh.axis_names is None
    # PyTorch/XLA keys shape() by axis index when the mesh has no names.
    assert mesh.shape() == collections.OrderedDict([(0, 2), (1, 4)])
    assert mesh.jax_axis_names == ("axis_0", "axis_1")
    assert mesh.jax_mesh.axis_names == ("axis_0", "axis_1")
    assert mesh.get_axis_name_idx(1) == 1
    with pytest.raises(UnknownAxisError, match=r"axis_names=None.*indices 0\.\.1"):
        mesh.get_axis_name_idx("axis_0")


def test_get_logical_mesh_is_a_copy():
    mesh = Mesh(range(8), (8,))
    lm = mesh.get_logical_mesh()
    lm[0] = 99
    assert mesh.get_logical_mesh()[0] == 0


def test_get_axis_name_idx_unknown_lists_valid_names():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    with pytest.raises(UnknownAxisError) as e:
        mesh.get_axis_name_idx("modle")
    msg = str(e.value)
    assert "'modle'" in msg and "0='data'" in msg and "1='model'" in msg
    with pytest.raises(UnknownAxisError, match="index 2 is out of range"):
        mesh.get_axis_name_idx(2)
    assert isinstance(e.value, MeshError) and isinstance(e.value, ValueError)


# ------------------------------------------------------------------ validation


def _msg(exc_type, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as e:
        Mesh(*args, **kwargs)
    assert isinstance(e.value, MeshError) and isinstance(e.value, ValueError)
    return str(e.value)


def test_shape_product_mismatch_message():
    msg = _msg(MeshShapeError, range(8), (2, 2))
    assert msg == (
        "mesh_shape (2, 2) has 4 devices but device_ids has 8 (and the runtime has 8 "
        "devices); use a mesh_shape whose product is 8"
    )


def test_mesh_must_span_all_devices():
    msg = _msg(MeshShapeError, range(4), (2, 2))
    assert "cover 4 devices but the runtime has 8" in msg
    assert "device_ids=range(8)" in msg
    msg = _msg(MeshShapeError, range(4), (2, 4))
    assert "mesh_shape (2, 4) has 8 devices but device_ids has 4" in msg
    assert "use 8 device_ids" in msg


def test_duplicate_ids():
    msg = _msg(DeviceIdsError, [0, 1, 2, 3, 3, 5, 6, 7], (8,))
    assert "repeats 3 (2 times)" in msg and "permutation of 0..7" in msg


def test_out_of_range_ids():
    msg = _msg(DeviceIdsError, [0, 1, 2, 3, 4, 5, 6, 2048], (8,))
    assert "2048" in msg and "outside 0..7" in msg and "not jax Device.id" in msg
    msg = _msg(DeviceIdsError, [-1, 1, 2, 3, 4, 5, 6, 7], (8,))
    assert "-1" in msg and "outside 0..7" in msg


@pytest.mark.parametrize(
    "ids, needle",
    [
        ([0.0, 1, 2, 3, 4, 5, 6, 7], "device_ids[0] must be an int"),
        ([0, 1, 2, 3, 4, 5, 6, True], "device_ids[7] must be an int"),
        (np.arange(8.0), "dtype float64"),
        (np.arange(8).reshape(4, 2), "shape (4, 2); pass device_ids.ravel()"),
        ("01234567", "got str"),
        (set(range(8)), "ordered list"),
        (8, "got int 8"),
    ],
)
def test_bad_device_ids(ids, needle):
    assert needle in _msg(DeviceIdsError, ids, (8,))


def test_jax_devices_as_ids_get_a_hint():
    assert "not jax Device objects" in _msg(DeviceIdsError, jax.devices(), (8,))


@pytest.mark.parametrize(
    "shape, needle",
    [
        (8, "got the int 8; use (8,)"),
        ("8", "got str"),
        ((), "at least one axis"),
        ((8, 0), "mesh_shape[1] must be >= 1"),
        ((2.0, 4), "mesh_shape[0] must be an int"),
        ((-2, -4), "mesh_shape[0] must be >= 1"),
    ],
)
def test_bad_mesh_shape(shape, needle):
    assert needle in _msg(MeshShapeError, range(8), shape)


@pytest.mark.parametrize(
    "names, needle",
    [
        ("data", "got the string 'data'; use ('data',)"),
        (("a",), "has 1 names but mesh_shape (4, 2) has 2 axes"),
        (("a", "b", "c"), "has 3 names"),
        (("a", "a"), "repeats 'a'"),
        (("a", ""), "axis_names[1] must be a non-empty str"),
        (("a", 1), "axis_names[1] must be a non-empty str, got int 1"),
        (42, "got int 42"),
    ],
)
def test_bad_axis_names(names, needle):
    assert needle in _msg(AxisNamesError, range(8), (4, 2), names)


# ------------------------------------------------------------- value semantics


def test_equality_and_hash():
    a = Mesh(range(8), (4, 2), ("x", "y"))
    b = Mesh(np.arange(8), [4, 2], ["x", "y"])
    assert a == b and hash(a) == hash(b) and a is not b
    assert len({a, b}) == 1
    assert a != Mesh(range(8), (4, 2), ("x", "z"))
    assert a != Mesh(range(8), (4, 2))  # unnamed is not the same as named
    assert a != Mesh(range(8), (2, 4), ("x", "y"))
    assert a != Mesh([1, 0, 2, 3, 4, 5, 6, 7], (4, 2), ("x", "y"))
    assert a != "not a mesh"
    assert {a: 1}[b] == 1


def test_hybrid_equals_plain_mesh():
    h = HybridMesh(ici_mesh_shape=(4, 2), axis_names=("x", "y"))
    m = Mesh(range(8), (4, 2), ("x", "y"))
    assert h == m and m == h and hash(h) == hash(m)


def test_immutable():
    mesh = Mesh(range(8), (4, 2), ("x", "y"))
    for attr in ("mesh_shape", "axis_names", "device_ids", "jax_mesh", "_mesh_shape", "new_attr"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(mesh, attr, None)
    with pytest.raises(AttributeError, match="immutable"):
        del mesh.mesh_shape
    with pytest.raises(ValueError):
        mesh.device_ids[0] = 5  # read-only array
    assert not mesh.devices.flags.writeable
    assert isinstance(mesh.mesh_shape, tuple) and isinstance(mesh.axis_names, tuple)
    assert mesh.device_ids.tolist() == list(range(8))


def test_copy_and_pickle():
    mesh = Mesh([7, 6, 5, 4, 3, 2, 1, 0], (2, 4), ("a", "b"))
    assert copy.copy(mesh) is mesh and copy.deepcopy(mesh) is mesh
    again = pickle.loads(pickle.dumps(mesh))
    assert again == mesh and again.jax_mesh == mesh.jax_mesh
    h = HybridMesh(ici_mesh_shape=(2, 4), dcn_mesh_shape=(1, 1), axis_names=("a", "b"))
    h2 = pickle.loads(pickle.dumps(h))
    assert type(h2) is HybridMesh and h2 == h and h2.ici_mesh_shape == (2, 4)


def test_repr():
    assert repr(Mesh(range(8), (4, 2), ("x", "y"))) == (
        "Mesh(device_ids=range(8), mesh_shape=(4, 2), axis_names=('x', 'y'))"
    )
    perm = [1, 0, 2, 3, 4, 5, 6, 7]
    r = repr(Mesh(perm, (8,)))
    assert r == "Mesh(device_ids=[1, 0, 2, 3, 4, 5, 6, 7], mesh_shape=(8,), axis_names=None)"
    # The repr is valid constructor syntax.
    assert eval(r, {"Mesh": Mesh}) == Mesh(perm, (8,))


# ---------------------------------------------------------------- JAX mapping


def test_logical_order_is_process_then_id():
    devs = global_devices()
    assert devs == sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    assert [d.id for d in devs] == list(range(8))  # one process, cpu:0..7


def test_jax_mesh_identity_layout():
    mesh = Mesh(range(8), (4, 2), ("data", "model"))
    jm = mesh.jax_mesh
    assert isinstance(jm, jax.sharding.Mesh)
    assert jm.axis_names == ("data", "model")
    assert dict(jm.shape) == {"data": 4, "model": 2}
    assert all(t == jax.sharding.AxisType.Auto for t in jm.axis_types)
    assert mesh.devices.shape == (4, 2)
    assert [[d.id for d in row] for row in mesh.devices] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_jax_mesh_with_permuted_ids():
    perm = [5, 2, 7, 0, 1, 6, 3, 4]
    mesh = Mesh(perm, (2, 4), ("x", "y"))
    devs = global_devices()
    expected = np.array([devs[i] for i in perm], dtype=object).reshape(2, 4)
    assert (mesh.jax_mesh.devices == expected).all()
    assert mesh.jax_mesh == jax.sharding.Mesh(expected, ("x", "y"))
    # Data follows the mapping: row-shard 8 rows over x*y; row k lands on perm[k].
    arr = jax.device_put(np.arange(8), mesh.named_sharding((("x", "y"),)))
    placed = {int(s.data[0]): s.device.id for s in arr.addressable_shards}
    assert placed == {k: perm[k] for k in range(8)}
