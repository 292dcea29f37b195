"""``Mesh``: the logical device topology, as in PyTorch/XLA, backed by JAX.

A :class:`Mesh` arranges the logical device ordinals ``0..N-1`` (N = every
device of the job, all processes) into an n-dimensional array and names its
axes. It is a value: immutable, hashable, equal to any mesh with the same ids,
shape and names. Its :attr:`Mesh.jax_mesh` is the ``jax.sharding.Mesh`` that
sharding annotations are built on, and :meth:`Mesh.named_sharding` turns a
PyTorch/XLA partition spec into a ``jax.sharding.NamedSharding``.

Logical ordinal ``i`` is the ``i``-th device of
``sorted(jax.devices(), key=lambda d: (d.process_index, d.id))`` (see
:mod:`spmdtorch.mesh._devices` for why).

Example:
    >>> import numpy as np
    >>> from spmdtorch.mesh import Mesh
    >>> mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))   # 8 devices
    >>> dict(mesh.shape())   # an OrderedDict, as PyTorch/XLA's
    {'data': 4, 'model': 2}
    >>> mesh.get_logical_mesh()
    array([[0, 1],
           [2, 3],
           [4, 5],
           [6, 7]])
    >>> mesh.named_sharding(("data", None)).spec
    P('data', None)
"""

from __future__ import annotations

import collections
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import numpy.typing as npt
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from spmdtorch.mesh._devices import global_devices
from spmdtorch.mesh.errors import AxisNamesError, DeviceIdsError, MeshShapeError
from spmdtorch.mesh.spec import (
    NormalizedSpec,
    normalize_partition_spec,
    resolve_axis,
    to_jax_partition_spec,
)

__all__ = ["Mesh"]

#: How many device ids ``repr`` shows before eliding the rest.
_REPR_MAX_IDS = 32


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate_shape(value: Any, param: str) -> tuple[int, ...]:
    """Checks a mesh shape (a non-empty sequence of positive ints) → tuple of int."""
    if _is_int(value):
        raise MeshShapeError(f"{param} must be a tuple of ints, got the int {value!r}; use ({int(value)},)")
    if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray)):
        raise MeshShapeError(f"{param} must be a tuple of positive ints, got {type(value).__name__} {value!r}")
    shape = tuple(value)
    if not shape:
        raise MeshShapeError(f"{param} must have at least one axis, got {shape!r}")
    for i, size in enumerate(shape):
        if not _is_int(size):
            raise MeshShapeError(f"{param}[{i}] must be an int, got {type(size).__name__} {size!r} in {shape!r}")
        if size < 1:
            raise MeshShapeError(
                f"{param}[{i}] must be >= 1, got {size} in {shape!r}; every mesh axis "
                "holds at least one device (use 1 for an axis that does not split)"
            )
    return tuple(int(s) for s in shape)


