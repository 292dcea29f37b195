"""Runtime queries and configuration: devices, process counts, compile cache.

This module is spmdtorch's counterpart of ``torch_xla.runtime``. It is a thin,
honest layer over JAX's runtime: every count and index comes straight from
``jax``, and the ``torch.device`` objects it hands out are the ``xla:N``
devices that spmdtorch tensors report.

Example:
    >>> import spmdtorch.runtime as xr
    >>> xr.device()
    device(type='xla', index=0)
    >>> xr.device_type()          # doctest: +SKIP
    'CPU'
    >>> xr.global_runtime_device_count()   # doctest: +SKIP
    8

Environment:
    ``PJRT_DEVICE`` is honoured the way PyTorch/XLA honours it: ``CPU``,
    ``CUDA`` (or its alias ``GPU``) or ``TPU``. When it is set before any JAX
    backend starts, :func:`_apply_pjrt_device_env` (called when ``spmdtorch``
    is imported) points JAX at that platform via ``JAX_PLATFORMS``.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import socket
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import torch

from spmdtorch import _checks, _cluster, _faults, _jax_private, config
from spmdtorch._checks import ArgumentError, ArgumentTypeError
from spmdtorch._faults import PEER_LOST_EXIT_STATUS, PeerLostError
from spmdtorch.config import DistributedInitError, InvalidPjrtDeviceError, RuntimeConfigError

__all__ = [
    "DistributedConfig",
    "DistributedInitError",
    "GatherTooLargeError",
    "InvalidPjrtDeviceError",
    "MemoryInfo",
    "PEER_LOST_EXIT_STATUS",
    "PeerLostError",
    "RuntimeConfigError",
    "AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE",
    "AutoSharding",
    "SpmdModeError",
    "addressable_device_count",
    "addressable_runtime_device_count",
    "auto_initialize_distributed",
    "auto_sharding",
    "auto_sharding_enabled",
    "device",
    "device_count",
    "device_type",
    "devices",
    "global_device_count",
    "global_ordinal",
    "global_runtime_device_count",
    "initialize_cache",
    "initialize_distributed",
    "is_distributed_initialized",
    "is_spmd",
    "jax_devices",
    "local_device_count",
    "local_jax_devices",
    "local_ordinal",
    "local_process_count",
    "max_gather_bytes",
    "memory_info",
    "process_count",
    "process_index",
    "rendezvous",
    "resolve_distributed_config",
    "set_auto_sharding",
    "set_max_gather_bytes",
    "use_spmd",
    "world_size",
]

#: The torch device type that spmdtorch tensors report.
DEVICE_TYPE = "xla"

#: Accepted ``PJRT_DEVICE`` values and the device type each one means (parsed by ``spmdtorch.config``).
_PJRT_DEVICE_ALIASES = config.PJRT_DEVICE_ALIASES

#: Device type -> the platform name ``JAX_PLATFORMS`` expects.
_JAX_PLATFORM_FOR_TYPE = {"CPU": "cpu", "CUDA": "cuda", "TPU": "tpu"}

#: ``jax.Device.platform`` / ``JAX_PLATFORMS`` entry -> device type.
_TYPE_FOR_JAX_PLATFORM = {"cpu": "CPU", "gpu": "CUDA", "cuda": "CUDA", "tpu": "TPU"}


# RuntimeConfigError, InvalidPjrtDeviceError and DistributedInitError are
# defined in spmdtorch.config (which raises them for malformed variables) and
# re-exported here, where users have always found them.


# --------------------------------------------------------------------------
# Environment handling
# --------------------------------------------------------------------------


def _pjrt_device_from_env() -> str | None:
    """Returns the device type named by ``PJRT_DEVICE``, normalised, or None.

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` is set to an unknown value.
    """
    # Read at the call, not from the process snapshot: the user may set it
    # before the first device query (tests do), as with PyTorch/XLA.
    device: str | None = config.read_one("pjrt_device")
    return device


def _backends_initialized() -> bool:
    """Whether JAX has already created its backends (platform is then fixed)."""
    return _jax_private.backends_initialized()


def _type_of_platform(platform: str) -> str:
    """Maps a JAX platform name ("cpu", "gpu", ...) to a device type name."""
    return _TYPE_FOR_JAX_PLATFORM.get(platform.lower(), platform.upper())


def _apply_pjrt_device_env() -> str | None:
    """Points JAX at the platform named by ``PJRT_DEVICE``, if it is set.

    ``spmdtorch/__init__.py`` calls this at import. It only acts while no JAX
    backend has started: it then sets ``JAX_PLATFORMS`` in the environment
    (inherited by child processes) and the ``jax_platforms`` config option
    (which JAX read from the environment when it was imported).

    Returns:
        The JAX platform name it configured (``"cpu"``, ``"cuda"`` or
        ``"tpu"``), or None when it changed nothing.

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` has an unsupported value.
        RuntimeConfigError: ``JAX_PLATFORMS`` (or ``jax_platforms``) is already
            set to a different platform than ``PJRT_DEVICE`` asks for.

    Example:
        >>> import os
        >>> os.environ["PJRT_DEVICE"] = "CPU"   # before any JAX computation
        >>> _apply_pjrt_device_env()            # doctest: +SKIP
        'cpu'
    """
    wanted = _pjrt_device_from_env()
    if wanted is None:
        return None
    platform = _JAX_PLATFORM_FOR_TYPE[wanted]

    if _backends_initialized():
        actual = _type_of_platform(jax.default_backend())
        if actual != wanted:
            warnings.warn(
                f"PJRT_DEVICE={wanted!r} is ignored: JAX has "
                f"already started on {actual}. Set PJRT_DEVICE before the first "
                "JAX computation (e.g. before importing spmdtorch).",
                RuntimeWarning,
                stacklevel=2,
            )
        return None

    # jax.config's per-flag attributes are set at run time, so untyped (jax_platforms
    # has a context manager, so jax.config.read refuses it).
    existing = os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms  # type: ignore[attr-defined]
    if existing:
        first = existing.split(",")[0].strip()
        if _type_of_platform(first) != wanted:
            raise RuntimeConfigError(
                f"PJRT_DEVICE={wanted!r} conflicts with JAX_PLATFORMS={existing!r}; unset one of them."
            )
        # Already consistent: keep the user's (possibly longer) list.
        if jax.config.jax_platforms != existing:  # type: ignore[attr-defined]  # see above
            jax.config.update("jax_platforms", existing)
        return None

    os.environ["JAX_PLATFORMS"] = platform
    jax.config.update("jax_platforms", platform)
    return platform


# --------------------------------------------------------------------------
# Devices and counts
# --------------------------------------------------------------------------


def jax_devices() -> list[jax.Device]:
    """Returns every JAX device of the job (all processes), ``jax.devices()``.

    Example:
        >>> len(jax_devices()) == global_runtime_device_count()
        True
    """
    return list(jax.devices())


def local_jax_devices() -> list[jax.Device]:
    """Returns the JAX devices this process can address, ``jax.local_devices()``.

    Example:
        >>> len(local_jax_devices()) == addressable_runtime_device_count()
        True
    """
    return list(jax.local_devices())


def global_runtime_device_count() -> int:
    """Returns the number of devices across all processes of the job.

    Example:
        >>> global_runtime_device_count() >= 1
        True
    """
    return jax.device_count()


def addressable_runtime_device_count() -> int:
    """Returns the number of devices this process can address.

    Example:
        >>> addressable_runtime_device_count() >= 1
        True
    """
    return jax.local_device_count()


def device_count() -> int:
    """Returns the number of addressable (local) devices.

    Same as :func:`addressable_runtime_device_count`; kept for code that
    calls ``xr.device_count()`` / ``torch.cuda.device_count()``-style APIs.

    Example:
        >>> device_count() == addressable_runtime_device_count()
        True
    """
    return addressable_runtime_device_count()


def process_index() -> int:
    """Returns this process's index in a multi-process job (0 when alone).

    Example:
        >>> process_index()
        0
    """
    return jax.process_index()


def process_count() -> int:
    """Returns the number of processes in the job (1 when alone).

    Example:
        >>> process_count()
        1
    """
    count: int = jax.process_count()  # typed Any by jax
    return count


def device(index: int | None = None) -> torch.device:
    """Returns the ``torch.device`` for an addressable device, ``xla:<index>``.

    Args:
        index: Local device ordinal; defaults to 0.

    Returns:
        ``torch.device("xla", index)``.

    Raises:
        TypeError: ``index`` is not an int.
        ValueError: ``index`` is negative or not below the number of
            addressable devices.

    Example:
        >>> device()
        device(type='xla', index=0)
        >>> device(1)                # with at least 2 devices
        device(type='xla', index=1)
    """
    if index is None:
        index = 0
    if isinstance(index, bool) or not isinstance(index, int):
        raise ArgumentTypeError(f"device index must be an int, got {type(index).__name__}")
    count = addressable_runtime_device_count()
    if index < 0 or index >= count:
        raise ArgumentError(
            f"device index {index} is out of range: this process has {count} "
            f"addressable device(s) (valid indices 0..{count - 1})"
        )
    return torch.device(DEVICE_TYPE, index)


def devices() -> list[torch.device]:
    """Returns one ``torch.device`` (``xla:i``) per addressable device.

    Example:
        >>> devices()[0]
        device(type='xla', index=0)
    """
    return [torch.device(DEVICE_TYPE, i) for i in range(addressable_runtime_device_count())]


def device_type() -> str:
    """Returns the accelerator type: ``"CPU"``, ``"CUDA"`` or ``"TPU"``.

    ``PJRT_DEVICE`` wins when set (``GPU`` is reported as ``"CUDA"``) and
    then no JAX backend is started. Otherwise the platform of the first JAX
    device decides. A platform spmdtorch has no name for is returned
    upper-cased (e.g. ``"METAL"``).

    Raises:
        InvalidPjrtDeviceError: ``PJRT_DEVICE`` has an unsupported value.
        RuntimeConfigError: ``PJRT_DEVICE`` names one type but JAX is already
            running on another.

    Example:
        >>> device_type()            # doctest: +SKIP
        'CPU'
    """
    wanted = _pjrt_device_from_env()
    if wanted is not None:
        if _backends_initialized():
            actual = _type_of_platform(jax.default_backend())
            if actual != wanted:
                raise RuntimeConfigError(
                    f"PJRT_DEVICE={wanted!r} but JAX is running "
                    f"on {actual}; set PJRT_DEVICE before the first JAX computation."
                )
        return wanted
    return _type_of_platform(jax.devices()[0].platform)


# --------------------------------------------------------------------------
# Persistent compilation cache
# --------------------------------------------------------------------------


def initialize_cache(path: str | os.PathLike[str], readonly: bool = False) -> None:
    """Turns on JAX's persistent compilation cache in directory ``path``.

    Compiled XLA executables are stored in ``path`` and looked up there before
    compiling, so a restarted training job skips recompilation. Every program
    is cached, however small or fast to compile (JAX's default skips programs
    that compile in under a second).

    ``readonly=True`` reads existing entries but never adds one: JAX has no
    read-only switch, so this sets the minimum compile time for writing to
    infinity and keeps size-based eviction off (it would write access-time
    files). Use it on every worker but one when several share a cache
    directory. Two limits remain, both JAX's: JAX creates ``path`` if it does
    not exist, and on GPU, XLA's per-fusion autotuning cache (a subdirectory
    of ``path``) is still updated by process 0 (turning that cache off would
    change the cache keys, so no entry written by a writer would ever match).

    The cache applies to programs compiled after this call; programs already
    compiled in this process stay in memory and are not written. Calling it
    again switches to the new settings for later compilations.

    Args:
        path: Cache directory (local path, or a URL that JAX's ``etils.epath``
            support understands, e.g. ``gs://...``).
        readonly: Read entries but never write them.

    Raises:
        ArgumentError: ``path`` is empty or not a path, or ``readonly`` not a bool
            (a ``ValueError``; ``ArgumentTypeError``, also a ``TypeError``, for a wrong type).

    Example:
        >>> import spmdtorch.runtime as xr
        >>> xr.initialize_cache("/tmp/spmdtorch_cache")          # doctest: +SKIP
        >>> xr.initialize_cache("/shared/cache", readonly=True)  # doctest: +SKIP
    """
    path = os.fspath(_checks.check_path(path, "initialize_cache", "path", ArgumentTypeError))
    readonly = _checks.check_bool(readonly, "initialize_cache", "readonly", ArgumentTypeError)

    from jax.experimental.compilation_cache import compilation_cache as cc

    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    # -1 means "no size threshold, and let no backend override it".
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    if readonly:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
        jax.config.update("jax_compilation_cache_max_size", -1)
    else:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # JAX opens its cache once per process; drop it so the settings above
    # (notably a new path) take effect at the next compilation.
    cc.reset_cache()


# --------------------------------------------------------------------------
# Multi-process (multi-host) runs
# --------------------------------------------------------------------------

#: Environment variables that :func:`initialize_distributed` reads; the local
#: launcher (``python -m spmdtorch.launch``) sets them for every process.
ENV_COORDINATOR_ADDRESS = "SPMDTORCH_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES = "SPMDTORCH_NUM_PROCESSES"
ENV_PROCESS_ID = "SPMDTORCH_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "SPMDTORCH_LOCAL_DEVICE_IDS"
ENV_COORDINATOR_PORT = "SPMDTORCH_COORDINATOR_PORT"
ENV_HEARTBEAT_TIMEOUT = "SPMDTORCH_HEARTBEAT_TIMEOUT"
ENV_INIT_TIMEOUT = "SPMDTORCH_INIT_TIMEOUT"

#: Seconds without a heartbeat after which a peer counts as dead (JAX's default).
DEFAULT_HEARTBEAT_TIMEOUT_S = 100
#: Seconds to wait for every process to join (JAX's default).
DEFAULT_INIT_TIMEOUT_S = 300
#: Seconds a process other than 0 waits for the coordinator to accept a connection.
DEFAULT_CONNECT_TIMEOUT_S = 120
ENV_CONNECT_TIMEOUT = "SPMDTORCH_CONNECT_TIMEOUT"
#: Set in a process once it joined: its subprocesses inherit the launcher's variables but must not join.
ENV_JOINED_PID = "SPMDTORCH_JOINED_PID"
ENV_LAUNCH_FINISHED_DIR = "SPMDTORCH_LAUNCH_FINISHED_DIR"
ENV_AUTO_DISTRIBUTED = "SPMDTORCH_AUTO_DISTRIBUTED"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joined (or did not join) a multi-process job.

    Attributes:
        coordinator_address: ``host:port`` of process 0's coordinator, or None
            when JAX detected the cluster itself (TPU metadata, Slurm, MPI) or
            the job is a single process.
        num_processes: Number of processes, or None when JAX detected it.
        process_id: This process's index, or None when JAX detected it.
        local_device_ids: Devices this process may use (GPU only), or None.
        source: Where the settings came from: ``"arguments"``,
            ``"SPMDTORCH_*"`` (the local launcher), ``"torchrun"``
            (``MASTER_ADDR``/``RANK``/``WORLD_SIZE``), ``"jax"`` (JAX's cluster
            detection) or ``"single-process"`` (nothing found: one process).
        heartbeat_timeout_s: Seconds after which a silent peer is declared
            dead and every other process stops with an error.

    Example:
        >>> DistributedConfig("10.0.0.1:1234", 2, 0, None, "arguments", 100).num_processes
        2
    """

    coordinator_address: str | None
    num_processes: int | None
    process_id: int | None
    local_device_ids: tuple[int, ...] | None
    source: str
    heartbeat_timeout_s: int = DEFAULT_HEARTBEAT_TIMEOUT_S


_DISTRIBUTED: list[DistributedConfig | None] = [None]  # the DistributedConfig this process initialised with


def _torchrun_address(env: Mapping[str, str]) -> str:
    """``MASTER_ADDR:port`` for JAX's coordinator when torchrun started us.

    torchrun's agent hosts its own TCPStore on ``MASTER_PORT`` when it sets
    ``TORCHELASTIC_USE_AGENT_STORE=True``, so the coordinator then takes the
    next port. ``SPMDTORCH_COORDINATOR_PORT`` overrides both.
    """
    port = config.read_one("coordinator_port", env)
    if port is None:
        master_port = config.read_one("master_port", env)
        if master_port is None:
            raise DistributedInitError(
                "MASTER_ADDR is set but MASTER_PORT is not; set MASTER_PORT (or "
                f"{ENV_COORDINATOR_PORT}) to the port process 0 should listen on"
            )
        port = master_port + 1 if config.read_one("torchelastic_agent_store", env) else master_port
    return f"{config.read_one('master_addr', env)}:{port}"


def resolve_distributed_config(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: int | Sequence[int] | None = None,
    *,
    heartbeat_timeout_s: int | None = None,
    env: Mapping[str, str] | None = None,
) -> DistributedConfig:
    """Works out the settings :func:`initialize_distributed` will use (no side effects).

    Each argument left None is taken from the first of these that is set:
    ``SPMDTORCH_COORDINATOR_ADDRESS`` / ``SPMDTORCH_NUM_PROCESSES`` /
    ``SPMDTORCH_PROCESS_ID`` (set by ``python -m spmdtorch.launch``), then
    torchrun's ``MASTER_ADDR`` / ``MASTER_PORT`` / ``WORLD_SIZE`` / ``RANK``
    (with ``LOCAL_RANK`` as the local device when several processes share a
    host). When neither is set, JAX's own cluster detection decides
    (``source="jax"``): Cloud TPU metadata, Slurm, Open MPI, Kubernetes, and
    ``JAX_COORDINATOR_ADDRESS``.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: Number of processes in the job.
        process_id: This process's index, ``0 <= process_id < num_processes``.
        local_device_ids: Device ids this process may use (GPU).
        heartbeat_timeout_s: Seconds without a heartbeat before a peer is
            declared dead; default ``SPMDTORCH_HEARTBEAT_TIMEOUT`` or 100.
        env: Mapping to read instead of ``os.environ`` (for tests).

    Returns:
        A :class:`DistributedConfig`.

    Raises:
        DistributedInitError: A value is malformed or out of range.

    Example:
        >>> env = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "1", "WORLD_SIZE": "4"}
        >>> cfg = resolve_distributed_config(env=env)
        >>> cfg.coordinator_address, cfg.num_processes, cfg.process_id, cfg.source
        ('10.0.0.1:29500', 4, 1, 'torchrun')
    """
    # Each variable is parsed (spmdtorch.config) only where this resolution
    # order consults it: torchrun's RANK is not ours to reject when the
    # launcher's variables decide.
    what = "resolve_distributed_config"
    if coordinator_address is not None:
        _checks.check_str(coordinator_address, what, "coordinator_address", DistributedInitError, nonempty=True)
    if heartbeat_timeout_s is not None:
        _checks.check_int(heartbeat_timeout_s, what, "heartbeat_timeout_s", DistributedInitError, minimum=1)
    if env is not None and not isinstance(env, Mapping):
        _checks.fail(DistributedInitError, what, "env", "a mapping of environment variables or None", env)
    if local_device_ids is not None and not isinstance(local_device_ids, int):
        _checks.check_int_sequence(local_device_ids, what, "local_device_ids", DistributedInitError, minimum=0)
    env = os.environ if env is None else env

    def var(field: str) -> Any:  # the field's parsed type (spmdtorch.config's knob table)
        return config.read_one(field, env)

    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = var("heartbeat_timeout_s") or DEFAULT_HEARTBEAT_TIMEOUT_S
    if isinstance(local_device_ids, bool):  # an int to Python, never a device id
        raise DistributedInitError(
            f"local_device_ids must be a device id or a sequence of device ids, got {local_device_ids!r}"
        )
    device_ids: tuple[int, ...] | None = None
    if isinstance(local_device_ids, int):
        device_ids = (local_device_ids,)
    elif local_device_ids is not None:
        device_ids = tuple(int(i) for i in local_device_ids)

    given = (coordinator_address, num_processes, process_id)
    source = "arguments"
    if None in given:
        if var("coordinator_address"):
            source = "SPMDTORCH_*"
            found: tuple[str | None, int | None, int | None] = (
                var("coordinator_address"),
                var("num_processes"),
                var("process_id"),
            )
            if device_ids is None:
                device_ids = var("local_device_ids")
        elif var("master_addr") and var("world_size") is not None and var("rank") is not None:
            source = "torchrun"
            found = (_torchrun_address(env), var("world_size"), var("rank"))
            local_world = var("local_world_size")
            if device_ids is None and local_world is not None and local_world > 1:
                # Several processes on this host: each takes the device of its local rank.
                local_rank = var("local_rank")
                device_ids = None if local_rank is None else (local_rank,)
        else:
            world = var("world_size")
            if world is not None and world > 1:
                # torchrun's mark without its rendezvous: joining JAX's way would find nothing
                # and run this process alone, silently (one of `world` independent jobs).
                missing = [name for name, field in (("MASTER_ADDR", "master_addr"), ("RANK", "rank")) if not var(field)]
                missing = missing or ["MASTER_ADDR"]
                raise DistributedInitError(
                    f"WORLD_SIZE={world} says this process is one of {world} (torchrun's variables), but "
                    f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set; set MASTER_ADDR, "
                    "MASTER_PORT and RANK as torchrun does (or the SPMDTORCH_* launcher variables), or unset "
                    "WORLD_SIZE to run as a single process"
                )
            source = "jax"
            found = (None, None, None)
        coordinator_address = coordinator_address if coordinator_address is not None else found[0]
        num_processes = num_processes if num_processes is not None else found[1]
        process_id = process_id if process_id is not None else found[2]
    if source != "jax" and None in (coordinator_address, num_processes, process_id):
        missing = [
            n
            for n, v in zip(
                ("coordinator_address", "num_processes", "process_id"), (coordinator_address, num_processes, process_id)
            )
            if v is None
        ]
        names = {
            "SPMDTORCH_*": (ENV_COORDINATOR_ADDRESS, ENV_NUM_PROCESSES, ENV_PROCESS_ID),
            "torchrun": ("MASTER_ADDR", "WORLD_SIZE", "RANK"),
        }.get(source)
        hint = f" (environment: {', '.join(names)})" if names else ""
        raise DistributedInitError(
            f"initialize_distributed: {', '.join(missing)} not given and not found in the "
            f"environment{hint}; pass them as arguments or set the variables"
        )
    if num_processes is not None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
            raise DistributedInitError(f"num_processes must be an int >= 1, got {num_processes!r}")
        if isinstance(process_id, bool) or not isinstance(process_id, int) or not 0 <= process_id < num_processes:
            raise DistributedInitError(
                f"process_id must be an int in 0..{num_processes - 1} (num_processes={num_processes}), "
                f"got {process_id!r}"
            )
    if coordinator_address is not None and (
        ":" not in coordinator_address or not coordinator_address.rsplit(":", 1)[1].isdigit()
    ):
        raise DistributedInitError(
            f"coordinator_address {coordinator_address!r} must be 'host:port', e.g. '10.0.0.1:8476'"
        )
    return DistributedConfig(
        coordinator_address, num_processes, process_id, device_ids, source, int(heartbeat_timeout_s)
    )


def is_distributed_initialized() -> bool:
    """Whether this process has joined a multi-process job (``jax.distributed``).

    Example:
        >>> is_distributed_initialized()     # a plain single-process run
        False
    """
    return _jax_private.distributed_is_initialized()


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: int | Sequence[int] | None = None,
    *,
    heartbeat_timeout_s: int | None = None,
    initialization_timeout_s: int | None = None,
) -> DistributedConfig:
    """Joins this process to the other processes of the job (``jax.distributed``).

    ``import spmdtorch`` already calls this (through
    :func:`auto_initialize_distributed`) when a launcher started the process
    as one of several (``python -m spmdtorch.launch``, torchrun, Slurm, MPI,
    a multi-host TPU slice), so scripts need not call it; calling it again
    with the same (or no) settings returns the same config. Otherwise every
    host runs the same script and calls this first, before any tensor
    is created on ``"xla"``. Afterwards :func:`process_index`,
    :func:`process_count` and :func:`global_runtime_device_count` describe
    the whole job, meshes span every host's devices, and each process holds
    (and transfers) only the shards on its own devices. See
    :func:`resolve_distributed_config` for where unset arguments come from;
    when nothing is configured the job is a single process and this is a
    no-op.

    On CPU it selects gloo for cross-process collectives. A peer that dies
    ends every other process at once: each writes one line
    ``spmdtorch.runtime.PeerLostError: ...`` to stderr and exits with
    :data:`PEER_LOST_EXIT_STATUS` (75; ``SPMDTORCH_PEER_WATCH``,
    docs/reliability.md). A host that vanishes without closing its
    connections is noticed within ``heartbeat_timeout_s``, and JAX aborts
    the others ("Terminating process because the JAX distributed service
    detected fatal errors ... another task died").

    Args:
        coordinator_address: ``host:port`` of process 0 (it listens there).
        num_processes: Number of processes.
        process_id: This process's index.
        local_device_ids: Device ids this process may use (GPU only).
        heartbeat_timeout_s: Seconds without a heartbeat before a peer is
            declared dead (default ``SPMDTORCH_HEARTBEAT_TIMEOUT`` or 100).
        initialization_timeout_s: Seconds to wait for all processes to join
            (default ``SPMDTORCH_INIT_TIMEOUT`` or 300).

    Returns:
        The :class:`DistributedConfig` used. Calling again with the same
        settings returns it again.

    Raises:
        DistributedInitError: JAX has already started its backend (a tensor
            or device was used first), the settings are malformed, they
            differ from an earlier call, or joining failed.

    Example:
        >>> import spmdtorch.runtime as xr
        >>> cfg = xr.initialize_distributed()    # doctest: +SKIP
        >>> xr.process_index(), xr.process_count()  # doctest: +SKIP
        (1, 2)
    """
    cfg = resolve_distributed_config(
        coordinator_address, num_processes, process_id, local_device_ids, heartbeat_timeout_s=heartbeat_timeout_s
    )
    return _join(cfg, initialization_timeout_s, _cluster.detect_job(os.environ) if cfg.source == "jax" else None)


