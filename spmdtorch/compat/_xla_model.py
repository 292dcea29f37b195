"""``torch_xla.core.xla_model`` (``xm``) on spmdtorch, in SPMD mode's meaning.

Device and ordinal names count PyTorch/XLA's SPMD virtual device: one per
process (``xm.xrt_world_size()`` is the number of processes,
``xm.get_xla_supported_devices()`` is ``['xla:0']``). Gradients need no
cross-replica reduction in an SPMD program (the partitioner inserts it), so
``optimizer_step`` is ``optimizer.step()`` plus the optional barrier, and the
replica collectives are identities in a job of one process.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypedDict

import torch
import torch.utils._pytree as pytree

import spmdtorch
from spmdtorch import debug, runtime
from spmdtorch.compat.errors import MultiprocessNotSupportedError

__all__ = [
    "REDUCE_AND",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_MUL",
    "REDUCE_OR",
    "REDUCE_SUM",
    "MemoryInfo",
    "add_step_closure",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast_master_param",
    "get_local_ordinal",
    "get_memory_info",
    "get_ordinal",
    "get_rng_state",
    "get_stablehlo",
    "get_stablehlo_bytecode",
    "get_xla_supported_devices",
    "is_master_ordinal",
    "is_xla_tensor",
    "mark_step",
    "master_print",
    "mesh_reduce",
    "optimizer_step",
    "reduce_gradients",
    "reduce_scatter",
    "rendezvous",
    "save",
    "set_rng_state",
    "unlazy",
    "wait_device_ops",
    "xla_device",
    "xla_device_hw",
    "xla_real_devices",
    "xrt_world_size",
]

REDUCE_SUM = "sum"
REDUCE_MUL = "mul"
REDUCE_AND = "and"
REDUCE_OR = "or"
REDUCE_MIN = "min"
REDUCE_MAX = "max"


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """``xm.xla_device()``: ``xla:0`` (``xla:n`` when given), SPMD's virtual device."""
    return runtime.device(n)


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list[str]:
    """In SPMD mode, the one virtual device: ``['xla:0']``."""
    return ["xla:0"]


def xla_real_devices(devices: Sequence[Any] | None = None) -> list[str]:
    """The physical devices behind the virtual device, e.g. ``['CPU:0', ..., 'CPU:7']``."""
    kind = runtime.device_type()
    return [f"{kind}:{i}" for i in range(runtime.addressable_runtime_device_count())]


def xla_device_hw(device: Any) -> str:
    """The hardware type of the xla device: ``"CPU"``, ``"CUDA"`` or ``"TPU"``."""
    return runtime.device_type()


