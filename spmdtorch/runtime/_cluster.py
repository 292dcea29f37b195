"""Noticing that this process is one of several processes of one job.

A launcher that starts several processes leaves its mark in their
environment: ``python -m spmdtorch.launch`` its ``SPMDTORCH_*`` variables,
torchrun ``WORLD_SIZE``, Slurm's ``srun`` ``SLURM_STEP_NUM_TASKS``, Open MPI
``OMPI_COMM_WORLD_SIZE``, MPICH / Intel MPI ``PMI_SIZE``, and a multi-host
Cloud TPU slice ``TPU_WORKER_HOSTNAMES`` / ``TPU_PROCESS_ADDRESSES`` /
``MEGASCALE_NUM_SLICES``. :func:`detect_job` reads these marks (through
:mod:`spmdtorch.config`; no JAX, no network) so that ``spmdtorch`` can join
the job before the first device query, as PyTorch/XLA's runtime does, instead
of running as several independent single-process jobs.

Example:
    >>> detect_job({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"})
    JobEnvironment(launcher='torchrun', num_processes=2, evidence='WORLD_SIZE=2', jax_detection=None)
    >>> detect_job({"WORLD_SIZE": "1"}) is None
    True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from spmdtorch import config

__all__ = ["JobEnvironment", "detect_job"]


@dataclasses.dataclass(frozen=True, slots=True)
class JobEnvironment:
    """The launcher that started this process as one of several.

    Attributes:
        launcher: ``"spmdtorch.launch"``, ``"torchrun"``, ``"slurm"``,
            ``"openmpi"``, ``"mpi"`` or ``"tpu"``.
        num_processes: How many processes the launcher says there are, or None
            when only JAX's detection can tell (a TPU slice).
        evidence: The variables that say so, ``NAME=value``, for messages.
        jax_detection: The ``cluster_detection_method`` JAX must use to find
            the coordinator (``"mpi4py"``: JAX does not try it by default), or
            None for JAX's default detection (or when spmdtorch resolves the
            settings itself: the launcher, torchrun).
    """

    launcher: str
    num_processes: int | None
    evidence: str
    jax_detection: str | None = None


def detect_job(env: Mapping[str, str]) -> JobEnvironment | None:
    """Returns the multi-process launcher that started this process, or None.

    A launcher that says there is a single process (``WORLD_SIZE=1``,
    ``SPMDTORCH_NUM_PROCESSES=1``...) is no job to join: None.

    Args:
        env: The environment (``os.environ``).

    Raises:
        spmdtorch.config.ConfigError: a variable it reads is malformed.

    Example:
        >>> detect_job({"SLURM_STEP_NUM_TASKS": "4"}).launcher
        'slurm'
    """

    def var(field: str) -> Any:
        return config.read_one(field, env)

    if var("coordinator_address") is not None or var("num_processes") is not None:
        n = var("num_processes")
        if n == 1:
            return None
        return JobEnvironment("spmdtorch.launch", n, f"SPMDTORCH_NUM_PROCESSES={n}")
    world = var("world_size")
    if world is not None and world > 1:
        return JobEnvironment("torchrun", world, f"WORLD_SIZE={world}")
    tasks = var("slurm_step_num_tasks")
    if tasks is not None and tasks > 1:
        return JobEnvironment("slurm", tasks, f"SLURM_STEP_NUM_TASKS={tasks}")
    ompi = var("ompi_world_size")
    if ompi is not None and ompi > 1:
        # JAX's Open MPI detection reads Open MPI 4's daemon URI; Open MPI 5 has none.
        method = None if var("ompi_hnp_uri") else "mpi4py"
        return JobEnvironment("openmpi", ompi, f"OMPI_COMM_WORLD_SIZE={ompi}", method)
    pmi = var("pmi_size")
    if pmi is not None and pmi > 1:
        return JobEnvironment("mpi", pmi, f"PMI_SIZE={pmi}", "mpi4py")
    slices = var("megascale_num_slices")
    if slices is not None and slices > 1:
        return JobEnvironment("tpu", None, f"MEGASCALE_NUM_SLICES={slices}")
    for field, name in (
        ("tpu_process_addresses", "TPU_PROCESS_ADDRESSES"),
        ("tpu_worker_hostnames", "TPU_WORKER_HOSTNAMES"),
    ):
        hosts = var(field)
        if hosts is not None:
            count = len([h for h in hosts.split(",") if h.strip()])
            if count > 1:
                return JobEnvironment("tpu", count, f"{name}={hosts}")
            return None  # JAX reads the first one set: a one-host slice
    return None