def _join(
    cfg: DistributedConfig, initialization_timeout_s: int | None, job: _cluster.JobEnvironment | None
) -> DistributedConfig:
    """Joins the job described by ``cfg`` (see :func:`initialize_distributed`).

    ``job`` is the launcher found in the environment when JAX's detection
    decides (``cfg.source == "jax"``): JAX finding no cluster then is an
    error, not a single-process run.
    """
    done = _DISTRIBUTED[0]
    if done is not None:
        if (done.coordinator_address, done.num_processes, done.process_id) not in (
            (cfg.coordinator_address, cfg.num_processes, cfg.process_id),
            (None, None, None),
        ) and cfg.source != "jax":
            raise DistributedInitError(
                f"initialize_distributed was already called with {done}; it cannot be re-initialised "
                f"with {cfg} in the same process"
            )
        return done
    if is_distributed_initialized():  # the user called jax.distributed.initialize directly
        _DISTRIBUTED[0] = joined = dataclasses.replace(
            cfg, source="jax", num_processes=jax.process_count(), process_id=jax.process_index()
        )
        return joined
    if cfg.num_processes == 1 and cfg.source != "jax":
        _DISTRIBUTED[0] = cfg  # a job of one: nothing to join
        return cfg
    if _backends_initialized():
        raise DistributedInitError(
            "initialize_distributed must run before JAX starts: something already used a device "
            f"(JAX is running on {jax.default_backend()} with {jax.device_count()} device(s)). Call "
            "spmdtorch.runtime.initialize_distributed() at the top of the script, before creating "
            "tensors on 'xla' or querying devices"
        )
    if initialization_timeout_s is None:
        initialization_timeout_s = config.read_one("init_timeout_s") or DEFAULT_INIT_TIMEOUT_S
    if cfg.coordinator_address is not None:
        _check_coordinator(cfg)
    # Untyped run-time flag attribute (see _apply_pjrt_device_env).
    platforms = (os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms or "").lower()  # type: ignore[attr-defined]
    if platforms.split(",")[0].strip() in ("", "cpu"):
        # CPU collectives across processes need an implementation; gloo ships with jaxlib.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(
            coordinator_address=cfg.coordinator_address,
            num_processes=cfg.num_processes,
            process_id=cfg.process_id,
            local_device_ids=list(cfg.local_device_ids) if cfg.local_device_ids else None,
            cluster_detection_method=job.jax_detection if job is not None else None,
            initialization_timeout=int(initialization_timeout_s),
            heartbeat_timeout_seconds=cfg.heartbeat_timeout_s,
        )
    except ValueError as e:
        if cfg.source == "jax" and job is None:
            # JAX found no cluster (no TPU metadata, Slurm, MPI...): one process, as in PyTorch/XLA.
            _DISTRIBUTED[0] = alone = dataclasses.replace(cfg, num_processes=1, process_id=0, source="single-process")
            return alone
        if job is not None:
            hint = " (install mpi4py: JAX finds the MPI coordinator through it)" if job.jax_detection else ""
            raise DistributedInitError(
                f"{job.evidence} says this process is one of several ({job.launcher}), but JAX's cluster "
                f"detection could not find the job's coordinator{hint}: {e}. Pass coordinator_address, "
                f"num_processes and process_id to initialize_distributed() (or set {ENV_COORDINATOR_ADDRESS}, "
                f"{ENV_NUM_PROCESSES} and {ENV_PROCESS_ID})"
            ) from e
        raise DistributedInitError(f"jax.distributed.initialize rejected {cfg}: {e}") from e
    except Exception as e:  # XlaRuntimeError (timeouts, refused connections) and friends
        raise DistributedInitError(
            f"could not join the job as process {cfg.process_id} of {cfg.num_processes} via "
            f"{cfg.coordinator_address} ({cfg.source}): {e}. Check that every process runs with the "
            "same coordinator address and process count and that process 0 is reachable"
        ) from e
    if cfg.source == "jax":
        cfg = dataclasses.replace(cfg, num_processes=jax.process_count(), process_id=jax.process_index())
    _DISTRIBUTED[0] = cfg
    # Subprocesses inherit the launcher's variables; they must not join again as this process.
    os.environ[ENV_JOINED_PID] = str(os.getpid())
    if config.read_one("peer_watch"):
        _start_peer_watch(cfg, int(initialization_timeout_s))
    return cfg


