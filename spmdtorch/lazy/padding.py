"""Uneven shardings: padded device storage for dims a mesh axis does not divide.

XLA partitions such dims fine inside a program, but JAX refuses to *hold* an
array whose sharded dim is not divisible by its shard count. So a storage with
such a sharding keeps its concrete data padded up to the next multiple (each
device holds ⌈n/k⌉ of the dim, never a full copy) and remembers the logical
shape; programs read it through a slice and write it through a pad, so
results are those of the unsharded program.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from spmdtorch.lazy import caches

__all__ = ["shards_per_dim", "padded_shape", "pad_to", "unpad"]


def shards_per_dim(
    mesh: jax.sharding.Mesh | jax.sharding.AbstractMesh, spec: jax.sharding.PartitionSpec | Sequence[Any], ndim: int
) -> list[int]:
    """How many blocks a ``PartitionSpec`` over ``mesh`` cuts each of ``ndim`` dims into."""
    out = []
    spec = tuple(spec) + (None,) * (ndim - len(spec))
    for entry in spec[:ndim]:
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        n = 1
        for name in names:
            n *= mesh.shape[name]
        out.append(n)
    return out


# (shape, sharding) -> padded shape or None; every sync asks once per output.
_PADDED: caches.BoundedCache[tuple[tuple[int, ...], Any], tuple[int, ...] | None] = caches.bounded(
    "lazy.padding.padded_shapes", maxsize=4096
)


def padded_shape(shape: Sequence[int], sharding: jax.sharding.Sharding | None) -> tuple[int, ...] | None:
    """The padded storage shape for ``shape`` under ``sharding``, or None if even.

    Example:
        >>> import jax, numpy as np
        >>> from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        >>> mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
        >>> padded_shape((10, 3), NamedSharding(mesh, P("x"))), padded_shape((8, 3), NamedSharding(mesh, P("x")))
        ((12, 3), None)
    """
    shape = tuple(shape)
    key = (shape, sharding)
    try:
        return _PADDED[key]

    except KeyError:
        pass
    padded = None
    if isinstance(sharding, jax.sharding.NamedSharding):
        parts = shards_per_dim(sharding.mesh, sharding.spec, len(shape))
        padded = tuple(-(-n // k) * k for n, k in zip(shape, parts))
        padded = None if padded == shape else padded
    _PADDED.put(key, padded)
    return padded


def pad_to(x: jax.Array, *, shape: Sequence[int]) -> jax.Array:
    """Zero-pad ``x`` at the end of each dim up to ``shape``."""
    return jnp.pad(x, [(0, p - n) for n, p in zip(x.shape, shape)])


def unpad(x: jax.Array, *, shape: Sequence[int]) -> jax.Array:
    """The leading ``shape`` block of padded ``x``."""
    return jax.lax.slice(x, (0,) * len(shape), tuple(shape))
