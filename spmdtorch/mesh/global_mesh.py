"""The process-wide default mesh and the 1-D convenience mesh.

``set_global_mesh`` stores one mesh for code that does not pass one (FSDPv2,
``enable_manual_sharding``...), as in PyTorch/XLA. It is per process (every
host of a multi-host job sets its own, normally the same one).

Example:
    >>> from spmdtorch.mesh import get_1d_mesh, set_global_mesh, get_global_mesh
    >>> set_global_mesh(get_1d_mesh("data"))
    >>> dict(get_global_mesh().shape())    # with 8 devices (shape() is an OrderedDict)
    {'data': 8}
    >>> set_global_mesh(None)              # clear it
"""

from __future__ import annotations

import threading

from spmdtorch import _checks
from spmdtorch.mesh._devices import global_devices
from spmdtorch.mesh.errors import AxisNamesError, MeshTypeError
from spmdtorch.mesh.mesh import Mesh

__all__ = ["get_1d_mesh", "get_global_mesh", "set_global_mesh"]

_lock = threading.Lock()
_global_mesh: Mesh | None = None


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """Returns a mesh with every device on one axis, in logical order.

    Args:
        axis_name: The axis name; None gives an unnamed mesh (use index 0 in
            partition specs), as in PyTorch/XLA.

    Example:
        >>> mesh = get_1d_mesh("data")
        >>> mesh.mesh_shape, mesh.axis_names       # with 8 devices
        ((8,), ('data',))
        >>> get_1d_mesh().axis_names is None
        True
    """
    if axis_name is not None:
        _checks.check_str(axis_name, "get_1d_mesh", "axis_name", AxisNamesError, nonempty=True)
    n = len(global_devices())
    return Mesh(range(n), (n,), None if axis_name is None else (axis_name,))


def set_global_mesh(mesh: Mesh | None) -> None:
    """Sets the process-wide default mesh (None clears it).

    Raises:
        MeshTypeError: ``mesh`` is not a :class:`Mesh` (a ``TypeError``) (a ``jax.sharding.Mesh``
            is refused: wrap the layout in ``spmdtorch.mesh.Mesh``).

    Example:
        >>> set_global_mesh(get_1d_mesh("fsdp"))
        >>> get_global_mesh().axis_names
        ('fsdp',)
        >>> set_global_mesh(None)
    """
    if mesh is not None and not isinstance(mesh, Mesh):
        raise MeshTypeError(
            f"set_global_mesh expects a spmdtorch.mesh.Mesh (or None to clear) as mesh, got "
            f"{type(mesh).__module__}.{type(mesh).__qualname__}; build one with "
            "Mesh(device_ids, mesh_shape, axis_names) or get_1d_mesh()"
        )
    global _global_mesh
    with _lock:
        _global_mesh = mesh


def get_global_mesh() -> Mesh | None:
    """Returns the mesh set by :func:`set_global_mesh`, or None if none is set.

    Example:
        >>> set_global_mesh(None)
        >>> get_global_mesh() is None
        True
    """
    with _lock:
        return _global_mesh
