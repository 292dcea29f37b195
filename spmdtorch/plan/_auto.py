"""spmdtorch's auto-sharding: the input placement rule behind ``runtime.use_spmd(auto=True)``.

A heuristic, not XLA's cost-model auto-sharding pass (which needs a solver this
build of XLA does not have): when a program is compiled in auto mode, every
input that is replicated by default, not annotated by the user, and has at
least :data:`spmdtorch.runtime.AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE` elements
per device is sharded once along its largest dimension that the auto mesh (or,
failing that, one of its axes) divides evenly; XLA's sharding propagation
places everything computed from it. The executor re-places each chosen input
for every tensor holding it, and the tensor keeps that placement (it is not an
annotation: ``mark_sharding`` still replaces it). See docs/design.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spmdtorch import _checks, runtime
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import executor

__all__ = ["AUTO_SHARDING_COUNTER", "auto_input_placement", "auto_partition_spec"]

#: The metric counted for each compilation in auto mode (PyTorch/XLA's name).
AUTO_SHARDING_COUNTER = "CompileWithAutoSharding"


def auto_partition_spec(shape: Sequence[int], axes: dict[str, int]) -> PartitionSpec | None:
    """The auto rule's spec for an array of ``shape`` over a mesh with ``axes`` (name -> size), or None.

    The whole mesh is tried first, then each axis alone (largest first); for
    each, the array's dimensions from largest to smallest (ties: the first),
    and the first dimension it divides evenly is sharded over it. None: no
    dimension fits (the array stays replicated).

    Example:
        >>> auto_partition_spec((64, 128), {"x": 8}) == PartitionSpec(None, "x")
        True
        >>> auto_partition_spec((6, 16), {"a": 2, "b": 4}) == PartitionSpec(None, ("a", "b"))
        True
        >>> auto_partition_spec((6, 12), {"a": 2, "b": 4}) == PartitionSpec(None, "b")
        True
        >>> auto_partition_spec((3, 5), {"x": 8}) is None
        True

    Raises:
        spmdtorch.ArgumentTypeError: ``shape`` is not a sequence of ints >= 0,
            or ``axes`` not a dict of str -> int >= 1.
    """
    shape = _checks.check_int_sequence(shape, "auto_partition_spec", "shape", ArgumentTypeError, minimum=0)
    if not isinstance(axes, dict):
        _checks.fail(ArgumentTypeError, "auto_partition_spec", "axes", "a dict of mesh axis name -> size", axes)
    for name, size in axes.items():
        _checks.check_str(name, "auto_partition_spec", "axes (a key)", ArgumentTypeError, nonempty=True)
        _checks.check_int(size, "auto_partition_spec", f"axes[{name!r}]", ArgumentTypeError, minimum=1)
    names = tuple(axes)
    total = int(np.prod([axes[n] for n in names])) if names else 1
    groups: list[tuple[tuple[str, ...], int]] = [(names, total)]
    if len(names) > 1:
        groups += [((n,), axes[n]) for n in sorted(names, key=lambda n: -axes[n])]
    dims = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
    for group, size in groups:
        if size <= 1:
            continue
        for d in dims:
            if shape[d] >= size and shape[d] % size == 0:
                entry: str | tuple[str, ...] = group[0] if len(group) == 1 else group
                return PartitionSpec(*(entry if i == d else None for i in range(len(shape))))
    return None


def _auto_mesh(home: Mesh, shape: tuple[int, ...]) -> Mesh:
    """The auto mesh: the default placement's own 1-D mesh, or its devices in ``shape``.

    Raises:
        spmdtorch.runtime.SpmdModeError: ``shape`` does not hold exactly the devices.
    """
    n = home.devices.size
    if int(np.prod(shape)) != n:
        raise runtime.SpmdModeError(
            f"XLA_AUTO_SPMD_MESH={','.join(map(str, shape))} has {int(np.prod(shape))} devices, expected {n} "
            f"(the device count); set it to axis sizes whose product is {n} (e.g. {n} or 2,{max(n // 2, 1)}), "
            "or unset it for a 1-D mesh of all devices"
        )
    if len(shape) == 1:
        # The default mesh itself: a program with no user mesh then needs no re-homing.
        return home
    return Mesh(np.asarray(home.devices).reshape(shape), tuple(f"auto_{i}" for i in range(len(shape))))


def auto_input_placement(candidates: list[jax.Array], user_mesh: Mesh | None = None) -> executor.InputPlacement | None:
    """The executor's input placement for auto mode (None: auto mode is off).

    ``candidates`` are replicated on the default placement's mesh (all
    devices), whose size sets the threshold. ``user_mesh``: the mesh the
    program already uses through the user's annotations; one program has one
    mesh, so the inputs are then placed on it instead of the auto mesh.

    Raises:
        spmdtorch.runtime.SpmdModeError: ``XLA_AUTO_SPMD_MESH`` does not fit the devices.
        spmdtorch.config.ConfigError: ``XLA_AUTO_SPMD_MESH`` is malformed.
    """
    mode = runtime.auto_sharding()
    if mode is None:  # switched off (another thread) since the executor asked
        return None
    targets: dict[int, jax.sharding.Sharding] = {}
    large = [
        k
        for k, a in enumerate(candidates)
        if a.size >= runtime.AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE * len(a.sharding.device_set)
    ]
    if large:
        # Built (and checked) only when an input is to be placed on it.
        home = cast(Mesh, cast(NamedSharding, candidates[large[0]].sharding).mesh)  # the executor passes these only
        mesh = user_mesh if user_mesh is not None else _auto_mesh(home, mode.mesh_shape)
        axes = dict(mesh.shape)
        for k in large:
            spec = auto_partition_spec(tuple(candidates[k].shape), axes)
            if spec is not None:
                targets[k] = NamedSharding(mesh, spec)
    return executor.InputPlacement(("auto", mode.mesh_shape), AUTO_SHARDING_COUNTER, targets)


executor.INPUT_PLACEMENT_POLICIES.append(
    executor.InputPlacementPolicy(runtime.auto_sharding_enabled, auto_input_placement)
)
