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

The package (``import spmdtorch.runtime as xr``) is the public API; its
modules each own one job: ``_platform`` (``PJRT_DEVICE``, before any backend
starts), ``_devices`` (devices, counts, memory), ``_cache`` (the persistent
compilation cache), ``_distributed`` (joining a multi-process job),
``_limits`` (the cross-host gather limit), ``_spmd_mode`` (PyTorch/XLA's
SPMD-mode names and auto-sharding), ``_cluster`` (which launcher started this
process: environment only), ``faults`` (the peer watch; ``activity()``
regions name what a process was doing when a peer died) and ``cpu_devices``
(N simulated CPU devices for tests, examples and the launcher).

Environment:
    ``PJRT_DEVICE`` is honoured the way PyTorch/XLA honours it: ``CPU``,
    ``CUDA`` (or its alias ``GPU``) or ``TPU``. When it is set before any JAX
    backend starts, :func:`_apply_pjrt_device_env` (called when ``spmdtorch``
    is imported) points JAX at that platform via ``JAX_PLATFORMS``.
"""

from __future__ import annotations

from spmdtorch.config import (
    DistributedInitError,
    InvalidPjrtDeviceError,
    RuntimeConfigError,
)
from spmdtorch.runtime import _distributed, _limits, _platform
from spmdtorch.runtime._cache import (
    initialize_cache,
)
from spmdtorch.runtime._devices import (
    addressable_runtime_device_count,
    device,
    device_count,
    device_type,
    devices,
    global_runtime_device_count,
    jax_devices,
    local_jax_devices,
    process_count,
    process_index,
)
from spmdtorch.runtime._distributed import (
    DistributedConfig,
    auto_initialize_distributed,
    initialize_distributed,
    is_distributed_initialized,
    resolve_distributed_config,
)
from spmdtorch.runtime._limits import (
    GatherTooLargeError,
    max_gather_bytes,
    set_max_gather_bytes,
)
from spmdtorch.runtime._spmd_mode import (
    AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE,
    AutoSharding,
    MemoryInfo,
    SpmdModeError,
    addressable_device_count,
    auto_sharding,
    auto_sharding_enabled,
    global_device_count,
    global_ordinal,
    is_spmd,
    local_device_count,
    local_ordinal,
    local_process_count,
    memory_info,
    rendezvous,
    set_auto_sharding,
    use_spmd,
    world_size,
)
from spmdtorch.runtime.faults import (
    PEER_LOST_EXIT_STATUS,
    PeerLostError,
)

# Outside ``__all__``, as before: the environment variables' names and defaults
# (read by the launcher and the tests) and the platform hook ``import spmdtorch`` calls.
DEFAULT_CONNECT_TIMEOUT_S = _distributed.DEFAULT_CONNECT_TIMEOUT_S
DEFAULT_HEARTBEAT_TIMEOUT_S = _distributed.DEFAULT_HEARTBEAT_TIMEOUT_S
DEFAULT_INIT_TIMEOUT_S = _distributed.DEFAULT_INIT_TIMEOUT_S
ENV_AUTO_DISTRIBUTED = _distributed.ENV_AUTO_DISTRIBUTED
ENV_CONNECT_TIMEOUT = _distributed.ENV_CONNECT_TIMEOUT
ENV_COORDINATOR_ADDRESS = _distributed.ENV_COORDINATOR_ADDRESS
ENV_COORDINATOR_PORT = _distributed.ENV_COORDINATOR_PORT
ENV_HEARTBEAT_TIMEOUT = _distributed.ENV_HEARTBEAT_TIMEOUT
ENV_INIT_TIMEOUT = _distributed.ENV_INIT_TIMEOUT
ENV_JOINED_PID = _distributed.ENV_JOINED_PID
ENV_LAUNCH_FINISHED_DIR = _distributed.ENV_LAUNCH_FINISHED_DIR
ENV_LOCAL_DEVICE_IDS = _distributed.ENV_LOCAL_DEVICE_IDS
ENV_NUM_PROCESSES = _distributed.ENV_NUM_PROCESSES
ENV_PROCESS_ID = _distributed.ENV_PROCESS_ID
ENV_MAX_GATHER_BYTES = _limits.ENV_MAX_GATHER_BYTES
DEVICE_TYPE = _platform.DEVICE_TYPE
_apply_pjrt_device_env = _platform._apply_pjrt_device_env

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
