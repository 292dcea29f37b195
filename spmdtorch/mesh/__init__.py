"""Device meshes: ``Mesh``, ``HybridMesh``, the global mesh (PyTorch/XLA API on JAX).

A mesh arranges the logical device ordinals ``0..N-1`` (N = every device of
the job) into named axes. Ordinal ``i`` is the ``i``-th device of
``sorted(jax.devices(), key=lambda d: (d.process_index, d.id))``.
:meth:`Mesh.named_sharding` turns a PyTorch/XLA partition spec into the
``jax.sharding.NamedSharding`` that annotations use.

Example:
    >>> import numpy as np
    >>> from spmdtorch.mesh import Mesh
    >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    >>> mesh.named_sharding(("data", None))
    NamedSharding(mesh=Mesh('data': 4, 'model': 2, axis_types=(Auto, Auto)), spec=P('data', None), memory_kind=device)
"""

from spmdtorch.mesh._devices import DeviceRecord, device_records, global_devices
from spmdtorch.mesh.errors import (
    AxisNamesError,
    DeviceIdsError,
    HybridMeshError,
    MeshError,
    MeshShapeError,
    MeshTypeError,
    PartitionSpecError,
    UnknownAxisError,
)
from spmdtorch.mesh.global_mesh import get_1d_mesh, get_global_mesh, set_global_mesh
from spmdtorch.mesh.hybrid import HybridMesh, hybrid_device_ids
from spmdtorch.mesh.mesh import Mesh

__all__ = [
    "AxisNamesError",
    "DeviceIdsError",
    "DeviceRecord",
    "HybridMesh",
    "HybridMeshError",
    "Mesh",
    "MeshError",
    "MeshShapeError",
    "MeshTypeError",
    "PartitionSpecError",
    "UnknownAxisError",
    "device_records",
    "get_1d_mesh",
    "get_global_mesh",
    "global_devices",
    "hybrid_device_ids",
    "set_global_mesh",
]
