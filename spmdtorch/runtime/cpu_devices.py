"""N simulated CPU devices: the one place that knows how to ask XLA for them.

Tests, benchmarks, tools, examples and ``python -m spmdtorch.launch`` all run
on several simulated CPU devices. XLA reads its device count from
``XLA_FLAGS`` and sizes its CPU thread pool from ``NPROC`` when the CPU
backend starts (the first device query, not ``import jax``), and too few
threads for the devices can deadlock queued collectives (docs/design.md,
hazard "CPU collective deadlock"). ``cpu_device_env`` computes such an
environment for a child process; ``simulate_cpu_devices`` applies it to this
process, and refuses once JAX's backend has started, when it could no longer
take effect.

``SPMDTORCH_CPU_DEVICES=N`` asks for the same from outside the script:
``import spmdtorch`` applies it (:func:`apply_cpu_devices_setting`) before it
joins a multi-process job, which fixes the device count. That is how each
worker of ``torchrun --nproc-per-node 2`` gets N devices on a CPU-only machine;
``python -m spmdtorch.launch`` sets it from ``--devices-per-proc``.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping

from spmdtorch import config

__all__ = [
    "CPU_REMAT_XLA_FLAG",
    "ENV_CPU_DEVICES",
    "SimulatedDevicesError",
    "apply_cpu_devices_setting",
    "cpu_device_env",
    "requested_cpu_devices",
    "simulate_cpu_devices",
]

_COUNT_FLAG = "--xla_force_host_platform_device_count"
#: The ``XLA_FLAGS`` entry that keeps optimisation barriers on XLA:CPU, so
#: rematerialisation lowers memory there too (docs/design.md, hazard
#: "optimisation barriers on XLA:CPU").
CPU_REMAT_XLA_FLAG = "--xla_disable_hlo_passes=cse_barrier_expander"
#: Simulated CPU devices of this process, applied by ``import spmdtorch`` (:func:`apply_cpu_devices_setting`).
ENV_CPU_DEVICES = "SPMDTORCH_CPU_DEVICES"


class SimulatedDevicesError(RuntimeError):
    """Simulated CPU devices were asked for after JAX's backend started."""


def _min_threads(n: int) -> int:
    return max(16, 2 * n)


def _with_pass_disabled(flags: list[str], name: str) -> list[str]:
    # XLA keeps the last --xla_disable_hlo_passes it is given: extend the one
    # already there rather than add a second that would replace it.
    prefix = "--xla_disable_hlo_passes="
    for i, f in enumerate(flags):
        if f.startswith(prefix):
            passes = f[len(prefix) :].split(",")
            if name not in passes:
                flags[i] = f"{f},{name}"
            return flags
    return [*flags, prefix + name]


def cpu_device_env(
    n: int, env: Mapping[str, str] | None = None, *, keep_remat_barriers: bool = False
) -> dict[str, str]:
    """The environment for a process that runs on ``n`` simulated CPU devices.

    Replaces any device count already in ``XLA_FLAGS`` (other flags are kept),
    raises ``NPROC`` to at least ``max(16, 2 * n)``, and selects the CPU
    platform (``JAX_PLATFORMS=cpu``, ``PJRT_DEVICE=CPU``).

    Args:
        n: the number of CPU devices.
        env: the environment to start from (default: ``os.environ``); not changed.
        keep_remat_barriers: also add ``CPU_REMAT_XLA_FLAG``, so that
            activation checkpointing lowers memory on XLA:CPU.

    Returns:
        A new dict.

    Example:
        >>> env = cpu_device_env(4, {"XLA_FLAGS": "--xla_dump_to=/tmp/d", "NPROC": "2"})
        >>> env["XLA_FLAGS"], env["NPROC"], env["JAX_PLATFORMS"]
        ('--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=4', '16', 'cpu')
        >>> cpu_device_env(2, {"XLA_FLAGS": "--xla_disable_hlo_passes=foo"}, keep_remat_barriers=True)["XLA_FLAGS"]
        '--xla_disable_hlo_passes=foo,cse_barrier_expander --xla_force_host_platform_device_count=2'
    """
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"cpu_device_env: n must be a positive int, got {n!r}; pass the number of CPU devices, e.g. 8")
    out = dict(os.environ if env is None else env)
    flags = re.sub(rf"{_COUNT_FLAG}=\S*", "", out.get("XLA_FLAGS", "")).split()
    flags.append(f"{_COUNT_FLAG}={n}")
    if keep_remat_barriers:
        flags = _with_pass_disabled(flags, "cse_barrier_expander")
    out["XLA_FLAGS"] = " ".join(flags)
    try:
        nproc = int(out.get("NPROC", "0"))
    except ValueError:
        nproc = 0
    out["NPROC"] = str(max(nproc, _min_threads(n)))
    out["JAX_PLATFORMS"] = "cpu"
    out["PJRT_DEVICE"] = "CPU"
    return out


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from spmdtorch import _jax_private  # imports jax: only once something else has

    return _jax_private.backends_initialized()


def _joined() -> bool:
    """Whether this process joined a multi-process job: XLA read its flags then, so the device count is fixed."""
    if "jax" not in sys.modules:
        return False
    from spmdtorch import _jax_private  # imports jax: only once something else has

    return _jax_private.distributed_is_initialized()


def _count_in(flags: str) -> int | None:
    found = re.findall(rf"{_COUNT_FLAG}=(\d+)", flags)
    return int(found[-1]) if found else None


