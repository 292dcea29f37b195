"""``place``: an xla tensor sharded over any subset of the devices (checkpoint tests).

A module of its own, not ``conftest``: test directories each have a
``conftest.py``, and importing one by that name from a test picks whichever
was imported first.
"""

from __future__ import annotations

import jax
import numpy as np
import torch
from jax.sharding import NamedSharding, PartitionSpec

from spmdtorch.lazy import Storage, padding
from spmdtorch.tensor.xla_tensor import XlaTensor, contiguous_strides


def place(cpu: torch.Tensor, n_devices: int, spec=(), axis_names=("x",), mesh_shape=None) -> XlaTensor:
    """``cpu`` as an xla tensor sharded by ``spec`` over the first ``n_devices`` devices.

    A ``spmdtorch.mesh.Mesh`` always spans every device; restoring onto 4 or
    1 of the 8 devices (a smaller slice) needs a JAX mesh over a subset, so
    this builds the storage the way ``mark_sharding`` does (padded when uneven).
    """
    shape = mesh_shape or (n_devices,)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:n_devices]).reshape(shape), axis_names)
    sharding = NamedSharding(mesh, PartitionSpec(*spec))
    logical = tuple(cpu.shape)
    padded = padding.padded_shape(logical, sharding) or logical
    host = np.pad(cpu.numpy(), [(0, p - n) for n, p in zip(logical, padded)])
    st = Storage(jax.device_put(host, sharding), sharding)
    st.annotated = True
    if padded != logical:
        st.logical_shape = logical
    return XlaTensor(st, (), logical, contiguous_strides(logical), 0, cpu.dtype)