def _validate_device_ids(value: Any) -> tuple[int, ...]:
    """Checks ``device_ids`` is a flat sequence of ints → tuple of int (no range check)."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise DeviceIdsError(
                f"device_ids must be a flat (1-D) list of logical device ordinals, got an "
                f"array of shape {value.shape}; pass device_ids.ravel() (the mesh shape is "
                "given by mesh_shape)"
            )
        if value.dtype.kind not in "iu" and value.dtype != object:
            raise DeviceIdsError(
                f"device_ids must hold ints (logical device ordinals), got an array of dtype "
                f"{value.dtype}; e.g. np.arange(n)"
            )
        items = value.tolist()
    elif isinstance(value, (str, bytes, set, frozenset, dict)) or not hasattr(value, "__iter__"):
        # Sets and dicts have no meaningful order; strings are never ids.
        raise DeviceIdsError(
            f"device_ids must be an ordered list or 1-D numpy array of ints, got {type(value).__name__} {value!r}"
        )
    else:
        items = list(value)
    for pos, d in enumerate(items):
        if not _is_int(d):
            hint = ""
            if hasattr(d, "process_index") and hasattr(d, "platform"):
                hint = "; pass logical ordinals (e.g. range(n)), not jax Device objects"
            raise DeviceIdsError(
                f"device_ids[{pos}] must be an int logical device ordinal, got {type(d).__name__} {d!r}{hint}"
            )
    return tuple(int(d) for d in items)


def _validate_axis_names(value: Any, mesh_shape: tuple[int, ...]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        raise AxisNamesError(f"axis_names must be a tuple of str, got the string {value!r}; use ({value!r},)")
    if not isinstance(value, (Sequence, np.ndarray)):
        raise AxisNamesError(f"axis_names must be a tuple of str (or None), got {type(value).__name__} {value!r}")
    names = tuple(value)
    if len(names) != len(mesh_shape):
        raise AxisNamesError(
            f"axis_names {names!r} has {len(names)} names but mesh_shape {mesh_shape!r} has "
            f"{len(mesh_shape)} axes; give exactly one name per axis"
        )
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise AxisNamesError(f"axis_names[{i}] must be a non-empty str, got {type(name).__name__} {name!r}")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise AxisNamesError(f"axis_names {names!r} repeats {', '.join(map(repr, dupes))}; axis names must be unique")
    return tuple(str(n) for n in names)


def _check_permutation(ids: tuple[int, ...], mesh_shape: tuple[int, ...], num_devices: int) -> None:
    n_shape = math.prod(mesh_shape)
    if n_shape != len(ids):
        fix = (
            f"use a mesh_shape whose product is {len(ids)}"
            if len(ids) == num_devices
            else f"use {num_devices} device_ids and a mesh_shape whose product is {num_devices}"
        )
        raise MeshShapeError(
            f"mesh_shape {mesh_shape} has {n_shape} devices but device_ids has {len(ids)} "
            f"(and the runtime has {num_devices} devices); {fix}"
        )
    if len(ids) != num_devices:
        raise MeshShapeError(
            f"mesh_shape {mesh_shape} and device_ids cover {len(ids)} devices but the runtime "
            f"has {num_devices} (jax.device_count()); a mesh spans every device: use "
            f"device_ids=range({num_devices}) and a mesh_shape whose product is {num_devices}"
        )
    counts = collections.Counter(ids)
    dupes = sorted(d for d, c in counts.items() if c > 1)
    if dupes:
        shown = ", ".join(f"{d} ({counts[d]} times)" for d in dupes[:8])
        raise DeviceIdsError(
            f"device_ids repeats {shown}; device_ids must be a permutation of 0..{num_devices - 1}, each device once"
        )
    bad = sorted(d for d in ids if not 0 <= d < num_devices)
    if bad:
        shown = ", ".join(map(str, bad[:8])) + (", ..." if len(bad) > 8 else "")
        raise DeviceIdsError(
            f"device_ids contains {shown}, outside 0..{num_devices - 1}; device_ids are "
            f"logical ordinals of the {num_devices} runtime devices (not jax Device.id "
            f"values): use a permutation of range({num_devices})"
        )


class Mesh:
    """A logical device mesh, with PyTorch/XLA's constructor and methods.

    Args:
        device_ids: A flat list or 1-D numpy array holding every logical
            device ordinal ``0..N-1`` once, in any order (N =
            ``jax.device_count()``, all processes). It is reshaped to
            ``mesh_shape`` in C order.
        mesh_shape: The mesh shape; its product must be N.
        axis_names: One unique non-empty name per axis, or None. An unnamed
            mesh behaves like PyTorch/XLA's: ``axis_names`` stays None,
            :meth:`shape` is keyed by axis index, and partition specs must use
            indices; internally (in :attr:`jax_mesh`) the axes are called
            ``"axis_0"``, ``"axis_1"``, ... (see :attr:`jax_axis_names`).

    Logical ordinal ``i`` is the ``i``-th device of
    ``sorted(jax.devices(), key=lambda d: (d.process_index, d.id))``; on one
    process that is simply ``jax.devices()[i]`` (``cpu:i``).

    A mesh is immutable (setting an attribute raises ``AttributeError``),
    hashable, and compares equal to any mesh (including a :class:`HybridMesh`)
    with the same device ids, shape and axis names.

    Raises:
        DeviceIdsError: ``device_ids`` is not a flat int sequence, repeats a
            device, or has an id outside ``0..N-1``.
        MeshShapeError: ``mesh_shape`` is malformed or its product differs
            from ``len(device_ids)`` or from N.
        AxisNamesError: ``axis_names`` is a bare string, has the wrong length,
            an empty or non-str name, or a duplicate.

    Example:
        >>> import numpy as np
        >>> mesh = Mesh(np.arange(8), (4, 2), ("x", "y"))
        >>> mesh.size(), mesh.get_axis_name_idx("y")
        (8, 1)
        >>> dict(mesh.jax_mesh.shape)
        {'x': 4, 'y': 2}
        >>> dict(Mesh(range(8), (8,)).shape())     # unnamed: keyed by index
        {0: 8}
    """

    __slots__ = (
        "_axis_names",
        "_device_ids",
        "_hash",
        "_jax_axis_names",
        "_jax_mesh",
        "_mesh_shape",
        "_sharding_cache",
    )
    # Set once in __init__ (through object.__setattr__: the mesh is immutable).
    _device_ids: npt.NDArray[np.int64]
    _mesh_shape: tuple[int, ...]
    _axis_names: tuple[str, ...] | None
    _jax_axis_names: tuple[str, ...]
    _jax_mesh: jax.sharding.Mesh
    _hash: int
    _sharding_cache: dict[NormalizedSpec, NamedSharding]

    def __init__(
        self,
        device_ids: np.ndarray | Sequence[int],
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ids = _validate_device_ids(device_ids)
        shape = _validate_shape(mesh_shape, "mesh_shape")
        names = _validate_axis_names(axis_names, shape)
        devices = global_devices()
        _check_permutation(ids, shape, len(devices))

        jax_names = names if names is not None else tuple(f"axis_{i}" for i in range(len(shape)))
        id_array = np.array(ids, dtype=np.int64)
        id_array.flags.writeable = False
        dev_array = np.empty(len(ids), dtype=object)
        dev_array[:] = [devices[i] for i in ids]
        # Auto axes: the GSPMD partitioner chooses layouts between annotations,
        # which is PyTorch/XLA's model (JAX's Explicit axes are a different one).
        jmesh = jax.sharding.Mesh(dev_array.reshape(shape), jax_names, axis_types=(AxisType.Auto,) * len(shape))
        setattr_ = object.__setattr__
        setattr_(self, "_device_ids", id_array)
        setattr_(self, "_mesh_shape", shape)
        setattr_(self, "_axis_names", names)
        setattr_(self, "_jax_axis_names", jax_names)
        setattr_(self, "_jax_mesh", jmesh)
        setattr_(self, "_hash", hash((ids, shape, names)))
        # Specs repeat (every step marks the same parameters): returning the same
        # NamedSharding object keeps JAX's cache lookups on their fast path.
        setattr_(self, "_sharding_cache", {})

    # ---------------------------------------------------------------- attributes

    @property
    def device_ids(self) -> npt.NDArray[np.int64]:
        """The flat logical device ordinals (read-only int64 array)."""
        return self._device_ids

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The mesh shape, a tuple of ints."""
        return self._mesh_shape

    @property
    def axis_names(self) -> tuple[str, ...] | None:
        """The axis names as given, or None for an unnamed mesh (as PyTorch/XLA)."""
        return self._axis_names

    @property
    def jax_axis_names(self) -> tuple[str, ...]:
        """The axis names used in :attr:`jax_mesh` (``"axis_<i>"`` when unnamed)."""
        return self._jax_axis_names

    @property
    def jax_mesh(self) -> jax.sharding.Mesh:
        """The ``jax.sharding.Mesh`` (all axes ``AxisType.Auto``) with the same layout.

        ``jax_mesh.devices[idx]`` is the device of logical ordinal
        ``get_logical_mesh()[idx]``.
        """
        return self._jax_mesh

    @property
    def devices(self) -> npt.NDArray[np.object_]:
        """The jax devices in mesh shape (read-only object array)."""
        return self._jax_mesh.devices

    # ------------------------------------------------------- PyTorch/XLA methods

    def size(self) -> int:
        """Returns the number of devices in the mesh."""
        return math.prod(self._mesh_shape)

    def shape(self) -> collections.OrderedDict[str | int, int]:
        """Returns ``OrderedDict(axis name → size)`` (axis index → size if unnamed).

        Example:
            >>> dict(Mesh(range(8), (2, 4), ("a", "b")).shape())
            {'a': 2, 'b': 4}
        """
        keys: Sequence[str | int] = self._axis_names if self._axis_names is not None else range(len(self._mesh_shape))
        return collections.OrderedDict(zip(keys, self._mesh_shape))

    def get_logical_mesh(self) -> npt.NDArray[np.int64]:
        """Returns the device ordinals in mesh shape (a fresh, writable array).

        Example:
            >>> Mesh(range(7, -1, -1), (2, 4)).get_logical_mesh()   # 8 devices
            array([[7, 6, 5, 4],
                   [3, 2, 1, 0]])
        """
        # Annotated: numpy's stubs type reshape(<tuple[int, ...]>).copy() as Any.
        logical: npt.NDArray[np.int64] = self._device_ids.reshape(self._mesh_shape).copy()
        return logical

    def get_axis_name_idx(self, name: str | int) -> int:
        """Returns the index of the axis called ``name`` (an int index is checked and returned).

        Unlike PyTorch/XLA, which returns None for an unknown name, this
        raises, so a typo cannot silently become "replicated".

        Raises:
            UnknownAxisError: No axis has that name (the message lists them),
                the mesh is unnamed, or an index is out of range.

        Example:
            >>> Mesh(range(8), (4, 2), ("data", "model")).get_axis_name_idx("model")
            1
        """
        return resolve_axis(name, self._axis_names, self._mesh_shape)

    # ----------------------------------------------------------- JAX conversion

    def jax_partition_spec(self, partition_spec: Sequence[Any], ndim: int | None = None) -> PartitionSpec:
        """Converts a PyTorch/XLA partition spec to a ``jax.sharding.PartitionSpec``.

        Args:
            partition_spec: One entry per tensor dim: None, an int axis index,
                a str axis name, or a tuple of indices/names (the dim is split
                over those axes, first one major).
            ndim: The tensor rank; when given, the spec length must match.

        Returns:
            A ``PartitionSpec`` over :attr:`jax_axis_names`, one entry per dim.

        Raises:
            PartitionSpecError: Unknown axis name/index, an axis used twice, a
                nested tuple, a wrong entry type, or a length != ``ndim``. The
                message names the dim (``partition_spec[i]``) and its value.

        Example:
            >>> Mesh(range(8), (4, 2), ("x", "y")).jax_partition_spec((("x", 1), None))
            P(('x', 'y'), None)
        """
        normalized = normalize_partition_spec(partition_spec, self._axis_names, self._mesh_shape, ndim)
        return to_jax_partition_spec(normalized, self._jax_axis_names)

    def named_sharding(self, partition_spec: Sequence[Any], ndim: int | None = None) -> NamedSharding:
        """Converts a PyTorch/XLA partition spec to a ``jax.sharding.NamedSharding``.

        This is what ``mark_sharding(t, mesh, spec)`` applies. Mesh axes the
        spec leaves out replicate the tensor. The returned sharding's ``spec``
        has exactly one entry per tensor dim; equal specs return the same
        object.

        Args:
            partition_spec: See :meth:`jax_partition_spec`.
            ndim: The tensor rank; when given, the spec length must match.

        Raises:
            PartitionSpecError: See :meth:`jax_partition_spec`.

        Example:
            >>> mesh = Mesh(range(8), (4, 2), ("data", "model"))
            >>> s = mesh.named_sharding((0, "model"))
            >>> s.spec, s.mesh is mesh.jax_mesh
            (P('data', 'model'), True)
            >>> mesh.named_sharding((None, None)).is_fully_replicated
            True
        """
        normalized = normalize_partition_spec(partition_spec, self._axis_names, self._mesh_shape, ndim)
        cached = self._sharding_cache.get(normalized)
        if cached is None:
            cached = NamedSharding(self._jax_mesh, to_jax_partition_spec(normalized, self._jax_axis_names))
            self._sharding_cache[normalized] = cached
        return cached

    def replicated(self) -> NamedSharding:
        """Returns the fully replicated ``NamedSharding`` over this mesh (any rank).

        Example:
            >>> Mesh(range(8), (8,)).replicated().is_fully_replicated
            True
        """
        return self.named_sharding(())

    # ------------------------------------------------------------ value object

    def _key(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...] | None]:
        return (tuple(self._device_ids.tolist()), self._mesh_shape, self._axis_names)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mesh):
            return NotImplemented
        if self is other:
            return True
        return self._hash == other._hash and self._key() == other._key()

    def __hash__(self) -> int:
        return self._hash

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}; build a new mesh instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")

    def __copy__(self) -> Mesh:
        return self  # immutable: a copy would be indistinguishable

    def __deepcopy__(self, memo: dict[int, Any]) -> Mesh:
        return self

    def __reduce__(self) -> tuple[Callable[..., Mesh], tuple[Any, ...]]:
        # jax devices do not pickle; rebuild from the logical description (the
        # receiving process maps ordinals to its own view of the same devices).
        return (Mesh, (self._device_ids.tolist(), self._mesh_shape, self._axis_names))

    def _ids_repr(self) -> str:
        ids = self._device_ids.tolist()
        if ids == list(range(len(ids))):
            return f"range({len(ids)})"
        if len(ids) > _REPR_MAX_IDS:
            return "[" + ", ".join(map(str, ids[:_REPR_MAX_IDS])) + f", ...] ({len(ids)} ids)"
        return repr(ids)

    def __repr__(self) -> str:
        return f"Mesh(device_ids={self._ids_repr()}, mesh_shape={self._mesh_shape!r}, axis_names={self._axis_names!r})"
