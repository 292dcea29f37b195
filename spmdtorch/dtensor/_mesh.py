"""Single-controller ``DeviceMesh``: torch's mesh over xla devices with no process group.

torch's ``DeviceMesh("xla", ...)`` skips process-group setup (one SPMD program
drives every device), but slicing such a mesh (``mesh["tp"]``) or flattening
part of it asks torch for the *current rank* to pick "this rank's" group, and
without a default process group that raises. Under one controller a sub-mesh
stands for all of its groups at once: ``mesh["tp"]`` means "the tp axis of
the root mesh", and a placement on it shards over that axis, replicated over
the others.

:class:`XlaDeviceMesh` is a ``DeviceMesh`` subclass that keeps torch's own
layout bookkeeping (``_MeshLayout``) and overrides only what needs a rank:
sub-mesh and flattened-mesh creation build ``XlaDeviceMesh`` objects, the
``mesh`` tensor of a sub-mesh is its first group (the one holding device 0,
what torch reports on rank 0), and the per-rank queries raise
:class:`~spmdtorch.dtensor.errors.NoRankError`. It is a real
``DeviceMesh``: equal to (and hashing like) torch's mesh of the same layout.

Mesh "ranks" are spmdtorch's logical device ordinals (``spmdtorch.mesh``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any, NoReturn, cast

import torch
from torch.distributed._mesh_layout import _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

from spmdtorch import _checks, runtime
from spmdtorch.dtensor.errors import DeviceMeshError, NoRankError
from spmdtorch.mesh import Mesh, MeshError

__all__ = [
    "XlaDeviceMesh",
    "as_xla_mesh",
    "check_device_mesh",
    "init_device_mesh",
    "mesh_groups",
    "root_axes",
    "spans_root",
    "spmd_mesh",
]


def _no_rank(what: str, hint: str = "") -> NoReturn:
    raise NoRankError(
        f"DeviceMesh.{what}: one process drives every device of an xla mesh, so there is no current rank, "
        "coordinate or process group; a placement on a (sub-)mesh already covers all of its groups. Read the "
        "groups with spmdtorch.dtensor.mesh_groups(mesh), or the spmdtorch Mesh with spmdtorch.dtensor.spmd_mesh(mesh). "
        "(A DTensor made by torch's own DTensor.from_local on this mesh is a per-rank DTensor and lands here at its "
        "first op: make it with spmdtorch.dtensor.from_local)" + hint
    )


class XlaDeviceMesh(DeviceMesh):
    """A ``torch.distributed`` ``DeviceMesh`` over xla devices, driven by this one process.

    Build it with :func:`init_device_mesh`. Slicing (``mesh["tp"]``,
    ``mesh["dp", "tp"]``) and ``_flatten`` work as in torch and return
    ``XlaDeviceMesh`` objects; ``get_rank``, ``get_local_rank``,
    ``get_coordinate``, ``get_group`` and ``get_all_groups`` raise
    :class:`~spmdtorch.dtensor.errors.NoRankError`.
    """

    @property
    def mesh(self) -> torch.Tensor:
        """The device ids of this mesh; for a sub-mesh, its first group (see :func:`mesh_groups` for all)."""
        # remap_to_tensor gives every group: shape (groups, *self.shape). A root mesh has one group.
        return self._layout.remap_to_tensor(self._rank_map)[0]

    # torch builds sub-meshes with the base class, whose __init__ reads `mesh`
    # (and so the current rank); these two build this class instead.
    def _create_sub_mesh(self, layout: _MeshLayout, submesh_dim_names: tuple[str, ...]) -> DeviceMesh:
        root = self._get_root_mesh()
        return XlaDeviceMesh(
            self._device_type,
            _layout=layout,
            _rank_map=root._rank_map,
            mesh_dim_names=submesh_dim_names,
            _root_mesh=root,
            _init_backend=False,
        )

    def _create_flatten_mesh(self, mesh_dim_name: str, backend_override: Any = (None, None)) -> None:
        root = self._get_root_mesh()
        names = tuple(root._mesh_dim_names or ())
        if mesh_dim_name in names:
            raise DeviceMeshError(
                f"_flatten: mesh_dim_name {mesh_dim_name!r} is already a dim of the root mesh {names}; "
                "pass another name"
            )
        layout = _MeshLayout([self._layout.collapse()])
        known = root._flatten_mapping.get(mesh_dim_name)
        if known is not None:
            if known._layout == layout:
                return
            raise DeviceMeshError(
                f"_flatten: a flattened dim named {mesh_dim_name!r} already exists over other dims; pass another name"
            )
        root._flatten_mapping[mesh_dim_name] = XlaDeviceMesh(
            root._device_type,
            _layout=layout,
            _rank_map=root._rank_map,
            mesh_dim_names=(mesh_dim_name,),
            _root_mesh=root,
            _init_backend=False,
        )

    def _is_current_rank_part_of_mesh(self) -> bool:
        # torch's sharding propagation asks this; the controller takes part in every device of the mesh.
        return True

    def _sym_get_coordinate(self, index: int) -> int:
        # torch's redistribution-cost estimate (which picks among sharding
        # strategies) asks for this rank's coordinate to size uneven shards; the
        # controller answers as device 0 does, the largest block on every dim.
        return 0

    def get_rank(self) -> int:
        """Raises :class:`NoRankError` (there is no current rank)."""
        _no_rank("get_rank")

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """Raises :class:`NoRankError` (there is no current rank)."""
        _no_rank("get_local_rank")

    def get_coordinate(self) -> tuple[int, ...] | None:
        """Raises :class:`NoRankError` (there is no current rank)."""
        # torch.distributed.checkpoint's planners ask this of every DTensor they save or load.
        _no_rank(
            "get_coordinate",
            ". Saving or loading DTensors with torch.distributed.checkpoint: take the state dicts with "
            "spmdtorch.dtensor.get_model_state_dict / get_optimizer_state_dict (global xla tensors) and pass "
            "planner=spmdtorch.checkpoint.SPMDSavePlanner() / SPMDLoadPlanner()",
        )

    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """Raises :class:`NoRankError` (an xla mesh has no process groups)."""
        _no_rank(
            "get_group",
            " torch's fully_shard asks for this first: on an xla mesh use spmdtorch.dtensor.fully_shard (same "
            "signature), which lays the parameters out and lets XLA do FSDP's collectives.",
        )

    def get_all_groups(self) -> list[Any]:
        """Raises :class:`NoRankError` (an xla mesh has no process groups)."""
        _no_rank("get_all_groups")


def _check_shape(mesh_shape: Any) -> tuple[int, ...]:
    if isinstance(mesh_shape, int) and not isinstance(mesh_shape, bool):
        mesh_shape = (mesh_shape,)
    if not isinstance(mesh_shape, Sequence) or isinstance(mesh_shape, str) or not mesh_shape:
        raise DeviceMeshError(f"init_device_mesh: mesh_shape must be a non-empty tuple of ints, got {mesh_shape!r}")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in mesh_shape):
        raise DeviceMeshError(f"init_device_mesh: mesh_shape must hold positive ints, got {tuple(mesh_shape)!r}")
    return tuple(int(n) for n in mesh_shape)


def init_device_mesh(
    device_type: str | Sequence[int] = "xla",
    mesh_shape: Sequence[int] | None = None,
    *,
    mesh_dim_names: Sequence[str] | None = None,
    device_ids: Sequence[int] | None = None,
) -> XlaDeviceMesh:
    """A ``DeviceMesh`` of ``mesh_shape`` over every xla device, with no process group.

    Takes torch's signature (``init_device_mesh("xla", (2, 4),
    mesh_dim_names=("dp", "tp"))``, so porting code changes only the import) or
    the shape first (``init_device_mesh((2, 4), mesh_dim_names=...)``).

    Args:
        device_type: ``"xla"``, or the mesh shape.
        mesh_shape: the mesh shape; its product must be the global device count.
        mesh_dim_names: one unique name per mesh dim (needed for slicing by name).
        device_ids: the device ordinals in mesh order (default ``0..N-1``).

    Returns:
        An :class:`XlaDeviceMesh`.

    Raises:
        DeviceMeshError: another device type, a shape that does not cover
            every device, bad names or device ids.

    Example:
        >>> from spmdtorch.dtensor import init_device_mesh
        >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> mesh["tp"].shape, mesh["tp"].mesh.tolist()
        ((4,), [0, 1, 2, 3])
    """
    if not isinstance(device_type, str):
        if mesh_shape is not None or device_type is None:
            raise DeviceMeshError(
                f"init_device_mesh: device_type must be 'xla' (or the mesh shape, with no mesh_shape), got "
                f"{device_type!r}; call init_device_mesh('xla', shape) or init_device_mesh(shape)"
            )
        mesh_shape = device_type
        device_type = "xla"
    if device_type != "xla":
        raise DeviceMeshError(
            f"init_device_mesh: device_type is {device_type!r}; spmdtorch meshes are 'xla' meshes (tensors on "
            "device 'xla'). Use init_device_mesh('xla', shape), or torch's own init_device_mesh for other devices"
        )
    shape = _check_shape(mesh_shape)
    names = None
    if mesh_dim_names is not None:
        if isinstance(mesh_dim_names, str) or not isinstance(mesh_dim_names, Sequence):
            raise DeviceMeshError(
                f"init_device_mesh: mesh_dim_names must be a tuple of {len(shape)} unique strings, got "
                f"{mesh_dim_names!r}"
            )
        names = tuple(mesh_dim_names)
        if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise DeviceMeshError(
                f"init_device_mesh: mesh_dim_names must be {len(shape)} unique strings (one per dim of mesh_shape "
                f"{shape}), got {mesh_dim_names!r}"
            )
    count = runtime.global_runtime_device_count()
    ids = (
        list(range(count))
        if device_ids is None
        else list(_checks.check_int_sequence(device_ids, "init_device_mesh", "device_ids", DeviceMeshError, minimum=0))
    )
    size = 1
    for n in shape:
        size *= n
    if size != count or sorted(ids) != list(range(count)):
        raise DeviceMeshError(
            f"init_device_mesh: mesh_shape {shape} covers {size} devices and device_ids has {len(ids)}, but an SPMD "
            f"mesh spans all {count} devices once each; use a shape whose product is {count}"
        )
    return XlaDeviceMesh("xla", torch.tensor(ids, dtype=torch.int64).reshape(shape), mesh_dim_names=names)


def as_xla_mesh(device_mesh: Any, what: str = "device_mesh") -> XlaDeviceMesh:
    """``device_mesh`` as an :class:`XlaDeviceMesh` (a root mesh torch's ``init_device_mesh("xla", ...)`` made is converted).

    Raises:
        DeviceMeshError: not a ``DeviceMesh``, not an ``xla`` mesh, or a sub-mesh of a torch-built mesh.
    """
    if isinstance(device_mesh, XlaDeviceMesh):
        return device_mesh
    if not isinstance(device_mesh, DeviceMesh):
        raise DeviceMeshError(
            f"{what} must be a torch.distributed DeviceMesh over xla devices, got {type(device_mesh).__name__}; "
            "build one with spmdtorch.dtensor.init_device_mesh('xla', shape)"
        )
    if device_mesh.device_type != "xla":
        raise DeviceMeshError(
            f"{what} has device_type {device_mesh.device_type!r}, expected 'xla'; build it with "
            "spmdtorch.dtensor.init_device_mesh('xla', shape)"
        )
    if device_mesh._get_root_mesh() is not device_mesh:
        raise DeviceMeshError(
            f"{what} is a sub-mesh of a mesh torch built; build the root with spmdtorch.dtensor.init_device_mesh "
            "and slice that one"
        )
    return XlaDeviceMesh(
        "xla",
        _layout=device_mesh._layout,
        _rank_map=device_mesh._rank_map,
        mesh_dim_names=device_mesh.mesh_dim_names,
        _init_backend=False,
    )


def check_device_mesh(device_mesh: Any, func: str, param: str = "device_mesh") -> DeviceMesh:
    """``device_mesh`` if it is a torch ``DeviceMesh`` over xla devices, else :class:`DeviceMeshError` naming ``param``."""
    if not isinstance(device_mesh, DeviceMesh) or device_mesh.device_type != "xla":
        _checks.fail(
            DeviceMeshError,
            func,
            param,
            "a torch.distributed DeviceMesh over xla devices",
            device_mesh,
            "build one with spmdtorch.dtensor.init_device_mesh('xla', shape)",
        )
    return device_mesh


def root_axes(device_mesh: DeviceMesh) -> tuple[tuple[int, ...], ...]:
    """For each dim of ``device_mesh``, the dims of its root mesh it spans (several for a flattened dim).

    Example:
        >>> from spmdtorch.dtensor import init_device_mesh
        >>> mesh = init_device_mesh("xla", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        >>> root_axes(mesh["dp", "tp"]), root_axes(mesh["dp", "cp"]._flatten())
        (((0,), (2,)), ((0, 1),))

    Raises:
        DeviceMeshError: a dim that no set of root dims makes up.
    """
    cached = getattr(device_mesh, "_spmdtorch_root_axes", None)
    if cached is not None:
        return cast(tuple[tuple[int, ...], ...], cached)
    check_device_mesh(device_mesh, "root_axes")
    root = device_mesh._get_root_mesh()
    root_layout = root._layout
    out = []
    for j, axis in enumerate(device_mesh._layout):
        # Layouts are stored in a canonical (coalesced) form, so equal layouts compare equal.
        found = None
        for k in range(1, len(root_layout) + 1):
            for dims in itertools.combinations(range(len(root_layout)), k):
                if _MeshLayout([root_layout[d] for d in dims]).collapse() == axis:
                    found = dims
                    break
            if found is not None:
                break
        if found is None:
            raise DeviceMeshError(
                f"mesh dim {j} of {device_mesh} is not made of dims of its root mesh {root}; slice or flatten the "
                "root mesh to get it"
            )
        out.append(found)
    result = tuple(out)
    # Asked once per op result: kept on the mesh (a mesh's layout never changes).
    device_mesh._spmdtorch_root_axes = result  # type: ignore[attr-defined]
    return result


def spans_root(device_mesh: DeviceMesh) -> bool:
    """Whether ``device_mesh``'s dims cover every dim of its root mesh (False for ``mesh["tp"]`` of a dp x tp mesh)."""
    covered = {d for dims in root_axes(device_mesh) for d in dims}
    return len(covered) == device_mesh._get_root_mesh().ndim


def spmd_mesh(device_mesh: DeviceMesh) -> Mesh:
    """The spmdtorch :class:`~spmdtorch.mesh.Mesh` of ``device_mesh``'s root mesh: same device order, shape, names.

    Example:
        >>> from spmdtorch.dtensor import init_device_mesh
        >>> spmd_mesh(init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))["tp"])
        Mesh(device_ids=range(8), mesh_shape=(2, 4), axis_names=('dp', 'tp'))
    """
    root = check_device_mesh(device_mesh, "spmd_mesh")._get_root_mesh()
    cached = getattr(root, "_spmdtorch_mesh", None)
    if cached is not None:
        return cast(Mesh, cached)
    ids = [int(i) for i in root._layout.remap_to_tensor(root._rank_map)[0].flatten().tolist()]
    try:
        mesh = Mesh(ids, tuple(root.shape), root.mesh_dim_names)
    except MeshError as e:
        raise DeviceMeshError(f"the DeviceMesh {root} has no spmdtorch mesh: {e}") from e
    root._spmdtorch_mesh = mesh  # type: ignore[attr-defined]  # every annotation asks: built once per root mesh
    return mesh


def mesh_groups(device_mesh: DeviceMesh) -> torch.Tensor:
    """Every group of a (sub-)mesh at once: shape ``(groups, *device_mesh.shape)`` of device ids.

    Example:
        >>> from spmdtorch.dtensor import init_device_mesh
        >>> mesh_groups(init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))["dp"]).tolist()
        [[0, 4], [1, 5], [2, 6], [3, 7]]
    """
    check_device_mesh(device_mesh, "mesh_groups")
    return device_mesh._layout.remap_to_tensor(device_mesh._rank_map)