def _start_peer_watch(cfg: DistributedConfig, init_timeout_s: int) -> None:
    """A lost peer ends this process at once with a named ``PeerLostError`` (``spmdtorch._faults``)."""
    client = _jax_private.distributed_client()
    count, index = jax.process_count(), jax.process_index()
    if client is None or count < 2:
        return
    if cfg.coordinator_address is not None:
        host = cfg.coordinator_address.rsplit(":", 1)[0].strip("[]")
    else:  # JAX found the coordinator itself (TPU slice, Slurm, MPI)
        address = _jax_private.distributed_coordinator_address() or ""
        host = address.rsplit(":", 1)[0].strip("[]")
    finished_dir = config.read_one("launch_finished_dir")
    finished = None if finished_dir is None else os.path.join(finished_dir, str(index))
    _faults.start_peer_watch(
        client, index, count, host, cfg.heartbeat_timeout_s, init_timeout_s, finished_marker=finished
    )


def _check_coordinator(cfg: DistributedConfig) -> None:
    """Fails fast, naming the address, when the coordinator cannot be reached.

    Without this, JAX retries a host name that does not resolve, or a
    coordinator that never listens, for the whole initialization timeout
    (300 s) and then reports a gRPC error without the address. Process 0
    only checks that the host name resolves (it is the one that listens);
    every other process waits at most ``SPMDTORCH_CONNECT_TIMEOUT`` seconds
    (default 120) for process 0 to accept a TCP connection.

    Raises:
        DistributedInitError: the host does not resolve, or nothing accepted a
            connection in time.
    """
    assert cfg.coordinator_address is not None  # invariant: checked by the caller
    host, port_text = cfg.coordinator_address.rsplit(":", 1)
    host = host.strip("[]")  # "[::1]:1234"
    port = int(port_text)
    where = f"coordinator {cfg.coordinator_address} ({cfg.source})"
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise DistributedInitError(
            f"cannot resolve the host of the {where}: {e}. Set it to process 0's address "
            "(host:port) that every process can reach"
        ) from e
    timeout_s = config.read_one("connect_timeout_s") or DEFAULT_CONNECT_TIMEOUT_S
    if cfg.process_id == 0:
        _check_own_address(cfg, host, port, where, min(timeout_s, _SELF_CHECK_TIMEOUT_S))
        return
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout_s)):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise DistributedInitError(
                    f"process {cfg.process_id} of {cfg.num_processes} cannot reach the {where}: no answer "
                    f"within {timeout_s} s ({e}). Check that process 0 runs and listens there, that the "
                    f"address is right for this host, and the firewall; raise {ENV_CONNECT_TIMEOUT} if "
                    "process 0 starts later"
                ) from e
            time.sleep(0.2)


