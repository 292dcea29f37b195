"""Multi-process (multi-host) runs: the distributed configuration, joining the job, the peer watch."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from spmdtorch import _checks, _jax_private, config
from spmdtorch.config import DistributedInitError
from spmdtorch.runtime import _cluster, faults
from spmdtorch.runtime._platform import _backends_initialized

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


# (coordinator address, number of processes, process id) as the environment gives them.
_Found = tuple[str | None, int | None, int | None]


def _from_environment(
    env: Mapping[str, str], device_ids: tuple[int, ...] | None
) -> tuple[str, _Found, tuple[int, ...] | None]:
    """Where the settings not passed as arguments come from: ``(source, found, device ids)``.

    The launcher's ``SPMDTORCH_*`` variables, then torchrun's; with neither,
    JAX's own cluster detection decides (``source="jax"``, nothing found here).
    Each variable is parsed only where this order consults it.

    Raises:
        DistributedInitError: torchrun's ``WORLD_SIZE`` > 1 without its rendezvous variables.
    """

    def var(field: str) -> Any:  # the field's parsed type (spmdtorch.config's knob table)
        return config.read_one(field, env)

    if var("coordinator_address"):
        found: _Found = (var("coordinator_address"), var("num_processes"), var("process_id"))
        if device_ids is None:
            device_ids = var("local_device_ids")
        return "SPMDTORCH_*", found, device_ids
    if var("master_addr") and var("world_size") is not None and var("rank") is not None:
        found = (_torchrun_address(env), var("world_size"), var("rank"))
        local_world = var("local_world_size")
        if device_ids is None and local_world is not None and local_world > 1:
            # Several processes on this host: each takes the device of its local rank.
            local_rank = var("local_rank")
            device_ids = None if local_rank is None else (local_rank,)
        return "torchrun", found, device_ids
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
    return "jax", (None, None, None), device_ids


def _check_resolved(
    source: str, coordinator_address: str | None, num_processes: int | None, process_id: int | None
) -> None:
    """The resolved settings are complete (unless JAX detects them) and in range.

    Raises:
        DistributedInitError: A setting is missing, out of range or malformed (named, with the fix).
    """
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

    source = "arguments"
    if None in (coordinator_address, num_processes, process_id):
        source, found, device_ids = _from_environment(env, device_ids)
        coordinator_address = coordinator_address if coordinator_address is not None else found[0]
        num_processes = num_processes if num_processes is not None else found[1]
        process_id = process_id if process_id is not None else found[2]
    _check_resolved(source, coordinator_address, num_processes, process_id)
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
    """A lost peer ends this process at once with a named ``PeerLostError`` (``spmdtorch.runtime.faults``)."""
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
    faults.start_peer_watch(
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
    slice (see :mod:`spmdtorch.runtime._cluster`), this joins the job before anything
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
