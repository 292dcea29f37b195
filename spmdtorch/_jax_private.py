"""Every private JAX name spmdtorch uses, behind this one module.

``jax._src`` carries no compatibility promise: a JAX release may move or drop
any name in it (nor do ``_``-names of public classes). So no other spmdtorch
module imports ``jax._src``; each use
goes through an accessor here that tries JAX's public API first and falls
back to the private name only where no public spelling exists (in the JAX
versions spmdtorch supports). :data:`PRIVATE_NAMES` lists every private
name with the module that needs it, and :func:`missing` reports those the
installed JAX lacks; ``tests/test_jax_private.py`` fails, naming them, when
a JAX upgrade moves one, instead of a feature quietly degrading.

``convert_element_type`` (``jax._src.lax.lax._convert_element_type``, the
only spelling that takes ``weak_type``) is bound on first access, so the lazy
engine's hot path calls JAX's function itself, not a wrapper.

Accessors whose caller can carry on without the name (a "has the backend
started" query at import, the TPU-VM probe) degrade the way the caller did
before; the others raise :class:`JaxPrivateNameError` saying which name is
gone and what to do.

Example:
    >>> missing()   # on a supported JAX
    []
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax

__all__ = [
    "PRIVATE_NAMES",
    "JaxPrivateNameError",
    "PrivateName",
    "backends_initialized",
    "distributed_client",
    "distributed_coordinator_address",
    "distributed_is_initialized",
    "missing",
    "num_tpu_chips",
    "pallas_interpret_mode",
    "resolve",
]


class JaxPrivateNameError(ImportError):
    """The installed JAX lacks a private name spmdtorch needs (it moved in a JAX release)."""


class PrivateName(NamedTuple):
    """One private JAX name spmdtorch reads.

    Attributes:
        module: the module holding it (``jax._src...``, or a public module for
            a private attribute of a public class).
        attr: the attribute read from that module (dotted for a class attribute).
        used_by: the spmdtorch function(s) that need it.
        public_first: the public API tried before it, or "" when there is none.
    """

    module: str
    attr: str
    used_by: str
    public_first: str

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.attr}"


#: Every private JAX name spmdtorch uses (docs/design.md lists them too).
PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName(
        "jax._src.xla_bridge",
        "backends_are_initialized",
        "runtime._platform._apply_pjrt_device_env, runtime.cpu_devices.simulate_cpu_devices (the platform is fixed once it is true)",
        "",
    ),
    PrivateName(
        "jax._src.distributed",
        "global_state",
        "runtime.is_distributed_initialized, runtime._distributed._start_peer_watch (the coordinator client and address)",
        "jax.distributed.is_initialized (for the yes/no question)",
    ),
    PrivateName(
        "jax._src.hardware_utils",
        "num_available_tpu_chips_and_device_id",
        "runtime._distributed._on_cloud_tpu_vm (TPU chips attached, without starting a backend)",
        "",
    ),
    PrivateName(
        "jax._src.lax.lax",
        "_convert_element_type",
        "lazy.executor (weak-typed scalar constants, as JAX's own Python-scalar promotion makes them)",
        "",
    ),
    PrivateName(
        "jax._src.config",
        "pallas_tpu_interpret_mode_context_manager",
        "ops._pallas_attention (the flash-attention kernel run in interpret mode off TPU)",
        "jax.experimental.pallas.tpu.force_tpu_interpret_mode",
    ),
    PrivateName(
        "jax.sharding",
        "NamedSharding._to_xla_hlo_sharding",
        "ops.manual (the HloSharding its Sharding / SPMDFullToShardShape / SPMDShardToFullShape custom calls carry)",
        "",
    ),
)


def _lookup(entry: PrivateName) -> Any | None:
    """The private object, or None when the installed JAX lacks it."""
    try:
        found: Any = importlib.import_module(entry.module)
    except ImportError:
        return None
    for part in entry.attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found


def _entry(module: str, attr: str) -> PrivateName:
    for entry in PRIVATE_NAMES:
        if entry.module == module and entry.attr == attr:
            return entry
    raise KeyError(f"{module}.{attr} is not in spmdtorch._jax_private.PRIVATE_NAMES; add it there first")


def resolve(module: str, attr: str) -> Any:
    """The private JAX object ``module.attr`` (listed in :data:`PRIVATE_NAMES`).

    Raises:
        JaxPrivateNameError: the installed JAX lacks it; the message names it,
            the JAX version and the spmdtorch code that needs it.
    """
    entry = _entry(module, attr)
    found = _lookup(entry)
    if found is None:
        raise JaxPrivateNameError(
            f"jax {jax.__version__} has no {entry.qualname}, which spmdtorch's {entry.used_by} needs; "
            "install a jax in the range spmdtorch is tested with (README, 'Tested versions') or port "
            "spmdtorch/_jax_private.py to this jax"
        )
    return found


def missing() -> list[str]:
    """The private names of :data:`PRIVATE_NAMES` the installed JAX lacks, as ``module.attr`` strings."""
    return [entry.qualname for entry in PRIVATE_NAMES if _lookup(entry) is None]


# --------------------------------------------------------------------------
# Accessors (public API first)
# --------------------------------------------------------------------------


def backends_initialized() -> bool:
    """Whether JAX has created its backends (the platform can no longer change).

    JAX has no public query. When the private one is gone this answers False,
    as spmdtorch did before (the caller then sets ``JAX_PLATFORMS``, which JAX
    ignores once started); the test of this module flags the loss.
    """
    check = _lookup(_entry("jax._src.xla_bridge", "backends_are_initialized"))
    return bool(check()) if check is not None else False


def distributed_is_initialized() -> bool:
    """Whether this process joined a multi-process job (``jax.distributed.initialize`` ran)."""
    public = getattr(jax.distributed, "is_initialized", None)
    if public is not None:
        return bool(public())
    return distributed_client() is not None


def distributed_client() -> Any | None:
    """JAX's coordination-service client of this process, or None before it joins a job.

    The peer watch reads the other processes' liveness through it; JAX does
    not expose it publicly.
    """
    return resolve("jax._src.distributed", "global_state").client


def distributed_coordinator_address() -> str | None:
    """The coordinator's ``host:port`` JAX joined, when JAX found it itself (TPU slice, Slurm, MPI)."""
    address: str | None = resolve("jax._src.distributed", "global_state").coordinator_address
    return address