#: Seconds process 0 tries to reach itself at the coordinator address (it answers in ms when the address is right).
_SELF_CHECK_TIMEOUT_S = 10


def _check_own_address(cfg: DistributedConfig, host: str, port: int, where: str, timeout_s: float) -> None:
    """Process 0: the coordinator's port is free here, and the address reaches this very process.

    JAX's service listens on ``[::]:port`` whatever the host, and process 0's
    own client then connects to the address: when the address leads
    elsewhere (a typo, another host's name), that client retries for the
    whole initialization timeout and aborts the process (SIGABRT,
    "DEADLINE_EXCEEDED ... RegisterTask", no address named). So listen on
    the port for a moment and send a random token to ourselves through the
    address.

    Raises:
        DistributedInitError: the port is taken, or the address does not lead back here in ``timeout_s``.
    """
    try:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            server = socket.create_server(("", port))
    except OSError as e:
        raise DistributedInitError(
            f"process 0 of {cfg.num_processes} cannot listen on port {port} for the {where}: {e}. Another "
            "program (an earlier job still running?) holds the port: pick a free port for the coordinator"
        ) from e
    token = os.urandom(16)
    deadline = time.monotonic() + timeout_s
    error: OSError | None = None
    with server:
        server.settimeout(1.0)
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(
                    (host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))
                ) as c:
                    c.sendall(token)
                    conn, _ = server.accept()
                    with conn:
                        conn.settimeout(1.0)
                        if conn.recv(len(token)) == token:
                            return
                error = OSError("another host answered at this address, not this process")
            except OSError as e:
                error = e
            time.sleep(0.2)
    raise DistributedInitError(
        f"process 0 of {cfg.num_processes} listens for the {where} on port {port} of this host "
        f"({socket.gethostname()}), but the address does not lead back to it within {timeout_s:g} s ({error}). Set "
        "the coordinator address to this host's name or IP address as every process sees it"
    )