def is_xla_tensor(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "xla"


def xrt_world_size(defval: int = 1) -> int:
    return runtime.world_size()


def get_ordinal(defval: int = 0) -> int:
    return runtime.global_ordinal()


def get_local_ordinal(defval: int = 0) -> int:
    return runtime.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    """Whether this process is the (host-local or global) master: ordinal 0."""
    return (runtime.local_ordinal() if local else runtime.global_ordinal()) == 0


def master_print(*args: Any, fd: Any = sys.stdout, local: bool = False, flush: bool = False) -> None:
    if is_master_ordinal(local=local):
        print(*args, file=fd, flush=flush)


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """``xm.mark_step()``: run everything recorded so far, then the step closures."""
    spmdtorch.mark_step(wait=wait)


def wait_device_ops(devices: Sequence[Any] = ()) -> None:
    spmdtorch.wait_device_ops()


def unlazy(tensors: Sequence[torch.Tensor]) -> None:
    spmdtorch.sync(wait=True)


def optimizer_step(
    optimizer: torch.optim.Optimizer,
    barrier: bool = False,
    optimizer_args: dict[str, Any] | None = None,
    groups: Any = None,
    pin_layout: bool = True,
) -> Any:
    """``optimizer.step(**optimizer_args)``, then ``mark_step()`` if ``barrier``.

    No gradient all-reduce: in an SPMD program every gradient is already the
    whole batch's (the partitioner reduces it), as in PyTorch/XLA's SPMD mode.
    """
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss


def reduce_gradients(optimizer: torch.optim.Optimizer, groups: Any = None, pin_layout: bool = True) -> None:
    """Nothing to do in SPMD mode: the gradients are already reduced over the batch."""


def broadcast_master_param(model: torch.nn.Module) -> None:
    """Nothing to do in SPMD mode: every parameter is one global tensor."""


def _multiprocess_collective(name: str) -> MultiprocessNotSupportedError:
    return MultiprocessNotSupportedError(
        f"xm.{name} reduces across the replicas of a multiprocess job of {runtime.process_count()} processes; "
        "spmdtorch is SPMD only: tensors are global, so annotate them with xs.mark_sharding and let the "
        f"partitioner insert collectives, or call spmdtorch.sharding.{name if name != 'all_to_all' else 'all_gather'} "
        "inside spmdtorch.sharding.shard_map for a hand-written one"
    )


def all_reduce(reduce_type: str, inputs: Any, scale: float = 1.0, groups: Any = None, pin_layout: bool = True) -> Any:
    """A job of one process holds one replica: a copy of the tensor (times ``scale``), as PyTorch/XLA does.

    Raises:
        MultiprocessNotSupportedError: the job has several processes.
    """
    if runtime.world_size() != 1:
        raise _multiprocess_collective("all_reduce")
    if isinstance(inputs, torch.Tensor):
        return inputs.clone() if scale == 1.0 else inputs * scale
    if scale != 1.0:
        for t in inputs:
            t.mul_(scale)
    return inputs


def all_gather(
    value: torch.Tensor, dim: int = 0, groups: Any = None, output: Any = None, pin_layout: bool = True
) -> Any:
    """One replica: the value itself (copied into ``output`` when given)."""
    if runtime.world_size() != 1:
        raise _multiprocess_collective("all_gather")
    if output is not None:
        output.copy_(value)
        return output
    return value.clone()


def reduce_scatter(
    reduce_type: str,
    input: Any,
    scale: float,
    scatter_dim: int,
    shard_count: int,
    groups: Any = None,
    output: Any = None,
    pin_layout: bool = True,
) -> Any:
    """One replica (``shard_count`` 1): the input times ``scale``."""
    if runtime.world_size() != 1 or shard_count != 1:
        raise _multiprocess_collective("reduce_scatter")
    out = input * scale
    if output is not None:
        output.copy_(out)
        return output
    return out


def all_to_all(*args: Any, **kwargs: Any) -> Any:
    raise _multiprocess_collective("all_to_all")


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Every process's payload, in process order (``spmdtorch.runtime.rendezvous``)."""
    if replicas:
        raise MultiprocessNotSupportedError(
            f"xm.rendezvous(..., replicas={list(replicas)!r}): a rendezvous of some replicas only; in SPMD mode "
            "every process takes part (pass replicas=[])"
        )
    return runtime.rendezvous(tag, payload)


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """``reduce_fn`` over every process's ``data`` (exchanged by :func:`rendezvous`)."""
    cpu = pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x, data)
    return reduce_fn([pickle.loads(p) for p in rendezvous(tag, pickle.dumps(cpu))])


def save(data: Any, file_or_path: Any, master_only: bool = True, global_master: bool = False) -> None:
    """``torch.save`` of ``data`` with every xla tensor moved to the CPU, by the master process only.

    Every process must call it (reading a tensor that spans other hosts is a
    collective); with ``master_only`` only ordinal 0 (of the host, or of the
    job with ``global_master``) writes.
    """
    cpu = pytree.tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) and is_xla_tensor(x) else x, data)
    if not master_only or is_master_ordinal(local=not global_master):
        torch.save(cpu, file_or_path)


def set_rng_state(seed: int, device: Any = None) -> None:
    """Seeds the generator spmdtorch's random ops draw from (torch's default one)."""
    torch.manual_seed(int(seed))


def get_rng_state(device: Any = None) -> int:
    """An integer seed of the random stream from here on: ``set_rng_state(get_rng_state())`` replays it.

    spmdtorch's random ops draw from torch's CPU generator, whose state is not
    an integer: this draws a seed from it and re-seeds it with that seed, so
    the returned integer determines everything drawn afterwards (as
    PyTorch/XLA's device seed does).
    """
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64).item())
    torch.manual_seed(seed)
    return seed


add_step_closure = spmdtorch.add_step_closure


class MemoryInfo(TypedDict):
    bytes_used: int
    bytes_limit: int
    peak_bytes_used: int


def get_memory_info(device: Any = None) -> MemoryInfo:
    """``{'bytes_used', 'bytes_limit', 'peak_bytes_used'}`` of the device (``spmdtorch.runtime.memory_info``)."""
    index = None
    if device is not None:
        index = torch.device(device).index
    info = runtime.memory_info(index)
    return MemoryInfo(bytes_used=info.bytes_used, bytes_limit=info.bytes_limit, peak_bytes_used=info.peak_bytes_used)


def get_stablehlo(tensors: Sequence[torch.Tensor] | None = None) -> str:
    """StableHLO text of the pending graph (of ``tensors``, or of every pending tensor)."""
    return debug.get_stablehlo(None if not tensors else list(tensors))


def get_stablehlo_bytecode(tensors: Sequence[torch.Tensor] | None = None) -> bytes:
    """StableHLO bytecode of the pending graph (of ``tensors``, or of every pending tensor)."""
    return debug.get_stablehlo_bytecode(None if not tensors else list(tensors))
