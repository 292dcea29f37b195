"""PyTorch/XLA's SPMD-mode names (one logical device per process), auto-sharding, memory, rendezvous."""

from __future__ import annotations

import dataclasses
import os

import jax

from spmdtorch import _checks, config
from spmdtorch._checks import ArgumentError, ArgumentTypeError
from spmdtorch.config import RuntimeConfigError
from spmdtorch.runtime._devices import (
    addressable_runtime_device_count,
    global_runtime_device_count,
    local_jax_devices,
    process_count,
    process_index,
)

# --------------------------------------------------------------------------
# PyTorch/XLA's SPMD-mode names: one logical device per process
# --------------------------------------------------------------------------
# In PyTorch/XLA's SPMD mode every process drives all its devices through one
# virtual device, and its runtime names count those virtual devices
# (pytorch/xla#5129): ``world_size()`` is the number of processes,
# ``addressable_device_count()`` is 1, ``global_ordinal()`` is the process
# index. spmdtorch is always in that mode, so these names mean exactly that;
# the physical devices are counted by the ``*_runtime_device_count`` names.


class SpmdModeError(RuntimeConfigError):
    """A mode spmdtorch does not have was asked for (non-SPMD execution), or auto-sharding's mesh does not fit."""


@dataclasses.dataclass(frozen=True, slots=True)
class AutoSharding:
    """spmdtorch's auto-sharding mode, as in force when a program is compiled.

    A heuristic, not XLA's cost-model solver: each large default-placed input
    is sharded along its largest evenly divisible dimension over this mesh
    (``spmdtorch.plan``'s input placement policy); XLA propagates the rest.

    Attributes:
        mesh_shape: the auto mesh's axis sizes (``XLA_AUTO_SPMD_MESH``, else
            one axis of all devices); their product must be the device count
            (checked when an input is placed on the mesh).
    """

    mesh_shape: tuple[int, ...]


#: Whether ``use_spmd(auto=True)`` / :func:`set_auto_sharding` turned auto-sharding on (engine-wide).
_AUTO_SHARDING = [False]


def use_spmd(auto: bool | None = False) -> None:
    """Accepts PyTorch/XLA's switch into SPMD mode (spmdtorch is always in it); ``auto=True`` turns on auto-sharding.

    Args:
        auto: turn on spmdtorch's auto-sharding (see :class:`AutoSharding`):
            from the next compilation, unannotated replicated inputs of at
            least :data:`AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE` elements per
            device are sharded once by a simple rule. False/None leaves the
            mode as it is (as PyTorch/XLA's ``use_spmd()`` does); turn it off
            with :func:`set_auto_sharding`.

    Raises:
        ArgumentTypeError: ``auto`` is not a bool or None.

    Example:
        >>> use_spmd(); is_spmd()
        True
    """
    if auto is not None and _checks.check_bool(auto, "use_spmd", "auto", ArgumentTypeError):
        _AUTO_SHARDING[0] = True


#: An input is auto-sharded only when it has at least this many elements per device (smaller
#: ones cost more in collectives than they save in memory).
AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE = 2


def set_auto_sharding(enabled: bool) -> None:
    """Turn spmdtorch's auto-sharding on or off for the programs compiled from now on.

    Inputs already re-placed keep their placement (a later ``mark_sharding``
    still replaces it).

    Raises:
        ArgumentTypeError: ``enabled`` is not a bool.
    """
    _AUTO_SHARDING[0] = _checks.check_bool(enabled, "set_auto_sharding", "enabled", ArgumentTypeError)


def auto_sharding_enabled() -> bool:
    """Whether auto-sharding is on (``use_spmd(auto=True)``); reads no environment.

    Example:
        >>> isinstance(auto_sharding_enabled(), bool)
        True
    """
    return _AUTO_SHARDING[0]


def auto_sharding() -> AutoSharding | None:
    """The auto-sharding mode in force now (None: off), its mesh read from ``XLA_AUTO_SPMD_MESH`` now.

    The mesh shape is checked against the devices where it is used (when an
    input is placed on it), so a graph can be hashed or inspected under any
    setting, as in PyTorch/XLA.

    Raises:
        spmdtorch.config.ConfigError: ``XLA_AUTO_SPMD_MESH`` is malformed.
    """
    if not _AUTO_SHARDING[0]:
        return None
    shape: tuple[int, ...] | None = config.read_one("xla_auto_spmd_mesh")
    return AutoSharding((global_runtime_device_count(),) if shape is None else shape)


def is_spmd() -> bool:
    """Always True: every spmdtorch program is one SPMD program over all devices.

    Example:
        >>> is_spmd()
        True
    """
    return True


def world_size() -> int:
    """Number of logical devices in the job, one per process (PyTorch/XLA's SPMD ``world_size``).

    Use it where PyTorch/XLA code splits data per process (a
    ``DistributedSampler``'s ``num_replicas``); the number of physical devices
    is :func:`global_runtime_device_count`.

    Example:
        >>> world_size() == process_count()
        True
    """
    return process_count()