def num_tpu_chips() -> int:
    """How many TPU chips this host has attached (0 when unknown), without starting a backend."""
    probe = _lookup(_entry("jax._src.hardware_utils", "num_available_tpu_chips_and_device_id"))
    if probe is None:
        return 0
    try:
        chips, _ = probe()
    except Exception:  # noqa: BLE001 (sysfs unreadable: no chips as far as spmdtorch can tell)
        return 0
    return int(chips)


@contextlib.contextmanager
def pallas_interpret_mode() -> Iterator[None]:
    """Pallas kernels traced inside run in interpret mode (``interpret=True``), e.g. on CPU."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        public: Callable[..., Any] | None = getattr(pltpu, "force_tpu_interpret_mode", None)
    except ImportError:
        public = None
    if public is not None:
        # Its parameter is the value pallas_call's `interpret` takes; True is plain interpret mode.
        with public(True):
            yield
        return
    state = resolve("jax._src.config", "pallas_tpu_interpret_mode_context_manager")
    prev = state.swap_local(True)
    try:
        yield
    finally:
        state.set_local(prev)


def __getattr__(name: str) -> Any:
    # Module attributes bound on first use, so hot paths call JAX's function
    # itself rather than a wrapper. `convert_element_type`:
    # jax._src.lax.lax._convert_element_type(x, dtype, weak_type) (no public
    # spelling takes weak_type).
    if name == "convert_element_type":
        fn = resolve("jax._src.lax.lax", "_convert_element_type")
        globals()[name] = fn
        return fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
