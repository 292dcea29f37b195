"""Fuzzed ``Mesh`` / ``HybridMesh`` constructors: a mesh exactly when the arguments are valid, else a MeshError.

The validity oracle is written out here from the documented rules (device ids:
a permutation of 0..7, ints only; shape: positive ints whose product is 8;
names: None or one unique non-empty str per axis), and every built mesh is
checked against its arguments.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from fuzz_strategies import NUM_DEVICES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spmdtorch.mesh import HybridMesh, Mesh, MeshError

FAST = settings(
    max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(max_examples=1000, deadline=None, database=None, suppress_health_check=list(HealthCheck))

_JUNK = (None, "0", 1.0, True, object())


def _ids() -> st.SearchStrategy[Any]:
    perm = st.permutations(range(NUM_DEVICES))
    return st.one_of(
        perm.map(list),
        perm.map(np.array),
        perm.map(tuple),
        st.lists(st.integers(-2, 9), min_size=0, max_size=10),  # repeats, out of range, wrong count
        perm.map(lambda p: np.array(p).reshape(2, 4)),  # not flat
        perm.map(lambda p: [float(i) for i in p]),
        perm.map(set),  # unordered
        st.sampled_from(_JUNK),
    )


def _shape() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(st.integers(-1, 8), min_size=0, max_size=4).map(tuple),
        st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=4).map(tuple),
        st.integers(0, 8),
        st.sampled_from(_JUNK + ((2.0, 4),)),
    )


def _names(n_max: int = 5) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.lists(st.sampled_from(["a", "b", "c", "", "data"]), min_size=0, max_size=n_max).map(tuple),
        st.lists(st.sampled_from(["a", 1, None]), min_size=1, max_size=n_max).map(tuple),
        st.sampled_from(["ab", 3]),
    )


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _valid_shape(shape: Any) -> bool:
    return (
        isinstance(shape, tuple)
        and len(shape) > 0
        and all(_is_int(s) and s >= 1 for s in shape)
        and math.prod(shape) == NUM_DEVICES
    )


def _valid_names(names: Any, n_axes: int) -> bool:
    if names is None:
        return True
    return (
        isinstance(names, tuple)
        and len(names) == n_axes
        and all(isinstance(n, str) and n for n in names)
        and len(set(names)) == len(names)
    )


def _valid_ids(ids: Any) -> bool:
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1:
            return False
        ids = ids.tolist()
    if not isinstance(ids, (list, tuple)):
        return False
    return all(_is_int(i) for i in ids) and sorted(ids) == list(range(NUM_DEVICES))


def _check_mesh(ids: Any, shape: Any, names: Any) -> None:
    valid = _valid_ids(ids) and _valid_shape(shape) and _valid_names(names, len(shape))
    try:
        mesh = Mesh(ids, shape, names)
    except MeshError as e:
        assert not valid, f"valid Mesh({ids!r}, {shape!r}, {names!r}) refused: {e}"
        return
    assert valid, f"invalid Mesh({ids!r}, {shape!r}, {names!r}) accepted"
    assert mesh.mesh_shape == tuple(shape) and mesh.size() == NUM_DEVICES
    assert mesh.axis_names == names
    assert np.array_equal(mesh.get_logical_mesh(), np.asarray(list(ids)).reshape(shape))
    assert mesh == Mesh(list(ids), shape, names) and hash(mesh) == hash(Mesh(list(ids), shape, names))
    # The jax mesh holds device ordinal ids[k] at flat position k.
    flat = [d.id for d in mesh.jax_mesh.devices.flat]
    assert flat == [int(i) for i in ids]


@FAST
@given(ids=_ids(), shape=_shape(), names=_names())
def test_mesh_constructor(devices8, ids, shape, names):
    _check_mesh(ids, shape, names)


@pytest.mark.slow
@SLOW
@given(ids=_ids(), shape=_shape(), names=_names())
def test_mesh_constructor_slow(devices8, ids, shape, names):
    _check_mesh(ids, shape, names)


def _check_hybrid(ici: Any, dcn: Any, names: Any) -> None:
    # One process, no slices: a DCN product > 1 has no second host to go to.
    dcn_ok = dcn is None or (
        isinstance(dcn, tuple) and all(_is_int(d) and d >= 1 for d in dcn) and math.prod(dcn) == 1 and len(dcn) > 0
    )
    ici_ok = _valid_shape(ici)
    valid = ici_ok and dcn_ok and (dcn is None or len(dcn) == len(ici)) and _valid_names(names, len(ici))
    try:
        mesh = HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, axis_names=names)
    except MeshError as e:
        assert not valid, f"valid HybridMesh({ici!r}, {dcn!r}, {names!r}) refused: {e}"
        return
    assert valid, f"invalid HybridMesh({ici!r}, {dcn!r}, {names!r}) accepted"
    assert mesh == Mesh(range(NUM_DEVICES), ici, names)


@FAST
@given(ici=_shape(), dcn=st.one_of(st.none(), _shape()), names=_names())
def test_hybrid_mesh_constructor(devices8, ici, dcn, names):
    _check_hybrid(ici, dcn, names)


@pytest.mark.slow
@SLOW
@given(ici=_shape(), dcn=st.one_of(st.none(), _shape()), names=_names())
def test_hybrid_mesh_constructor_slow(devices8, ici, dcn, names):
    _check_hybrid(ici, dcn, names)
