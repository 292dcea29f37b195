"""Every environment variable spmdtorch reads, parsed and validated in one place.

Each knob is one :class:`Knob` in :data:`KNOBS` (variable name, type, default,
meaning, valid values) and one field of the frozen :class:`Settings`. No other
module reads these variables from ``os.environ``: they ask :func:`settings`
(the process's snapshot, read once, on first use) or, where the public contract
is to honour the environment at the moment of the call, :func:`read`.

================================  =================  ==========  ===============================================
Variable                          Settings field     Default     Meaning
================================  =================  ==========  ===============================================
``SPMDTORCH_MAX_IN_FLIGHT``       max_in_flight      8           executions queued before the host waits for the
                                                                 oldest (docs/design.md, hazards: the CPU
                                                                 client deadlocks on collectives when unbounded)
``SPMDTORCH_COMPILE_CACHE_SIZE``  compile_cache_size 1024        compiled programs kept (least recently used are
                                                                 evicted; PyTorch/XLA's default cache size)
``SPMDTORCH_LOG_RECOMPILES``      log_recompiles     False       log which input changed on every recompilation
``SPMDTORCH_DEFER_UPLOAD``        defer_upload       True        keep ``.to("xla")`` data on the host until first
                                                                 use (``mark_sharding`` then uploads it sharded)
``SPMDTORCH_MAX_GATHER_BYTES``    max_gather_bytes   1 GiB       largest tensor read from other hosts
``PJRT_DEVICE``                   pjrt_device        None        device type (CPU, CUDA/GPU, TPU), as PyTorch/XLA
``SPMDTORCH_COORDINATOR_ADDRESS`` coordinator_addr.  None        process 0's ``host:port`` (the local launcher)
``SPMDTORCH_NUM_PROCESSES``       num_processes      None        processes in the job (the local launcher)
``SPMDTORCH_PROCESS_ID``          process_id         None        this process's index (the local launcher)
``SPMDTORCH_LOCAL_DEVICE_IDS``    local_device_ids   None        devices this process may use, ``0,1`` (GPU)
``SPMDTORCH_COORDINATOR_PORT``    coordinator_port   None        coordinator port under torchrun
``SPMDTORCH_HEARTBEAT_TIMEOUT``   heartbeat_timeout  None (100)  seconds before a silent peer counts as dead
``SPMDTORCH_INIT_TIMEOUT``        init_timeout       None (300)  seconds to wait for every process to join
``SPMDTORCH_AUTO_DISTRIBUTED``    auto_distributed   True        join the job at import when a launcher started us
``SPMDTORCH_CONNECT_TIMEOUT``     connect_timeout    None (120)  seconds to wait for the coordinator to answer
``SPMDTORCH_JOINED_PID``          joined_pid         None        set by spmdtorch once joined (for subprocesses)
``SPMDTORCH_PEER_WATCH``          peer_watch         True        a lost peer ends the others at once (exit 75)
``SPMDTORCH_LAUNCH_FINISHED_DIR`` launch_finished_d. None        set by spmdtorch.launch: where scripts note a
                                                                 clean end (to name a hung rank)
``SPMDTORCH_CPU_DEVICES``         cpu_devices        None        simulated CPU devices of this process, set by
                                                                 ``import spmdtorch`` before it joins a job
``SPMDTORCH_ATTENTION_KERNEL``    attention_kernel   auto        SDPA's kernel: auto (Pallas flash attention on
                                                                 TPU where it applies, else XLA's), xla, pallas
``MASTER_ADDR`` ... (torchrun)    master_addr ...    None        torchrun's rendezvous: see :data:`KNOBS`
``PT_XLA_DEBUG_LEVEL`` ... ``XLA_*``  pt_xla_debug ...  None/False  PyTorch/XLA's debugging and dtype variables,
                                                                 acted on only by ``spmdtorch.compat.install()``
``XLA_AUTO_SPMD_MESH``            xla_auto_spmd_mesh None        auto-sharding's mesh shape (``2,4``), read at
                                                                 each compilation in ``use_spmd(auto=True)`` mode
``SLURM_STEP_NUM_TASKS`` ...      slurm_step_...     None        Slurm/MPI/TPU: only to notice several processes
================================  =================  ==========  ===============================================

An empty value means "unset" (the default), as a shell's ``VAR= cmd`` intends.
A malformed value raises :class:`ConfigError` (a ``ValueError``) naming the
variable, the value, the valid values and the fix.

Not read here: ``JAX_PLATFORMS`` and ``XLA_FLAGS`` belong to JAX and XLA,
which read them themselves; ``spmdtorch.runtime`` and
``spmdtorch.fsdp`` (activation checkpointing) only look at them to agree with
JAX at the moment it matters.

Tests that change a variable call :func:`reload` afterwards (and again after
restoring it); the engine reads its knobs through :func:`settings` at each use,
so a reload takes effect at the next compilation / execution.

Example:
    >>> from spmdtorch import config
    >>> config.read({"SPMDTORCH_MAX_IN_FLIGHT": "2"}).max_in_flight
    2
    >>> config.read({"SPMDTORCH_MAX_IN_FLIGHT": "two"})
    Traceback (most recent call last):
    ...
    spmdtorch.config.ConfigError: SPMDTORCH_MAX_IN_FLIGHT='two' is not an integer; valid values: ...
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "KNOBS",
    "ConfigError",
    "DistributedInitError",
    "InvalidPjrtDeviceError",
    "Knob",
    "RuntimeConfigError",
    "Settings",
    "read",
    "read_one",
    "reload",
    "settings",
]


# -- errors ----------------------------------------------------------------------


class ConfigError(ValueError):
    """An environment variable has a value spmdtorch cannot use.

    Attributes:
        name: the variable.
        value: its value, as found.
        valid: the valid values, in words.
        fix: what to do about it.
    """

    def __init__(self, name: str, value: str, reason: str, valid: str, fix: str):
        self.name, self.value, self.reason, self.valid, self.fix = name, value, reason, valid, fix
        super().__init__(f"{name}={value!r} {reason}; valid values: {valid}. Fix: {fix}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str, str, str, str]]:
        # The message is derived: pickle the parts (errors cross process pools).
        return (type(self), (self.name, self.value, self.reason, self.valid, self.fix))


class RuntimeConfigError(RuntimeError):
    """The runtime configuration (environment, JAX config) is inconsistent."""


class InvalidPjrtDeviceError(ConfigError, RuntimeConfigError):
    """``PJRT_DEVICE`` names a device type spmdtorch does not support."""


class DistributedInitError(RuntimeConfigError):
    """``initialize_distributed`` cannot join the processes as asked."""


class DistributedEnvError(ConfigError, DistributedInitError):
    """A launcher variable (``SPMDTORCH_NUM_PROCESSES``, torchrun's ``RANK``...) is malformed."""


# -- parsers -----------------------------------------------------------------------
# A parser takes the stripped, non-empty raw value and returns the typed value,
# or raises ValueError with the reason (the clause after "NAME='value'").


def _whole(minimum: int, unit: str = "") -> Callable[[str], int]:
    """An int >= ``minimum``; ``unit`` words the reason ("of bytes")."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"must be a whole number {unit}".rstrip() if unit else "is not an integer") from None
        if value < minimum:
            raise ValueError(f"must be >= {minimum}")
        return value

    return parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    low = raw.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("is not a boolean")


def _text(raw: str) -> str:
    return raw


def _device_ids(raw: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in raw.split(","))
    except ValueError:
        raise ValueError("must be a comma-separated list of device ids") from None


#: Accepted ``PJRT_DEVICE`` values and the device type each one means.
PJRT_DEVICE_ALIASES = {"CPU": "CPU", "CUDA": "CUDA", "GPU": "CUDA", "TPU": "TPU"}


def _pjrt_device(raw: str) -> str:
    key = raw.upper()
    if key not in PJRT_DEVICE_ALIASES:
        raise ValueError("is not supported")
    return PJRT_DEVICE_ALIASES[key]


def _tensors_fmt(raw: str) -> str:
    if raw.lower() not in ("text", "hlo", "dot"):
        raise ValueError("is not a graph format")
    return raw.lower()


#: ``SPMDTORCH_ATTENTION_KERNEL`` values (docs/models.md, "Attention").
ATTENTION_KERNELS = ("auto", "xla", "pallas")


def _attention_kernel(raw: str) -> str:
    if raw.lower() not in ATTENTION_KERNELS:
        raise ValueError("is not an attention kernel")
    return raw.lower()


def _mesh_shape(raw: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in raw.split(","))
    except ValueError:
        raise ValueError("must be a comma-separated list of mesh axis sizes") from None
    if any(n < 1 for n in shape):
        raise ValueError("has an axis size < 1")
    return shape


def _torch_true(raw: str) -> bool:
    # torchrun writes the Python spelling; anything else is false, as torch reads it.
    return raw == "True"


# -- the knobs ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Knob:
    """One environment variable: how to read it and what it means.

    Attributes:
        field: the :class:`Settings` attribute it fills.
        env: the variable's name.
        parse: raw (stripped, non-empty) string -> value; ``ValueError(reason)`` if malformed.
        default: the value when unset or empty.
        valid: the valid values, in words (for the error message).
        doc: what it controls.
        error: the :class:`ConfigError` subclass a malformed value raises.
    """

    field: str
    env: str
    parse: Callable[[str], Any]
    default: Any
    valid: str
    doc: str
    error: type[ConfigError] = ConfigError

    def read(self, env: Mapping[str, str]) -> Any:
        """This knob's value in ``env``.

        Raises:
            ConfigError: the value is malformed (``self.error``, a subclass).
        """
        raw = env.get(self.env)
        if raw is None or not raw.strip():
            return self.default
        try:
            return self.parse(raw.strip())
        except ValueError as e:
            default = "" if self.default is None else f" for the default ({self.default!r})"
            fix = f"set {self.env} to {self.valid}, or unset it{default}"
            raise self.error(self.env, raw, str(e), self.valid, fix) from None


_COUNT = "a whole number"
KNOBS: tuple[Knob, ...] = (
    Knob(
        "max_in_flight",
        "SPMDTORCH_MAX_IN_FLIGHT",
        _whole(0),
        8,
        f"{_COUNT} >= 0",
        "Executions queued before the host blocks on the oldest. Bounded so that XLA's CPU client "
        "cannot deadlock on collectives (docs/design.md, hazard 'CPU collective deadlock'); 0 waits for each one.",
    ),
    Knob(
        "compile_cache_size",
        "SPMDTORCH_COMPILE_CACHE_SIZE",
        _whole(1),
        1024,
        f"{_COUNT} >= 1",
        "Compiled programs kept by the lazy engine; the least recently used is evicted beyond it "
        "(counter CompileCacheEvictions). 1024 is PyTorch/XLA's XLA_COMPILATION_CACHE_SIZE default. "
        "Also the input signatures each spmdtorch.compile function keeps (counter CompiledSignatureEvictions).",
    ),
    Knob(
        "log_recompiles",
        "SPMDTORCH_LOG_RECOMPILES",
        _flag,
        False,
        "1/true/yes/on or 0/false/no/off",
        "Log a line on every recompilation saying which input changed (logger spmdtorch.compile).",
    ),
    Knob(
        "defer_upload",
        "SPMDTORCH_DEFER_UPLOAD",
        _flag,
        True,
        "1/true/yes/on or 0/false/no/off",
        "Keep a CPU tensor moved with .to('xla') (and torch.tensor(..., device='xla')) on the host until it "
        "is first needed, as PyTorch/XLA's SPMD virtual device does: mark_sharding then places each shard "
        "straight on its device instead of replicating the whole tensor first; an op, a read or a sync "
        "uploads it replicated. 0 uploads at once.",
    ),
    Knob(
        "max_gather_bytes",
        "SPMDTORCH_MAX_GATHER_BYTES",
        _whole(0, "of bytes"),
        1 << 30,
        f"{_COUNT} of bytes >= 0",
        "Largest tensor .cpu()/.item()/print gathers from other processes (spmdtorch.runtime.max_gather_bytes).",
    ),
    Knob(
        "pjrt_device",
        "PJRT_DEVICE",
        _pjrt_device,
        None,
        "CPU, CUDA, GPU or TPU (GPU is an alias of CUDA; any case)",
        "The device type, as PyTorch/XLA names it; points JAX at that platform when set before JAX starts.",
        InvalidPjrtDeviceError,
    ),
    # Set by ``python -m spmdtorch.launch`` for each process (read by runtime.initialize_distributed).
    Knob(
        "coordinator_address",
        "SPMDTORCH_COORDINATOR_ADDRESS",
        _text,
        None,
        "host:port",
        "Process 0's coordinator.",
        DistributedEnvError,
    ),
    Knob(
        "num_processes",
        "SPMDTORCH_NUM_PROCESSES",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Processes in the job.",
        DistributedEnvError,
    ),
    Knob(
        "process_id",
        "SPMDTORCH_PROCESS_ID",
        _whole(0),
        None,
        f"{_COUNT} >= 0",
        "This process's index.",
        DistributedEnvError,
    ),
    Knob(
        "local_device_ids",
        "SPMDTORCH_LOCAL_DEVICE_IDS",
        _device_ids,
        None,
        "comma-separated device ids, e.g. '0,1'",
        "Devices this process may use (GPU).",
        DistributedEnvError,
    ),
    Knob(
        "coordinator_port",
        "SPMDTORCH_COORDINATOR_PORT",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Coordinator port under torchrun (default MASTER_PORT, or the next one with the agent's store).",
        DistributedEnvError,
    ),
    Knob(
        "heartbeat_timeout_s",
        "SPMDTORCH_HEARTBEAT_TIMEOUT",
        _whole(1),
        None,
        f"{_COUNT} of seconds >= 1",
        "Seconds without a heartbeat before a peer counts as dead (None: runtime's default, 100).",
        DistributedEnvError,
    ),
    Knob(
        "init_timeout_s",
        "SPMDTORCH_INIT_TIMEOUT",
        _whole(1),
        None,
        f"{_COUNT} of seconds >= 1",
        "Seconds to wait for every process to join (None: runtime's default, 300).",
        DistributedEnvError,
    ),
    # torchrun's variables (read when no SPMDTORCH_* launcher variables are set).
    Knob("master_addr", "MASTER_ADDR", _text, None, "a host name", "torchrun: process 0's host.", DistributedEnvError),
    Knob("master_port", "MASTER_PORT", _whole(1), None, f"{_COUNT} >= 1", "torchrun: its port.", DistributedEnvError),
    Knob("world_size", "WORLD_SIZE", _whole(1), None, f"{_COUNT} >= 1", "torchrun: processes.", DistributedEnvError),
    Knob("rank", "RANK", _whole(0), None, f"{_COUNT} >= 0", "torchrun: this process's index.", DistributedEnvError),
    Knob(
        "local_rank",
        "LOCAL_RANK",
        _whole(0),
        None,
        f"{_COUNT} >= 0",
        "torchrun: index on this host.",
        DistributedEnvError,
    ),
    Knob(
        "local_world_size",
        "LOCAL_WORLD_SIZE",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "torchrun: processes on this host.",
        DistributedEnvError,
    ),
    # Other launchers' variables: only read to notice that this process is one of several
    # (spmdtorch.runtime._cluster); JAX's cluster detection reads the rest itself.
    Knob(
        "slurm_step_num_tasks",
        "SLURM_STEP_NUM_TASKS",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Slurm (srun): tasks in this job step.",
        DistributedEnvError,
    ),
    Knob(
        "ompi_world_size",
        "OMPI_COMM_WORLD_SIZE",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Open MPI (mpirun): processes.",
        DistributedEnvError,
    ),
    Knob(
        "ompi_hnp_uri",
        "OMPI_MCA_orte_hnp_uri",
        _text,
        None,
        "Open MPI's URI",
        "Open MPI 4's daemon URI (JAX's Open MPI detection needs it; Open MPI 5 goes through mpi4py).",
    ),
    Knob(
        "pmi_size",
        "PMI_SIZE",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "MPICH / Intel MPI (PMI): processes.",
        DistributedEnvError,
    ),
    Knob(
        "tpu_worker_hostnames",
        "TPU_WORKER_HOSTNAMES",
        _text,
        None,
        "comma-separated host names",
        "Cloud TPU (GKE): the hosts of this TPU slice.",
    ),
    Knob(
        "tpu_process_addresses",
        "TPU_PROCESS_ADDRESSES",
        _text,
        None,
        "comma-separated host:port",
        "Cloud TPU: the processes of this TPU slice (wins over TPU_WORKER_HOSTNAMES, as in JAX).",
    ),
    Knob(
        "megascale_num_slices",
        "MEGASCALE_NUM_SLICES",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Cloud TPU multislice: number of slices.",
        DistributedEnvError,
    ),
    Knob(
        "auto_distributed",
        "SPMDTORCH_AUTO_DISTRIBUTED",
        _flag,
        True,
        "1/true/yes/on or 0/false/no/off",
        "Join the multi-process job at import when a launcher (spmdtorch.launch, torchrun, Slurm, MPI, "
        "a multi-host TPU slice) started this process; 0 leaves it to initialize_distributed().",
    ),
    Knob(
        "joined_pid",
        "SPMDTORCH_JOINED_PID",
        _whole(0),
        None,
        "a process id",
        "Set by spmdtorch in a process that joined a job: its subprocesses inherit the launcher's variables "
        "but must not join again as the same process.",
    ),
    Knob(
        "launch_finished_dir",
        "SPMDTORCH_LAUNCH_FINISHED_DIR",
        _text,
        None,
        "a directory",
        "Set by spmdtorch.launch in each process it starts: a process whose script ended without failure "
        "creates a file named after its rank there, so that when it then dies waiting for a hung peer (JAX's "
        "shutdown barrier) the launcher names the peer that never finished, not this one.",
    ),
    Knob(
        "connect_timeout_s",
        "SPMDTORCH_CONNECT_TIMEOUT",
        _whole(1),
        None,
        f"{_COUNT} of seconds >= 1",
        "Seconds a process other than 0 waits for the coordinator to accept connections before failing "
        "with an error naming its address (None: runtime's default, 120).",
        DistributedEnvError,
    ),
    Knob(
        "peer_watch",
        "SPMDTORCH_PEER_WATCH",
        _flag,
        True,
        "1/true/yes/on or 0/false/no/off",
        "In a multi-process job, end every process at once with a named PeerLostError (exit status 75) when "
        "another one dies, instead of waiting for JAX's heartbeat timeout and its SIGABRT "
        "(docs/reliability.md); 0 leaves it to JAX.",
    ),
    Knob(
        "cpu_devices",
        "SPMDTORCH_CPU_DEVICES",
        _whole(1),
        None,
        f"{_COUNT} >= 1",
        "Run this process on that many simulated CPU devices (spmdtorch.runtime.cpu_devices): import spmdtorch "
        "sets XLA_FLAGS, NPROC and the CPU platform before it joins a multi-process job, so each torchrun "
        "worker gets its devices (python -m spmdtorch.launch sets it from --devices-per-proc).",
    ),
    Knob(
        "attention_kernel",
        "SPMDTORCH_ATTENTION_KERNEL",
        _attention_kernel,
        "auto",
        "auto, xla or pallas",
        "The kernel F.scaled_dot_product_attention lowers to (docs/models.md, 'Attention'): auto uses jax's "
        "Pallas flash-attention kernel on TPU and cuDNN's fused attention on GPU (bf16/f16) for the inputs "
        "they take, and XLA's attention otherwise; xla never uses Pallas or cuDNN; pallas uses it wherever "
        "it applies, on other platforms in Pallas's interpret mode (slow: for testing the path off TPU). "
        "Read when a program is traced.",
    ),
    Knob(
        "torchelastic_agent_store",
        "TORCHELASTIC_USE_AGENT_STORE",
        _torch_true,
        False,
        "True or False",
        "torchrun: its agent holds MASTER_PORT with its own store (the coordinator then takes the next port).",
    ),
    # PyTorch/XLA's variables: read only by spmdtorch.compat.install() (docs/migrating-from-torch-xla.md),
    # which honours them or raises compat.UnsupportedEnvironmentError where they mean nothing here.
    Knob(
        "pt_xla_debug_level",
        "PT_XLA_DEBUG_LEVEL",
        _whole(0),
        None,
        f"{_COUNT} >= 0 (1: compilations, 2: also executions)",
        "PyTorch/XLA: log why each program compiles (1) and each execution (2).",
    ),
    Knob("xla_use_bf16", "XLA_USE_BF16", _flag, False, "1 or 0", "PyTorch/XLA: store float32/64 as bfloat16."),
    Knob(
        "xla_downcast_bf16",
        "XLA_DOWNCAST_BF16",
        _flag,
        False,
        "1 or 0",
        "PyTorch/XLA: float32 as bfloat16 (deprecated).",
    ),
    Knob("xla_ir_debug", "XLA_IR_DEBUG", _flag, False, "1 or 0", "PyTorch/XLA: Python frames on IR nodes."),
    Knob("xla_hlo_debug", "XLA_HLO_DEBUG", _flag, False, "1 or 0", "PyTorch/XLA: IR frames in HLO metadata."),
    Knob(
        "xla_save_tensors_file",
        "XLA_SAVE_TENSORS_FILE",
        _text,
        None,
        "a file path",
        "PyTorch/XLA: append each step's graph to this file.",
    ),
    Knob(
        "xla_save_tensors_fmt",
        "XLA_SAVE_TENSORS_FMT",
        _tensors_fmt,
        "text",
        "text, hlo or dot",
        "PyTorch/XLA: the format of XLA_SAVE_TENSORS_FILE (text: StableHLO here; hlo: HLO text).",
    ),
    Knob(
        "xla_metrics_file",
        "XLA_METRICS_FILE",
        _text,
        None,
        "a file path",
        "PyTorch/XLA: append the metrics report to this file at every step.",
    ),
    Knob(
        "xla_auto_spmd_mesh",
        "XLA_AUTO_SPMD_MESH",
        _mesh_shape,
        None,
        "comma-separated axis sizes whose product is the device count, e.g. 2,4",
        "PyTorch/XLA: the mesh auto-sharding places inputs on (default: a 1-D mesh of all devices). Read by "
        "spmdtorch's own auto-sharding (runtime.use_spmd(auto=True)) each time a program is compiled.",
    ),
)


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """The parsed value of every knob (see the module's table and :data:`KNOBS`)."""

    max_in_flight: int = 8
    compile_cache_size: int = 1024
    log_recompiles: bool = False
    defer_upload: bool = True
    max_gather_bytes: int = 1 << 30
    pjrt_device: str | None = None
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None
    coordinator_port: int | None = None
    heartbeat_timeout_s: int | None = None
    init_timeout_s: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    world_size: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    local_world_size: int | None = None
    slurm_step_num_tasks: int | None = None
    ompi_world_size: int | None = None
    ompi_hnp_uri: str | None = None
    pmi_size: int | None = None
    tpu_worker_hostnames: str | None = None
    tpu_process_addresses: str | None = None
    megascale_num_slices: int | None = None
    auto_distributed: bool = True
    joined_pid: int | None = None
    launch_finished_dir: str | None = None
    connect_timeout_s: int | None = None
    peer_watch: bool = True
    cpu_devices: int | None = None
    attention_kernel: str = "auto"
    torchelastic_agent_store: bool = False
    pt_xla_debug_level: int | None = None
    xla_use_bf16: bool = False
    xla_downcast_bf16: bool = False
    xla_ir_debug: bool = False
    xla_hlo_debug: bool = False
    xla_save_tensors_file: str | None = None
    xla_save_tensors_fmt: str = "text"
    xla_metrics_file: str | None = None
    xla_auto_spmd_mesh: tuple[int, ...] | None = None


def read(env: Mapping[str, str] | None = None) -> Settings:
    """Parses every knob from ``env`` (default ``os.environ``), now; caches nothing.

    For entry points whose contract is to honour the environment at the call
    (``runtime.resolve_distributed_config``, ``runtime.device_type``), and tests.

    Raises:
        ConfigError: a variable is malformed (the first one in :data:`KNOBS` order).
    """
    env = os.environ if env is None else env
    return Settings(**{k.field: k.read(env) for k in KNOBS})


_BY_FIELD = {k.field: k for k in KNOBS}


def read_one(field: str, env: Mapping[str, str] | None = None) -> Any:
    """Parses one knob (a :class:`Settings` field name) from ``env`` (default ``os.environ``), now.

    For values whose documented contract is to follow the environment at the
    call (``runtime.max_gather_bytes``, ``PJRT_DEVICE`` in ``runtime.device_type``,
    torchrun's variables only when no launcher variables are set).

    Raises:
        ConfigError: the value is malformed.
        KeyError: ``field`` is not a knob.
    """
    return _BY_FIELD[field].read(os.environ if env is None else env)


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    """The process's settings: the environment as it was at the first call.

    Raises:
        ConfigError: a variable is malformed.
    """
    return read()


def reload() -> Settings:
    """Re-reads the environment (tests that change a variable); returns the new settings."""
    settings.cache_clear()
    return settings()


# Every Settings field has exactly one knob, with the same default (checked at import).
if {k.field: k.default for k in KNOBS} != {f.name: f.default for f in dataclasses.fields(Settings)}:  # pragma: no cover
    raise RuntimeError("spmdtorch.config: KNOBS and Settings disagree on the fields or their defaults")
