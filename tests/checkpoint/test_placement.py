"""Even shardings for writing padded (uneven) storages."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spmdtorch.checkpoint.placement import even_sharding


def test_even_sharding(devices8):
    mesh = jax.sharding.Mesh(np.array(devices8).reshape(4, 2), ("a", "b"))
    cases = [
        ((16, 6), P("a", "b"), P("a", "b")),  # already even: unchanged
        ((10, 6), P("a", "b"), P(None, "b")),  # 'a' splits neither 10 nor 6/2: dropped
        ((10, 8), P("a", None), P(None, "a")),  # the freed axis moves to dim 1
        ((10, 7), P("a", "b"), P("b", None)),  # 'a' fits nowhere; 'b' still splits 10
        ((5, 3), P(("a", "b"), None), P()),  # nothing divides: replicated
        ((12, 6), P(("a", "b"), None), P("a", "b")),  # 8 does not divide 12: 'a' stays, 'b' moves
    ]
    for shape, spec, want in cases:
        got = even_sharding(NamedSharding(mesh, spec), shape)
        assert got.is_equivalent_to(NamedSharding(mesh, want), len(shape)), (shape, spec, got.spec)
        for dim, n in zip(shape, got.shard_shape(shape)):  # shard_shape raises if uneven
            assert dim % n == 0
