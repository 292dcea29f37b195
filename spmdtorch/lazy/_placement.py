"""The default placement of values no one annotated.

In SPMD mode an unannotated value is *replicated* over every device (as in
PyTorch/XLA), so every array the library creates lives on the same device set
and any two of them can meet in one program.
"""

from __future__ import annotations

import functools

import jax
import numpy as np

__all__ = ["replicated_sharding"]


@functools.cache
def replicated_sharding() -> jax.sharding.NamedSharding:
    """Fully replicated over all devices of all processes."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("_all",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