def auto_initialize_distributed() -> DistributedConfig | None:
    """Joins the job when a multi-process launcher started this process (``import spmdtorch`` calls it).

    PyTorch/XLA scripts never call an init function: the runtime finds the
    job itself. So does spmdtorch: when the process was started by
    ``python -m spmdtorch.launch``, by torchrun (``WORLD_SIZE`` > 1), by
    Slurm's ``srun`` or MPI with several tasks, or on a multi-host Cloud TPU
    slice (see :mod:`spmdtorch._cluster`), this joins the job before anything
    queries a device. An explicit :func:`initialize_distributed` afterwards
    returns the same :class:`DistributedConfig`.

    It does nothing in a process that is not the main process of its
    launcher (a ``multiprocessing`` child such as a DataLoader worker, or a
    subprocess of a process that joined: ``SPMDTORCH_JOINED_PID``), when
    ``SPMDTORCH_AUTO_DISTRIBUTED=0``, or when no launcher is found.

    Returns:
        The :class:`DistributedConfig` joined, or None when it did nothing.

    Raises:
        DistributedInitError: a launcher was found but joining failed (the
            message names the launcher's variables and the coordinator), or
            JAX had already started its backend in this process.

    Example:
        >>> auto_initialize_distributed() is None    # a plain single-process run
        True
    """
    if not config.read_one("auto_distributed") or multiprocessing.parent_process() is not None:
        return None
    joined_pid = config.read_one("joined_pid")
    if joined_pid is not None and joined_pid != os.getpid():
        return None  # a subprocess of a process that joined
    job = _cluster.detect_job(os.environ)
    tpu_vm = job is None and _on_cloud_tpu_vm()
    if job is None and not tpu_vm:
        return None
    if _DISTRIBUTED[0] is not None or is_distributed_initialized():
        return _DISTRIBUTED[0]
    launcher = "a Cloud TPU VM" if job is None else f"{job.launcher} ({job.evidence})"
    if _backends_initialized():
        raise DistributedInitError(
            f"this process was started by {launcher} as one of several processes, but JAX started its "
            f"backend ({jax.default_backend()}, {jax.device_count()} device(s)) before spmdtorch could join "
            "the job, so it would run alone. Import spmdtorch before anything uses JAX devices, call "
            "jax.distributed.initialize() first yourself, or set SPMDTORCH_AUTO_DISTRIBUTED=0 to run "
            "independent single-process jobs"
        )
    try:
        cfg = resolve_distributed_config()
        return _join(cfg, None, job if cfg.source == "jax" else None)
    except DistributedInitError as e:
        raise DistributedInitError(
            f"spmdtorch joins the multi-process job at import because this process was started by "
            f"{launcher}, but joining failed: {e} (set SPMDTORCH_AUTO_DISTRIBUTED=0 to skip joining)"
        ) from e


