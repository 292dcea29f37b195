"""``HybridMesh``: a mesh whose outer (DCN) axes span slices or hosts.

Devices inside a TPU slice talk over fast ICI links; slices (and, on GPU/CPU,
hosts) talk over slower data-center networking (DCN). A hybrid mesh of shape
``ici[i] * dcn[i]`` per axis puts whole *granules* (slices, or processes when
the platform reports no slices) into the DCN blocks, so that only the DCN part
of each axis crosses the slow network.

The placement is :func:`hybrid_device_ids`, a pure function of
:class:`~spmdtorch.mesh._devices.DeviceRecord` s, so it can be tested without
the hardware. On TPU, each granule's ICI block is laid out along the physical
torus by ``jax.experimental.mesh_utils`` instead (same grouping, better links).

Example:
    >>> from spmdtorch.mesh import HybridMesh, Mesh
    >>> HybridMesh(ici_mesh_shape=(4, 2)) == Mesh(range(8), (4, 2))  # one process
    True
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
import numpy.typing as npt

from spmdtorch.mesh._devices import DeviceRecord, device_records, global_devices
from spmdtorch.mesh.errors import HybridMeshError
from spmdtorch.mesh.mesh import Mesh, _validate_shape

__all__ = ["HybridMesh", "hybrid_device_ids"]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('s') else 's'}"


def hybrid_device_ids(
    records: Sequence[DeviceRecord],
    ici_mesh_shape: Sequence[int],
    dcn_mesh_shape: Sequence[int],
) -> npt.NDArray[np.int64]:
    """Places devices in a hybrid ICI × DCN mesh; returns their ids in mesh shape.

    Devices are grouped into *granules*: by ``slice_index`` when the records
    span several slices, else by ``process_index`` (each process's devices form one DCN
    group, like ``mesh_utils.create_hybrid_device_mesh(...,
    process_is_granule=True)``). Granules are taken in increasing key order and
    laid out over ``dcn_mesh_shape`` in C order; within a granule, devices are
    taken in increasing ``device_id`` and reshaped to ``ici_mesh_shape``.
    Along axis ``k`` of the result, DCN block ``j`` covers indices
    ``j * ici[k] .. (j + 1) * ici[k] - 1``.

    With ``prod(dcn_mesh_shape) == 1`` all devices form one ICI block; that is
    refused when the records span several *slices* (the DCN links would carry
    inner-axis traffic; PyTorch/XLA refuses it too) but allowed across several
    processes without slices (on GPU/CPU, as ``jax.make_mesh`` does).

    Args:
        records: One record per device (any order); ``device_id`` values are
            the ids placed in the result.
        ici_mesh_shape: Per-axis size inside one granule.
        dcn_mesh_shape: Per-axis number of granules; same length as
            ``ici_mesh_shape``.

    Returns:
        An int64 array of shape ``ici[i] * dcn[i]`` holding every device id once.

    Raises:
        MeshShapeError: A shape is not a tuple of positive ints.
        HybridMeshError: ``records`` holds something other than DeviceRecords,
            the shapes' lengths differ, their product is not the
            device count, the granule count is not ``prod(dcn_mesh_shape)``, or
            a granule's size is not ``prod(ici_mesh_shape)``.

    Example:
        >>> recs = [DeviceRecord(i, i // 4) for i in range(8)]   # 2 hosts x 4
        >>> hybrid_device_ids(recs, (1, 4), (2, 1))
        array([[0, 1, 2, 3],
               [4, 5, 6, 7]])
        >>> hybrid_device_ids(recs, (2, 2), (1, 2))
        array([[0, 1, 4, 5],
               [2, 3, 6, 7]])
    """
    ici = _validate_shape(ici_mesh_shape, "ici_mesh_shape")
    dcn = _validate_shape(dcn_mesh_shape, "dcn_mesh_shape")
    if isinstance(records, (str, bytes)) or not isinstance(records, Sequence):
        raise HybridMeshError(
            f"hybrid_device_ids: records must be a sequence of DeviceRecord, got {type(records).__name__} {records!r}"
        )
    for i, r in enumerate(records):
        if not isinstance(r, DeviceRecord):
            raise HybridMeshError(
                f"hybrid_device_ids: records[{i}] must be a DeviceRecord(device_id, process_index, slice_index), "
                f"got {type(r).__name__} {r!r}; build them with device_records()"
            )
    if len(ici) != len(dcn):
        raise HybridMeshError(
            f"ici_mesh_shape {ici} has {len(ici)} axes but dcn_mesh_shape {dcn} has "
            f"{len(dcn)}; give both the same number of axes (use 1 where an axis does not split)"
        )
    n = len(records)
    n_ici, n_dcn = math.prod(ici), math.prod(dcn)
    if n_ici * n_dcn != n:
        raise HybridMeshError(
            f"ici_mesh_shape {ici} x dcn_mesh_shape {dcn} covers {n_ici * n_dcn} devices but "
            f"the runtime has {n}; choose shapes whose products multiply to {n}"
        )
    ids = [int(r.device_id) for r in records]
    if len(set(ids)) != n:
        raise HybridMeshError(f"device records repeat a device_id: {sorted(ids)}")

    has_slices = any(r.slice_index is not None for r in records)
    if has_slices and any(r.slice_index is None for r in records):
        raise HybridMeshError("some devices report a slice_index and others do not")
    # Multi-process CPU/GPU jobs report every device in slice 0: one slice
    # carries no DCN structure, so the processes are the granules.
    has_slices = has_slices and len({r.slice_index for r in records}) > 1
    kind = "slice" if has_slices else "process"
    groups: dict[int, list[int]] = collections.defaultdict(list)
    for r in records:
        # has_slices implies every record has a slice_index (checked above).
        granule = r.process_index if not has_slices or r.slice_index is None else r.slice_index
        groups[int(granule)].append(int(r.device_id))

    if n_dcn == 1:
        if has_slices and len(groups) > 1:
            raise HybridMeshError(
                f"the devices span {_plural(len(groups), 'slice')} but dcn_mesh_shape is "
                f"{dcn}; give a dcn_mesh_shape whose product is {len(groups)} so that only "
                "the outer axes cross the slow network between slices"
            )
        return np.array(sorted(ids), dtype=np.int64).reshape(ici)

    if len(groups) != n_dcn:
        what = _plural(len(groups), kind) + ("" if has_slices else " (the devices report no slice_index)")
        raise HybridMeshError(
            f"cannot place DCN groups: dcn_mesh_shape {dcn} asks for {n_dcn} groups of "
            f"{n_ici} devices but the runtime has {what}; each DCN group is one "
            f"whole {kind}, so use a dcn_mesh_shape whose product is {len(groups)} (all ones on "
            "a single host) and put the rest in ici_mesh_shape"
        )
    granules = [sorted(groups[k]) for k in sorted(groups)]
    for key, members in zip(sorted(groups), granules):
        if len(members) != n_ici:
            raise HybridMeshError(
                f"{kind} {key} has {len(members)} devices but ici_mesh_shape {ici} needs "
                f"{n_ici} per DCN group; every {kind} must hold prod(ici_mesh_shape) devices"
            )

    out = np.empty(tuple(i * d for i, d in zip(ici, dcn)), dtype=np.int64)
    for g, block_idx in enumerate(itertools.product(*(range(d) for d in dcn))):
        where = tuple(slice(j * i, (j + 1) * i) for j, i in zip(block_idx, ici))
        out[where] = np.array(granules[g], dtype=np.int64).reshape(ici)
    return out


def _tpu_device_ids(devices: list[jax.Device], ici: tuple[int, ...], dcn: tuple[int, ...]) -> npt.NDArray[np.int64]:
    """TPU placement through jax's topology-aware mesh_utils, as ordinals."""
    from jax.experimental import mesh_utils

    ordinal = {d: i for i, d in enumerate(devices)}
    try:
        if math.prod(dcn) > 1:
            has_slices = len({getattr(d, "slice_index", None) for d in devices}) > 1
            placed = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=not has_slices)
        else:
            placed = mesh_utils.create_device_mesh(ici, devices)
    except (ValueError, NotImplementedError, AssertionError) as e:
        raise HybridMeshError(
            f"cannot lay out ici_mesh_shape {ici} / dcn_mesh_shape {dcn} on the TPU topology: {e}"
        ) from e
    # Annotated: numpy's stubs type a vectorized call's result as Any.
    ordinals: npt.NDArray[np.int64] = np.vectorize(ordinal.__getitem__, otypes=[np.int64])(placed)
    return ordinals


class HybridMesh(Mesh):
    """A :class:`Mesh` for hybrid ICI (fast, in-slice) × DCN (slow) parallelism.

    Axis ``i`` has ``ici_mesh_shape[i] * dcn_mesh_shape[i]`` devices. Order
    axes by increasing communication (e.g. ``("data", "fsdp", "tensor")``)
    and put the DCN factors on the outer ones. DCN groups are whole slices, or
    whole processes where the platform reports no slices; see
    :func:`hybrid_device_ids` for the exact placement.

    On a single process (no slices) ``dcn_mesh_shape`` must be None or all
    ones, and the mesh equals ``Mesh(range(N), ici_mesh_shape, axis_names)``;
    a DCN product > 1 raises :class:`HybridMeshError` (there is no second
    host to place a DCN group on; spmdtorch does not emulate one).

    Args:
        ici_mesh_shape: Per-axis sizes inside one slice/process.
        dcn_mesh_shape: Per-axis numbers of slices/processes; None = all ones.
        axis_names: As for :class:`Mesh`.

    Raises:
        MeshShapeError: A shape is malformed.
        HybridMeshError: The shapes do not fit the slices/processes.
        AxisNamesError: As for :class:`Mesh`.

    Example:
        >>> mesh = HybridMesh(ici_mesh_shape=(1, 8, 1), axis_names=("data", "fsdp", "tensor"))
        >>> dict(mesh.shape())
        {'data': 1, 'fsdp': 8, 'tensor': 1}
        >>> # On 2 hosts x 4 devices: HybridMesh(ici_mesh_shape=(1, 4, 1),
        >>> #     dcn_mesh_shape=(2, 1, 1), ...) puts one host in each "data" row.
    """

    __slots__ = ("_dcn_mesh_shape", "_ici_mesh_shape")
    # Set once in __init__ (through object.__setattr__: the mesh is immutable).
    _ici_mesh_shape: tuple[int, ...]
    _dcn_mesh_shape: tuple[int, ...]

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int] | None = None,
        axis_names: Sequence[str] | None = None,
    ) -> None:
        ici = _validate_shape(ici_mesh_shape, "ici_mesh_shape")
        dcn = (1,) * len(ici) if dcn_mesh_shape is None else _validate_shape(dcn_mesh_shape, "dcn_mesh_shape")
        devices = global_devices()
        # The pure placement always runs: it validates the grouping for every
        # platform, and is the layout everywhere but on TPU.
        ids = hybrid_device_ids(device_records(devices), ici, dcn)
        if devices and devices[0].platform == "tpu":
            ids = _tpu_device_ids(devices, ici, dcn)
        mesh_shape = tuple(i * d for i, d in zip(ici, dcn))
        super().__init__(ids.ravel(), mesh_shape, axis_names)
        object.__setattr__(self, "_ici_mesh_shape", ici)
        object.__setattr__(self, "_dcn_mesh_shape", dcn)

    @property
    def ici_mesh_shape(self) -> tuple[int, ...]:
        """Per-axis sizes inside one slice/process."""
        return self._ici_mesh_shape

    @property
    def dcn_mesh_shape(self) -> tuple[int, ...]:
        """Per-axis numbers of slices/processes (all ones when not given)."""
        return self._dcn_mesh_shape

    def __reduce__(self) -> tuple[Callable[..., Mesh], tuple[Any, ...]]:
        return (
            functools.partial(
                HybridMesh,
                ici_mesh_shape=self._ici_mesh_shape,
                dcn_mesh_shape=self._dcn_mesh_shape,
                axis_names=self._axis_names,
            ),
            (),
        )

    def __repr__(self) -> str:
        return (
            f"HybridMesh(ici_mesh_shape={self._ici_mesh_shape!r}, "
            f"dcn_mesh_shape={self._dcn_mesh_shape!r}, axis_names={self._axis_names!r}; "
            f"device_ids={self._ids_repr()})"
        )
