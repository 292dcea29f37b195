"""spmdtorch: run ordinary PyTorch programs sharded over every device with GSPMD.

Example:
    >>> import torch, spmdtorch
    >>> x = torch.randn(4, 4, device="xla")
    >>> y = (x @ x).sum()
    >>> spmdtorch.sync()
    >>> y.item() == y.item()
    True
"""

from spmdtorch import runtime as runtime
from spmdtorch.runtime import cpu_devices as _cpu_devices

# SPMDTORCH_CPU_DEVICES (torchrun on a CPU-only machine): before JAX starts and before joining fixes the count.
_cpu_devices.apply_cpu_devices_setting()
runtime._apply_pjrt_device_env()
# Started as one of several processes (spmdtorch.launch, torchrun, Slurm, MPI, a TPU slice)?
# Join the job now, before anything below or in the user's script queries a device.
runtime.auto_initialize_distributed()

from spmdtorch import ops as _ops  # noqa: F401  (fills the lowering table)
from spmdtorch.tensor import device_mode as _device_mode
from spmdtorch.tensor import random_state as _random_state

_device_mode.install()
_random_state.register()  # torch.xla: RNG state for torch.utils.checkpoint / fork_rng
from spmdtorch.tensor import optim_hooks as _optim_hooks

_optim_hooks.install()  # torch.optim takes its foreach path on xla tensors

from spmdtorch import (
    data,
    debug,
    fsdp,
    mesh,
    partition,
    plan,
    sharding,
)
from spmdtorch._checks import ArgumentError, ArgumentTypeError
from spmdtorch.lazy.contract import CompileContractError
from spmdtorch.lazy.rng import RandomGeneratorError, manual_seed
from spmdtorch.plan import materialize
from spmdtorch.programs import (
    AssumePureError,
    CallJaxError,
    CompiledArgumentTypeError,
    CompiledFunction,
    ScanError,
    add_step_closure,
    assume_pure,
    call_jax,
    compile,
    mark_step,
    scan,
    scan_layers,
    step,
    sync,
    wait_device_ops,
)
from spmdtorch.runtime import device, device_count, devices
from spmdtorch.tensor.xla_tensor import XlaTensor

__version__ = "0.1.0"


def __getattr__(name: str):
    # spmdtorch.checkpoint is imported on first use: it brings
    # torch.distributed.checkpoint (torch.distributed.tensor, sympy) and
    # Orbax, a third of `import spmdtorch`'s time, which a process that never
    # saves (every worker of a data pipeline, every inference job) need not pay.
    if name == "checkpoint":
        import importlib

        return importlib.import_module("spmdtorch.checkpoint")
    raise AttributeError(f"module 'spmdtorch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"checkpoint"})


__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "AssumePureError",
    "CallJaxError",
    "CompileContractError",
    "CompiledArgumentTypeError",
    "CompiledFunction",
    "RandomGeneratorError",
    "ScanError",
    "XlaTensor",
    "add_step_closure",
    "assume_pure",
    "call_jax",
    "checkpoint",
    "compile",
    "data",
    "debug",
    "device",
    "device_count",
    "devices",
    "fsdp",
    "manual_seed",
    "mark_step",
    "materialize",
    "mesh",
    "partition",
    "plan",
    "runtime",
    "scan",
    "scan_layers",
    "sharding",
    "step",
    "sync",
    "wait_device_ops",
]
