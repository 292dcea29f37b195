"""Fingerprints: device and host agree, sharding does not matter, corruption shows."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmdtorch.checkpoint.fingerprint import device_fingerprints, fingerprint_numpy


def _ints(fps):
    return [tuple(int(v) for v in np.asarray(fp)) for fp in fps]


def _dev(x, sharding=None):
    arr = jnp.asarray(x) if sharding is None else jax.device_put(x, sharding)
    return _ints(device_fingerprints([arr]))[0]


@pytest.mark.parametrize(
    "dtype",
    [np.float32, ml_dtypes.bfloat16, np.float16, np.int8, np.uint8, np.int32, np.uint32, np.bool_, np.complex64],
)
def test_device_matches_host(dtype):
    rng = np.random.default_rng(0)
    xs = []
    for shape in [(), (7,), (8192,), (3, 5, 4), (0, 3)]:
        x = rng.standard_normal(shape) * 1000
        if dtype == np.complex64:
            x = x + 1j * rng.standard_normal(shape)
        xs.append(x.astype(dtype))
    want = [fingerprint_numpy(x) for x in xs]
    assert _ints(device_fingerprints([jnp.asarray(x) for x in xs])) == want


@pytest.mark.parametrize("shape", [(16, 24), (8, 512), (8, 8, 320), (8192,)])  # short rows, long rows, 3-D, 1-D rows
def test_independent_of_sharding(devices8, shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    mesh = jax.sharding.Mesh(np.array(devices8).reshape(4, 2), ("a", "b"))
    mesh4 = jax.sharding.Mesh(np.array(devices8[:4]), ("x",))
    want = fingerprint_numpy(x)
    specs = (
        [P("a", "b"), P("b", "a"), P(None, ("a", "b")), P(), P(("a", "b"))]
        if len(shape) > 1
        else [P(("a", "b")), P("a"), P()]
    )
    shardings = [NamedSharding(mesh, spec) for spec in specs] + [NamedSharding(mesh4, P("x"))]
    for sharding in shardings:
        assert _dev(x, sharding) == want, sharding


def test_padded_storage_hashes_the_logical_block(devices8):
    x = np.random.default_rng(2).standard_normal((10, 6)).astype(np.float32)
    mesh = jax.sharding.Mesh(np.array(devices8), ("x",))
    mesh2 = jax.sharding.Mesh(np.array(devices8).reshape(4, 2), ("a", "b"))
    # Padding of 9.0 (not zeros, so that hashing it would show): rows 10..15 over 8 devices, and
    # both dims, (12, 8), over a (4, 2) mesh.
    padded = np.pad(x, [(0, 6), (0, 0)], constant_values=9.0)
    padded2 = np.pad(x, [(0, 2), (0, 2)], constant_values=9.0)
    arrs = [
        jax.device_put(padded, NamedSharding(mesh, P("x"))),
        jax.device_put(padded2, NamedSharding(mesh2, P("a", "b"))),
    ]
    assert _ints(device_fingerprints(arrs, [(10, 6), (10, 6)])) == [fingerprint_numpy(x)] * 2


def test_host_handles_64_bit_words():
    x = np.arange(-5, 5, dtype=np.int64) * (2**40)
    fp = fingerprint_numpy(x)
    y = x.copy()
    y[3] += 2**33  # a change in the high word only
    assert fingerprint_numpy(y) != fp


def test_every_single_bit_flip_changes_it():
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    base = fingerprint_numpy(x)
    words = x.view(np.uint32)
    for i in range(0, 64, 7):
        for bit in (0, 13, 31):
            y = words.copy()
            y[i] ^= np.uint32(1 << bit)
            assert fingerprint_numpy(y.view(np.float32)) != base, (i, bit)


def test_swaps_and_sign_swaps_change_it():
    x = np.array([1.5, -1.5, 2.0, 3.0], np.float32)
    base = fingerprint_numpy(x)
    assert fingerprint_numpy(x[[1, 0, 2, 3]]) != base  # differ only in the sign bit
    assert fingerprint_numpy(x[[0, 1, 3, 2]]) != base
    assert fingerprint_numpy(x.reshape(2, 2).T.copy()) != base


def test_one_program_per_device_set(devices8):
    mesh4 = jax.sharding.Mesh(np.array(devices8[:4]), ("x",))
    a = np.ones((8, 2), np.float32)
    b = np.arange(6, dtype=np.int32)
    out = device_fingerprints([jax.device_put(a, NamedSharding(mesh4, P("x"))), jnp.asarray(b)])
    assert _ints(out) == [fingerprint_numpy(a), fingerprint_numpy(b)]
