"""Mesh.named_sharding / jax_partition_spec: PyTorch/XLA specs to JAX shardings."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmdtorch.mesh import Mesh, MeshError, PartitionSpecError


@pytest.fixture
def mesh(devices8):
    return Mesh(range(8), (2, 2, 2), ("data", "fsdp", "model"))


@pytest.mark.parametrize(
    "spec, expected",
    [
        ((0, None), P("data", None)),
        (("data", None), P("data", None)),
        ((None, "model"), P(None, "model")),
        ((("data", "fsdp"), None), P(("data", "fsdp"), None)),
        (((0, 2), 1), P(("data", "model"), "fsdp")),
        (((2, 0),), P(("model", "data"))),  # order in a tuple is kept
        ((("model",), None), P("model", None)),  # 1-tuples collapse to the name
        (((), None), P(None, None)),  # empty tuple = replicated
        ([("data", "fsdp", "model")], P(("data", "fsdp", "model"))),
        ((np.int64(1), None), P("fsdp", None)),
        ((), P()),
        ((None, None, None), P(None, None, None)),
    ],
)
def test_spec_translation(mesh, spec, expected):
    s = mesh.named_sharding(spec)
    assert isinstance(s, NamedSharding)
    assert s.mesh is mesh.jax_mesh
    assert s.spec == expected
    assert len(s.spec) == len(spec)  # one entry per tensor dim, always
    assert mesh.jax_partition_spec(spec) == expected


def test_same_spec_same_object(mesh):
    a = mesh.named_sharding(("data", None))
    assert mesh.named_sharding((0, None)) is a
    assert mesh.named_sharding(["data", None]) is a


def test_unnamed_mesh_uses_indices(devices8):
    mesh = Mesh(range(8), (4, 2))
    assert mesh.named_sharding((0, 1)).spec == P("axis_0", "axis_1")
    with pytest.raises(PartitionSpecError, match=r"partition_spec\[0\] = 'axis_0'.*axis_names=None"):
        mesh.named_sharding(("axis_0", None))


def test_sharding_places_data(mesh):
    x = np.arange(32.0).reshape(8, 4)
    arr = jax.device_put(x, mesh.named_sharding((("data", "fsdp"), "model")))
    assert arr.sharding.shard_shape(x.shape) == (2, 2)
    np.testing.assert_array_equal(np.asarray(arr), x)
    # Partial replication: axes left out of the spec replicate.
    arr = jax.device_put(x, mesh.named_sharding(("data", None)))
    assert arr.sharding.shard_shape(x.shape) == (4, 4)
    assert mesh.replicated().is_fully_replicated


def _err(mesh, spec, **kw) -> str:
    with pytest.raises(PartitionSpecError) as e:
        mesh.named_sharding(spec, **kw)
    assert isinstance(e.value, MeshError) and isinstance(e.value, ValueError)
    return str(e.value)


def test_unknown_axis_name(mesh):
    msg = _err(mesh, (None, "modle"))
    assert "partition_spec[1] = 'modle'" in msg
    assert "unknown mesh axis name 'modle'" in msg
    assert "0='data', 1='fsdp', 2='model'" in msg


def test_unknown_axis_index(mesh):
    msg = _err(mesh, (3, None))
    assert "partition_spec[0] = 3" in msg and "index 3 is out of range" in msg
    msg = _err(mesh, (None, -1))
    assert "partition_spec[1] = -1" in msg


def test_unknown_axis_inside_tuple(mesh):
    msg = _err(mesh, (("data", "x"),))
    assert "partition_spec[0] = ('data', 'x')" in msg and "'x'" in msg


def test_axis_used_twice(mesh):
    msg = _err(mesh, ("data", None, 0))
    assert "partition_spec[2] = 0" in msg
    assert "'data' (index 0)" in msg and "partition_spec[0] already uses" in msg
    msg = _err(mesh, (("fsdp", "fsdp"),))
    assert "partition_spec[0]" in msg and "the same entry already uses" in msg
    msg = _err(mesh, (("data", "model"), "model"))
    assert "partition_spec[1] = 'model'" in msg and "'model' (index 2)" in msg


@pytest.mark.parametrize(
    "spec, needle",
    [
        ((True, None), "got bool True"),
        ((1.0, None), "got float 1.0"),
        ((("data", ("fsdp",)),), "nests a tuple"),
        ((("data", None),), "contains None"),
        ("data", "did you mean ('data',)?"),
        (0, "did you mean (0,)?"),
        (None, "got NoneType None"),
    ],
)
def test_bad_entries(mesh, spec, needle):
    assert needle in _err(mesh, spec)


def test_rank_check(mesh):
    msg = _err(mesh, ("data", None), ndim=3)
    assert "has 2 entries but the tensor has 3 dims" in msg
    assert mesh.named_sharding(("data", None), ndim=2).spec == P("data", None)