def _other_platform(env: Mapping[str, str]) -> str | None:
    """``NAME='value'`` of ``PJRT_DEVICE`` or ``JAX_PLATFORMS`` when it asks for a platform other than CPU."""
    pjrt = env.get("PJRT_DEVICE", "").strip()
    if pjrt and pjrt.upper() != "CPU":
        return f"PJRT_DEVICE={pjrt!r}"
    platforms = env.get("JAX_PLATFORMS", "").strip()
    if platforms and platforms.split(",")[0].strip().lower() != "cpu":
        return f"JAX_PLATFORMS={platforms!r}"
    return None


def _other_platform_requested() -> bool:
    return _other_platform(os.environ) is not None


def requested_cpu_devices(env: Mapping[str, str] | None = None) -> int | None:
    """The simulated CPU devices ``SPMDTORCH_CPU_DEVICES`` asks for, or None when it is unset or empty.

    Args:
        env: the environment to read (default: ``os.environ``).

    Raises:
        spmdtorch.config.ConfigError: the value is not a whole number >= 1, or
            ``PJRT_DEVICE`` / ``JAX_PLATFORMS`` ask for another platform
            (the two cannot both hold; unset one).

    Example:
        >>> requested_cpu_devices({"SPMDTORCH_CPU_DEVICES": "4"}), requested_cpu_devices({})
        (4, None)
    """
    env = os.environ if env is None else env
    n: int | None = config.read_one("cpu_devices", env)
    other = None if n is None else _other_platform(env)
    if other is not None:
        raise config.ConfigError(
            ENV_CPU_DEVICES,
            env[ENV_CPU_DEVICES],
            f"asks for simulated CPU devices but {other} asks for another platform",
            "a whole number >= 1 on the CPU platform",
            f"unset {ENV_CPU_DEVICES} to run on that platform, or unset {other.split('=')[0]} to simulate CPU devices",
        )
    return n


def simulate_cpu_devices(n: int = 8, *, keep_remat_barriers: bool = False, unless_accelerator: bool = False) -> None:
    """Run this process on ``n`` simulated CPU devices.

    Call it before the first device query (``jax.devices()``,
    ``spmdtorch.device_count()``, creating an xla tensor); importing jax or
    spmdtorch first is fine.

    Args:
        n: the number of CPU devices.
        keep_remat_barriers: keep XLA:CPU's optimisation barriers
            (``CPU_REMAT_XLA_FLAG``), as the tests do.
        unless_accelerator: do nothing when ``PJRT_DEVICE`` or
            ``JAX_PLATFORMS`` asks for another platform (benchmarks and
            examples that also run on GPU/TPU).

    In a multi-process job, ``n`` is this process's count, and joining the
    job (``import spmdtorch`` under a launcher) already fixed it: set
    ``SPMDTORCH_CPU_DEVICES`` (or the launcher's ``--devices-per-proc``)
    instead; a call asking for that same count does nothing.

    Raises:
        SimulatedDevicesError: JAX's backend already started with another
            platform or device count, or this process joined a job with
            another device count.
    """
    if unless_accelerator and _other_platform_requested():
        return
    if _backend_started():
        import jax

        devs = jax.local_devices()  # this process's: in a job, jax.devices() spans every process
        if len(devs) == n and all(d.platform == "cpu" for d in devs):
            return
        raise SimulatedDevicesError(
            f"simulate_cpu_devices({n}): JAX already started with {len(devs)} {devs[0].platform} device(s) in "
            "this process; call it at the top of the script, before anything queries devices or creates an "
            f"xla tensor (in a multi-process job, set {ENV_CPU_DEVICES} or the launcher's --devices-per-proc)"
        )
    if _joined():
        fixed = _count_in(os.environ.get("XLA_FLAGS", ""))
        if fixed == n:
            return
        has = f"{fixed} CPU device(s)" if fixed is not None else "XLA's default CPU device count"
        raise SimulatedDevicesError(
            f"simulate_cpu_devices({n}): this process joined a multi-process job with {has}, and joining "
            f"fixed the count; set {ENV_CPU_DEVICES}={n} (or the launcher's --devices-per-proc {n}) instead"
        )
    os.environ.update(cpu_device_env(n, keep_remat_barriers=keep_remat_barriers))
    if "jax" in sys.modules:  # imported already: its platform setting was read from the environment then
        import jax

        jax.config.update("jax_platforms", "cpu")


def apply_cpu_devices_setting() -> int | None:
    """Runs this process on ``SPMDTORCH_CPU_DEVICES`` simulated CPU devices, if it is set.

    ``import spmdtorch`` calls it before joining a multi-process job (after
    which the device count is fixed), so a script needs no
    :func:`simulate_cpu_devices` call of its own under torchrun:
    ``SPMDTORCH_CPU_DEVICES=4 torchrun --nproc-per-node 2 train.py`` gives a
    job of 8 devices.

    Returns:
        The device count applied, or None when the variable is unset.

    Raises:
        spmdtorch.config.ConfigError: the value is malformed or conflicts with
            ``PJRT_DEVICE`` / ``JAX_PLATFORMS`` (:func:`requested_cpu_devices`).
        SimulatedDevicesError: JAX's backend already started with another
            platform or device count (import spmdtorch before using JAX).
    """
    n = requested_cpu_devices()
    if n is None:
        return None
    try:
        simulate_cpu_devices(n)
    except SimulatedDevicesError as e:
        raise SimulatedDevicesError(
            f"{ENV_CPU_DEVICES}={n} cannot take effect: {e}. Import spmdtorch before anything uses JAX, "
            f"or unset {ENV_CPU_DEVICES}"
        ) from e
    return n
