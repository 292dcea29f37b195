"""get_1d_mesh, set_global_mesh, get_global_mesh."""

from __future__ import annotations

import threading

import jax
import pytest

from spmdtorch.mesh import Mesh, get_1d_mesh, get_global_mesh, set_global_mesh


@pytest.fixture(autouse=True)
def _clean_global(devices8):
    set_global_mesh(None)
    yield
    set_global_mesh(None)


def test_get_1d_mesh():
    m = get_1d_mesh("data")
    assert m == Mesh(range(8), (8,), ("data",))
    assert m.mesh_shape == (8,) and m.axis_names == ("data",)
    u = get_1d_mesh()
    assert u.axis_names is None and u.shape() == {0: 8}
    assert u.named_sharding((0, None)).spec == jax.sharding.PartitionSpec("axis_0", None)


def test_global_mesh_roundtrip():
    assert get_global_mesh() is None
    m = get_1d_mesh("fsdp")
    set_global_mesh(m)
    assert get_global_mesh() is m
    set_global_mesh(None)
    assert get_global_mesh() is None


def test_set_global_mesh_type_checked():
    jm = get_1d_mesh("x").jax_mesh
    with pytest.raises(TypeError, match=r"expects a spmdtorch.mesh.Mesh.*jax\..*Mesh"):
        set_global_mesh(jm)
    with pytest.raises(TypeError, match="got builtins.tuple"):
        set_global_mesh((8,))
    assert get_global_mesh() is None


def test_global_mesh_visible_across_threads():
    m = get_1d_mesh("d")
    set_global_mesh(m)
    seen = []
    t = threading.Thread(target=lambda: seen.append(get_global_mesh()))
    t.start()
    t.join()
    assert seen == [m]