def _on_cloud_tpu_vm() -> bool:
    """Whether TPU chips are attached and libtpu is installed (JAX's test, without starting it)."""
    if not _jax_private.num_tpu_chips():
        return False
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


# --------------------------------------------------------------------------
# Reading tensors that span other hosts
# --------------------------------------------------------------------------

#: Environment variable with the default gather limit in bytes.
ENV_MAX_GATHER_BYTES = "SPMDTORCH_MAX_GATHER_BYTES"
_MAX_GATHER: list[int | None] = [None]


class GatherTooLargeError(RuntimeError):
    """Reading a tensor that spans other hosts would copy too much to every host."""


def max_gather_bytes() -> int:
    """The largest tensor (bytes) that ``.cpu()``/``.item()``/``print`` gathers from other processes.

    In a multi-process job, reading a tensor sharded over other hosts' devices
    all-gathers it (every process must do the same read). Larger tensors raise
    :class:`GatherTooLargeError`. ``SPMDTORCH_MAX_GATHER_BYTES`` sets the
    default (1 GiB); :func:`set_max_gather_bytes` overrides it.

    Raises:
        spmdtorch.config.ConfigError: ``SPMDTORCH_MAX_GATHER_BYTES`` is not a whole number >= 0
            (a ``ValueError``).

    Example:
        >>> max_gather_bytes() > 0
        True
    """
    if _MAX_GATHER[0] is not None:
        return _MAX_GATHER[0]
    # At the call (the documented contract: the environment, then the override).
    limit: int = config.read_one("max_gather_bytes")
    return limit


def set_max_gather_bytes(limit: int | None) -> None:
    """Sets the cross-host gather limit in bytes (None: back to the environment/default).

    Raises:
        ArgumentError: ``limit`` is not an int >= 0 or None (a ``ValueError``).

    Example:
        >>> set_max_gather_bytes(2 ** 20); max_gather_bytes()
        1048576
        >>> set_max_gather_bytes(None)
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ArgumentError(
            f"set_max_gather_bytes: limit (max gather bytes) must be an int >= 0 or None, got {limit!r}"
        )
    _MAX_GATHER[0] = limit


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