def global_ordinal() -> int:
    """This process's logical device's index in the job, i.e. :func:`process_index`.

    Example:
        >>> global_ordinal()
        0
    """
    return process_index()


def local_process_count() -> int:
    """Processes of this job on this host: torchrun's ``LOCAL_WORLD_SIZE``, else 1.

    Raises:
        spmdtorch.config.ConfigError: ``LOCAL_WORLD_SIZE`` is malformed.

    Example:
        >>> local_process_count()   # doctest: +SKIP
        1
    """
    count: int | None = config.read_one("local_world_size")
    return 1 if count is None else count


def local_ordinal() -> int:
    """This process's logical device's index on this host: torchrun's ``LOCAL_RANK``, else 0.

    Example:
        >>> local_ordinal()   # doctest: +SKIP
        0
    """
    rank: int | None = config.read_one("local_rank")
    return 0 if rank is None else rank


def addressable_device_count() -> int:
    """Logical devices this process addresses: 1 (its SPMD virtual device).

    The physical count is :func:`addressable_runtime_device_count`.

    Example:
        >>> addressable_device_count()
        1
    """
    return 1


def global_device_count() -> int:
    """Logical devices in the job: one per process (physical: :func:`global_runtime_device_count`).

    Example:
        >>> global_device_count() == process_count()
        True
    """
    return process_count()


def local_device_count() -> int:
    """Logical devices on this host: :func:`local_process_count` x :func:`addressable_device_count`.

    Example:
        >>> local_device_count()   # doctest: +SKIP
        1
    """
    return local_process_count() * addressable_device_count()


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryInfo:
    """Memory of one device, in bytes.

    Attributes:
        bytes_used: bytes in use now.
        bytes_limit: bytes the device can hold.
        peak_bytes_used: most bytes in use at once so far (on CPU, where JAX
            keeps no statistics: the live arrays now, as ``bytes_used``).
    """

    bytes_used: int
    bytes_limit: int
    peak_bytes_used: int


def _host_memory_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0


def memory_info(index: int | None = None) -> MemoryInfo:
    """Memory in use on addressable device ``index`` (default 0): PyTorch/XLA's ``get_memory_info``.

    GPU and TPU report the allocator's statistics. JAX keeps none for CPU
    devices: there ``bytes_used`` (and ``peak_bytes_used``) sum the live
    arrays' shards on that device and ``bytes_limit`` is the host's memory.

    Raises:
        ArgumentError: ``index`` is not an addressable device's index (a
            ``ValueError``; ``ArgumentTypeError`` when not an int).

    Example:
        >>> memory_info().bytes_limit > 0
        True
    """
    index = 0 if index is None else index
    if not _checks.is_int(index):
        _checks.fail(ArgumentTypeError, "memory_info", "index", "an int or None", index)
    count = addressable_runtime_device_count()
    if not 0 <= index < count:
        _checks.fail(
            ArgumentError,
            "memory_info",
            "index",
            f"an addressable device's index, 0..{count - 1}",
            index,
            f"this process has {count} addressable device(s)",
        )
    dev = local_jax_devices()[index]
    stats = dev.memory_stats()
    if stats:
        used = int(stats.get("bytes_in_use", 0))
        return MemoryInfo(used, int(stats.get("bytes_limit", 0)), int(stats.get("peak_bytes_in_use", used)))
    used = 0
    for arr in jax.live_arrays():
        for shard in arr.addressable_shards:
            if shard.device == dev:
                used += int(shard.data.nbytes)
    return MemoryInfo(used, _host_memory_bytes(), used)


def rendezvous(tag: str, payload: bytes = b"") -> list[bytes]:
    """Every process's ``payload``, in process order, once all processes reach ``tag``.

    PyTorch/XLA's ``xm.rendezvous``: a barrier that also exchanges bytes.
    Every process of the job must call it with the same ``tag``. In a job
    of one process it returns ``[payload]`` at once.

    Raises:
        ArgumentTypeError: ``tag`` is not a str or ``payload`` not bytes (a ``TypeError``).
        ArgumentError: ``tag`` is empty.

    Example:
        >>> rendezvous("init", b"hi")
        [b'hi']
    """
    _checks.check_str(tag, "rendezvous", "tag", ArgumentTypeError)
    _checks.check_str(tag, "rendezvous", "tag", ArgumentError, nonempty=True)
    _checks.check_instance(
        payload, (bytes, bytearray), "rendezvous", "payload", ArgumentTypeError, "bytes", "encode a str with .encode()"
    )
    if process_count() == 1:
        return [bytes(payload)]
    import numpy as np
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(f"spmdtorch.rendezvous:{tag}")
    sizes = multihost_utils.process_allgather(np.array([len(payload)], dtype=np.int32))
    longest = max(1, int(np.max(sizes)))
    buf = np.zeros((longest,), dtype=np.uint8)
    buf[: len(payload)] = np.frombuffer(bytes(payload), dtype=np.uint8)
    gathered = multihost_utils.process_allgather(buf)
    return [bytes(gathered[i, : int(sizes[i].reshape(-1)[0])].tobytes()) for i in range(gathered.shape[0])]
