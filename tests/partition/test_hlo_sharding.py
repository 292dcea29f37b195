"""hlo_sharding_string / parse_hlo_sharding_string / sharding_type_of.

Every expected string is written out by hand from the mesh layout (device at
mesh position (r, c) of a row-major (R, C) mesh is ``r * C + c``), the way
PyTorch/XLA's tests spell them, never computed with the code under test.
"""

import doctest
from types import SimpleNamespace

import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, make_single_device_sharding
from jax.sharding import PartitionSpec as P

from spmdtorch.sharding import (
    HloShardingError,
    ParsedHloSharding,
    ShardingType,
    hlo_sharding_string,
    logical_device_order,
    parse_hlo_sharding_string,
    sharding_type_of,
)
from spmdtorch.sharding import _hlo_sharding as hlo_sharding
from spmdtorch.sharding import _sharding_type as sharding_enum
from spmdtorch.sharding import _visualize as visualize


@pytest.fixture
def mesh24(devices8):
    return Mesh(np.array(devices8).reshape(2, 4), ("x", "y"))


@pytest.fixture
def mesh42(devices8):
    return Mesh(np.array(devices8).reshape(4, 2), ("data", "model"))


# ---------------------------------------------------------------- strings


@pytest.mark.parametrize(
    "spec, ndim, expected",
    [
        # Fully tiled 2-D: row-major mesh order.
        (P("x", "y"), 2, "{devices=[2,4]0,1,2,3,4,5,6,7}"),
        # Axes swapped: tile (i, j) lives on mesh[j, i] = 4*j + i.
        (P("y", "x"), 2, "{devices=[4,2]0,4,1,5,2,6,3,7}"),
        # Row-wise over both axes (x major), column-wise over both.
        (P(("x", "y")), 2, "{devices=[8,1]0,1,2,3,4,5,6,7}"),
        (P(None, ("x", "y")), 2, "{devices=[1,8]0,1,2,3,4,5,6,7}"),
        # y major: tile k = 2*iy + ix on mesh[ix, iy] = 4*ix + iy.
        (P(("y", "x")), 2, "{devices=[8,1]0,4,1,5,2,6,3,7}"),
        # Partial: rows over x, replicas over y (tile i holds mesh row i).
        (P("x", None), 2, "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        (P("x"), 2, "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        # Partial: columns over y, replicas over x (tile j holds mesh column j).
        (P(None, "y"), 2, "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
        (P("y"), 2, "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
        (P(), 2, "{replicated}"),
        (P(None, None), 2, "{replicated}"),
        # 1-D tensors.
        (P(("x", "y")), 1, "{devices=[8]0,1,2,3,4,5,6,7}"),
        (P("x"), 1, "{devices=[2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        # Rank 3 with a shorter spec: trailing dims unsharded.
        (P("x", "y"), 3, "{devices=[2,4,1]0,1,2,3,4,5,6,7}"),
        (P(None, "x", "y"), 3, "{devices=[1,2,4]0,1,2,3,4,5,6,7}"),
        (P(None, None, "y"), 3, "{devices=[1,1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
        (P("y", None, "x"), 3, "{devices=[4,1,2]0,4,1,5,2,6,3,7}"),
        # Scalars can only be replicated.
        (P(), 0, "{replicated}"),
    ],
)
def test_strings_on_2x4_mesh(mesh24, spec, ndim, expected):
    assert hlo_sharding_string(NamedSharding(mesh24, spec), ndim) == expected


@pytest.mark.parametrize(
    "spec, expected",
    [
        (P("data", "model"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
        # Rows over data, replicas over model: tile i holds mesh row i = 2i, 2i+1.
        (P("data", None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
        # Columns over model, replicas over data: tile j holds 2r + j, r = 0..3.
        (P(None, "model"), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
        (P("model", "data"), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    ],
)
def test_strings_on_4x2_mesh(mesh42, spec, expected):
    assert hlo_sharding_string(NamedSharding(mesh42, spec), 2) == expected


def test_pytorch_xla_data_parallel_mesh(devices8):
    # PyTorch/XLA's user guide: mesh_shape = (num_devices, 1), spec (0, None);
    # the size-1 'model' axis adds no replication.
    mesh = Mesh(np.array(devices8).reshape(8, 1), ("data", "model"))
    assert hlo_sharding_string(NamedSharding(mesh, P("data", None)), 2) == ("{devices=[8,1]0,1,2,3,4,5,6,7}")
    assert hlo_sharding_string(NamedSharding(mesh, P("data", "model")), 2) == ("{devices=[8,1]0,1,2,3,4,5,6,7}")
    assert hlo_sharding_string(NamedSharding(mesh, P(None, "model")), 2) == "{replicated}"


def test_permuted_device_order_prints_ordinals_not_mesh_positions(devices8):
    # JAX numbers HLO devices by mesh position (iota 0..7); the string must
    # name the devices actually there.
    mesh = Mesh(np.array(devices8[::-1]), ("x",))
    assert hlo_sharding_string(NamedSharding(mesh, P("x")), 1) == "{devices=[8]7,6,5,4,3,2,1,0}"
    perm = [devices8[i] for i in (0, 2, 4, 6, 1, 3, 5, 7)]
    mesh = Mesh(np.array(perm).reshape(2, 4), ("x", "y"))
    assert hlo_sharding_string(NamedSharding(mesh, P("x", "y")), 2) == ("{devices=[2,4]0,2,4,6,1,3,5,7}")
    assert hlo_sharding_string(NamedSharding(mesh, P("y")), 2) == (
        "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    )


def test_sub_mesh_keeps_global_ordinals(devices8):
    mesh = Mesh(np.array(devices8[4:]).reshape(2, 2), ("x", "y"))
    assert hlo_sharding_string(NamedSharding(mesh, P("x", "y")), 2) == "{devices=[2,2]4,5,6,7}"
    assert hlo_sharding_string(NamedSharding(mesh, P("x")), 2) == ("{devices=[2,1,2]4,5,6,7 last_tile_dim_replicate}")


def test_explicit_device_order(mesh24, devices8):
    # Ordinal i is device_order[i]: reversing the order renumbers d -> 7 - d.
    s = hlo_sharding_string(NamedSharding(mesh24, P("x", "y")), 2, device_order=devices8[::-1])
    assert s == "{devices=[2,4]7,6,5,4,3,2,1,0}"
    with pytest.raises(HloShardingError, match="not in device_order"):
        hlo_sharding_string(NamedSharding(mesh24, P("x")), 2, device_order=devices8[:4])
    with pytest.raises(HloShardingError, match="twice"):
        hlo_sharding_string(NamedSharding(mesh24, P()), 2, device_order=devices8 + devices8[:1])


def test_single_device_is_maximal(devices8):
    mesh = Mesh(np.array(devices8[3:4]), ("x",))
    assert hlo_sharding_string(NamedSharding(mesh, P("x")), 2) == "{maximal device=3}"
    # (make_single_device_sharding: jax 0.12 deprecates constructing SingleDeviceSharding directly)
    assert hlo_sharding_string(make_single_device_sharding(devices8[5]), 2) == "{maximal device=5}"
    assert sharding_type_of(make_single_device_sharding(devices8[5]), 2) is ShardingType.MAXIMAL


def test_manual_axes(devices8):
    manual = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Manual,) * 2)
    assert hlo_sharding_string(NamedSharding(manual, P()), 2) == "{manual}"
    assert sharding_type_of(NamedSharding(manual, P()), 2) is ShardingType.MANUAL
    mixed = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Manual, AxisType.Auto))
    # Tiled over y (4), manual subgroup over x (2): tile j, group r on 4r + j.
    assert hlo_sharding_string(NamedSharding(mixed, P("y")), 2) == (
        "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dims={manual}}"
    )
    assert sharding_type_of(NamedSharding(mixed, P("y")), 2) is ShardingType.MANUAL


def test_bad_inputs(mesh24):
    with pytest.raises(HloShardingError, match="rank 1"):
        hlo_sharding_string(NamedSharding(mesh24, P("x", "y")), 1)
    with pytest.raises(HloShardingError, match=">= 0"):
        hlo_sharding_string(NamedSharding(mesh24, P()), -1)
    with pytest.raises(TypeError, match="ndim must be an int"):
        hlo_sharding_string(NamedSharding(mesh24, P()), 2.0)
    with pytest.raises(TypeError, match="jax.sharding.Sharding"):
        hlo_sharding_string(P("x"), 2)


def test_logical_order_is_dense_across_processes():
    # Process 1's CPU devices have JAX ids from 2048; they become ordinals 4..7.
    devs = [SimpleNamespace(id=i, process_index=0) for i in (3, 1, 0, 2)]
    devs += [SimpleNamespace(id=2048 + i, process_index=1) for i in (2, 0, 3, 1)]
    order = logical_device_order(devs[::-1])
    assert [d.id for d in order] == [0, 1, 2, 3, 2048, 2049, 2050, 2051]
    ordinals = hlo_sharding._ordinal_map([devs[4], devs[2], devs[5]], order)  # ids 2050, 0, 2048
    assert ordinals == [6, 0, 4]


def test_default_order_is_jax_id_order_on_one_process(devices8):
    assert logical_device_order() == sorted(devices8, key=lambda d: d.id)


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "text, expected",
    [
        ("{devices=[4,1]0,1,2,3}", ((4, 1), (0, 1, 2, 3), False)),
        (
            "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
            ((2, 1, 2), (0, 1, 2, 3), True),
        ),
        ("{replicated}", ((), (), False)),
        ("{maximal device=12}", ((), (12,), False)),
        ("  { devices=[2, 2] 3, 12, 0, 1 }  ", ((2, 2), (3, 12, 0, 1), False)),
        # JAX's iota form: <=[8] is 0..7; <=[2,4]T(1,0) is arange(8).reshape(2,4).T.
        ("{devices=[4,2]<=[8]}", ((4, 2), (0, 1, 2, 3, 4, 5, 6, 7), False)),
        (
            "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
            ((4, 1, 2), (0, 4, 1, 5, 2, 6, 3, 7), True),
        ),
    ],
)
def test_parse(text, expected):
    parsed = parse_hlo_sharding_string(text)
    assert isinstance(parsed, ParsedHloSharding)
    tile_dims, devices, replicate = parsed  # unpacks as a 3-tuple
    assert (tile_dims, devices, replicate) == expected


def test_parse_sixteen_devices():
    text = "{devices=[4,4]" + ",".join(str(i) for i in range(16)) + "}"
    parsed = parse_hlo_sharding_string(text)
    assert parsed.tile_dims == (4, 4)
    assert parsed.devices == tuple(range(16))
    assert parsed.device_grid()[3].tolist() == [12, 13, 14, 15]
    assert parsed.tensor_rank == 2


def test_parsed_properties():
    assert parse_hlo_sharding_string("{replicated}").is_replicated
    assert parse_hlo_sharding_string("{maximal device=0}").is_maximal
    p = parse_hlo_sharding_string("{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}")
    assert p.tensor_rank == 2 and not p.is_replicated and not p.is_maximal
    assert p.device_grid()[1, 0].tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize(
    "spec, ndim",
    [
        (P("x", "y"), 2),
        (P("y", "x"), 2),
        (P(("y", "x")), 2),
        (P("x"), 2),
        (P(None, "y"), 2),
        (P(None, None, "y"), 3),
        (P(), 2),
    ],
)
def test_round_trip(mesh24, spec, ndim):
    sharding = NamedSharding(mesh24, spec)
    text = hlo_sharding_string(sharding, ndim)
    tile_dims, devices, replicate = parse_hlo_sharding_string(text)
    hlo = sharding._to_xla_hlo_sharding(ndim)  # mesh24 is in jax id order
    if hlo.is_replicated():
        assert (tile_dims, devices, replicate) == ((), (), False)
    else:
        assert list(tile_dims) == hlo.tile_assignment_dimensions()
        assert list(devices) == hlo.tile_assignment_devices()
        assert replicate == hlo.replicate_on_last_tile_dim()
    # Formatting the parsed pieces gives the same string back.
    if tile_dims:
        assert hlo_sharding._format_tiled(tile_dims, devices, replicate) == text


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "expected '{replicated}'"),
        ("replicated", "expected '{replicated}'"),
        ("{devices=[4,1]0,1,2}", r"need 4 devices, got 3"),
        ("{devices=[2,2]0,1,1,3}", "listed twice"),
        ("{devices=[0,2]}", "expected"),
        ("{devices=[2,0]0,1}", ">= 1"),
        ("{devices=[2,2]0,1,2,3", "expected"),
        ("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicated}", "expected"),
        ("{devices=[2,2]0,1,2,3 last_tile_dims={manual}}", "manual/unreduced"),
        ("{manual}", "manual/unreduced"),
        ("{devices=[4]<=[2,2]T(0,0)}", "not a permutation"),
        ("{maximal device=-1}", "expected"),
    ],
)
def test_parse_errors_name_the_string(text, match):
    with pytest.raises(HloShardingError, match=match) as info:
        parse_hlo_sharding_string(text)
    assert repr(text) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_parse_rejects_non_strings():
    with pytest.raises(TypeError, match="HLO sharding string"):
        parse_hlo_sharding_string(None)


# ---------------------------------------------------------------- types


@pytest.mark.parametrize(
    "spec, ndim, expected",
    [
        (P(), 2, ShardingType.REPLICATED),
        (P("x", "y"), 2, ShardingType.TILED),
        (P(("x", "y")), 2, ShardingType.TILED),
        (P("x"), 2, ShardingType.PARTIAL),
        (P(None, "y"), 3, ShardingType.PARTIAL),
    ],
)
def test_sharding_type(mesh24, spec, ndim, expected):
    assert sharding_type_of(NamedSharding(mesh24, spec), ndim) is expected


def test_sharding_type_ignores_size_one_axes(devices8):
    mesh = Mesh(np.array(devices8).reshape(8, 1), ("data", "model"))
    # PyTorch/XLA's string for this is plain tiled, so is the type.
    assert sharding_type_of(NamedSharding(mesh, P("data", None)), 2) is ShardingType.TILED
    assert sharding_type_of(NamedSharding(mesh, P(None, "model")), 2) is ShardingType.REPLICATED


def test_unreduced_is_unknown(devices8):
    mesh = Mesh(np.array(devices8).reshape(2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    sharding = NamedSharding(mesh, P(None, unreduced={"x"}))
    assert sharding_type_of(sharding, 2) is ShardingType.UNKNOWN
    assert "last_tile_dims={unreduced, replicated}" in hlo_sharding_string(sharding, 2)


def test_sharding_type_values_match_pytorch_xla():
    # torch_xla's ShardingType values (they follow xla::OpSharding::Type).
    assert {t.name: int(t) for t in ShardingType} == {
        "REPLICATED": 0,
        "MAXIMAL": 1,
        "TUPLE": 2,
        "TILED": 3,
        "MANUAL": 4,
        "PARTIAL": 5,
        "UNKNOWN": 6,
    }


# ---------------------------------------------------------------- docs


@pytest.mark.parametrize("module", [hlo_sharding, sharding_enum, visualize])
def test_docstring_examples_run(module, devices8, monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    result = doctest.testmod(module, raise_on_error=False, verbose=False)
    assert result.failed == 0
    assert result.attempted > 0
