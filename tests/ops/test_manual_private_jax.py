"""spmdtorch.ops.manual: the JAX primitives behind PyTorch/XLA's full_to_shard / shard_to_full, in pure JAX.

The module reads one JAX private name; these tests fail loudly when a JAX
upgrade moves it, and check the values of a program that works on each
device's block between the two ends against numpy doing the same per block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmdtorch.ops import manual


@pytest.fixture
def mesh(devices8):
    return jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))


def test_private_jax_name_is_there():
    manual.check_private_jax()  # raises ImportError naming what moved


def test_a_moved_private_name_is_named(monkeypatch):
    # The base class (a C++ type) keeps its own; None stands in for a JAX without the method.
    monkeypatch.setattr(jax.sharding.NamedSharding, "_to_xla_hlo_sharding", None)
    with pytest.raises(ImportError, match="NamedSharding._to_xla_hlo_sharding"):
        manual.check_private_jax()


def _per_block(fn, x, rows, cols):
    """numpy: ``fn`` applied to each (rows x cols) grid block of ``x``, reassembled."""
    out = np.empty_like(x)
    for rb in np.split(np.arange(x.shape[0]), rows):
        for cb in np.split(np.arange(x.shape[1]), cols):
            out[np.ix_(rb, cb)] = fn(x[np.ix_(rb, cb)])
    return out


def test_full_to_shard_local_op_shard_to_full_equals_per_block_numpy(mesh):
    s = NamedSharding(mesh, P("a", "b"))
    data = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32)
    x = jax.device_put(data, s)
    local = manual.local_shape(x.shape, s)
    assert local == (3, 2)

    def f(x):
        block = manual.full_to_shard(x, sharding=s, local=local)
        # A cumulative sum is not elementwise: on blocks it differs from the global one.
        y = jnp.cumsum(block, axis=1) * 2.0
        return manual.shard_to_full(y, sharding=s, full=x.shape)

    out = np.asarray(jax.jit(f)(x))
    np.testing.assert_allclose(out, _per_block(lambda b: np.cumsum(b, axis=1) * 2.0, data, 2, 4), rtol=1e-6)
    assert not np.allclose(out, np.cumsum(data, axis=1) * 2.0)


def test_hlo_holds_xla_custom_calls(mesh):
    s = NamedSharding(mesh, P(None, "b"))
    x = jax.device_put(np.zeros((4, 8), np.float32), s)

    def f(x):
        block = manual.full_to_shard(x, sharding=s, local=(4, 2))
        return manual.shard_to_full(manual.mark_manual(block + 1), sharding=s, full=(4, 8))

    hlo = jax.jit(f).lower(x).as_text(dialect="hlo")
    assert "f32[4,2]{1,0} custom-call(" in hlo
    assert 'custom_call_target="SPMDFullToShardShape", sharding={manual}' in hlo
    assert 'custom_call_target="SPMDShardToFullShape", sharding={devices=[1,4,2]' in hlo
    assert hlo.count("sharding={manual}") >= 3  # the entry, mark_manual, and the exit's own Sharding call


def test_mark_manual_then_shard_to_full_replicated(mesh):
    # Every device holds the same value: leaving manual sharding as replicated gives it back.
    s = NamedSharding(mesh, P())
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    x = jax.device_put(data, s)

    def f(x):
        return manual.shard_to_full(manual.mark_manual(x * 3), sharding=s, full=x.shape)

    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x)), data * 3)


def test_local_shape_refuses_an_indivisible_dim(mesh):
    with pytest.raises(manual.ManualOpsError, match="dim 1 of size 6 is split 4 ways"):
        manual.local_shape((4, 6), NamedSharding(mesh, P(None, "b")))
    assert manual.local_shape((4, 6), NamedSharding(mesh, P("a"))) == (2, 6)
    assert manual.local_shape((8, 8), NamedSharding(mesh, P(("a", "b")))) == (1, 8)


def test_a_sharding_that_is_not_one_is_named():
    with pytest.raises(manual.ManualOpsError, match="full_to_shard: sharding must be a jax.sharding.Sharding"):
        manual.full_to_shard(jnp.zeros(2), sharding=("x",), local=(1,))
    with pytest.raises(manual.ManualOpsError, match="shard_to_full: sharding must be"):
        manual.shard_to_full(jnp.zeros(2), sharding=None, full=(2,))
