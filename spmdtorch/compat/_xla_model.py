"""``torch_xla.core.xla_model`` (``xm``) on spmdtorch, in SPMD mode's meaning.

Device and ordinal names count PyTorch/XLA's SPMD virtual device: one per
process (``xm.xrt_world_size()`` is the number of processes,
``xm.get_xla_supported_devices()`` is ``['xla:0']``). Gradients need no
cross-replica reduction in an SPMD program (the partitioner inserts it), so
``optimizer_step`` is ``optimizer.step()`` plus the optional barrier, and the
replica collectives are identities in a job of one process.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypedDict

import torch
import torch.utils._pytree as pytree

import spmdtorch
from spmdtorch import ArgumentError, data, debug, fsdp, runtime
from spmdtorch.compat._spmd import ShardingSpec
from spmdtorch.compat.errors import MultiprocessNotSupportedError, ReplicaGroupsError
from spmdtorch.lazy import metrics

__all__ = [
    "REDUCE_AND",
    "REDUCE_MAX",
    "REDUCE_MIN",
    "REDUCE_MUL",
    "REDUCE_OR",
    "REDUCE_SUM",
    "MemoryInfo",
    "RateTracker",
    "ShardingSpec",
    "_fetch_gradients",
    "_maybe_convert_to_cpu",
    "add_step_closure",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast_master_param",
    "collective_broadcast",
    "collective_permute",
    "fork_rng",
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
    "optimization_barrier_",
    "optimizer_step",
    "reduce_gradients",
    "reduce_scatter",
    "rendezvous",
    "recv",
    "save",
    "send",
    "send_cpu_data_to_device",
    "set_replication",
    "set_rng_state",
    "unlazy",
    "wait_device_ops",
    "xla_device",
    "xla_device_hw",
    "xla_device_kind",
    "xla_real_devices",
    "xla_rendezvous",
    "xla_replication_devices",
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


def _virtual_index(device: Any, func: str) -> int:
    """The index of an xla device (``'xla:0'``, ``torch.device('xla', 0)``), checked."""
    try:
        dev = torch.device(device)
    except (TypeError, RuntimeError):
        dev = None
    if dev is None or dev.type != "xla":
        raise ArgumentError(
            f"xm.{func}: device must be an xla device, got {type(device).__name__} {device!r}; "
            "pass torch_xla.device() ('xla:0')"
        )
    return dev.index or 0


def xla_real_devices(devices: Sequence[Any] | None = None) -> list[str]:
    """The runtime device behind each xla device, as PyTorch/XLA's SPMD mode names it.

    ``xla_real_devices([torch_xla.device()])`` is ``['CPU:0']`` (``'TPU:0'``...):
    the virtual device's first runtime device, as in PyTorch/XLA. Without an
    argument, every physical device of this process, e.g. ``['CPU:0', ..., 'CPU:7']``.
    """
    kind = runtime.device_type()
    if devices is None:
        return [f"{kind}:{i}" for i in range(runtime.addressable_runtime_device_count())]
    return [f"{kind}:{_virtual_index(d, 'xla_real_devices')}" for d in devices]


def xla_replication_devices(local_devices: Sequence[Any] | None = None) -> list[str]:
    """The runtime devices a replicated computation over ``local_devices`` runs on (SPMD: the virtual device's).

    Raises:
        ArgumentError: ``local_devices`` is not the process's one virtual device
            (PyTorch/XLA replicates only across all devices of one kind).
    """
    devices = list(local_devices) if local_devices is not None else get_xla_supported_devices()
    supported = get_xla_supported_devices()
    if len(devices) != len(supported):
        raise ArgumentError(
            f"xm.xla_replication_devices: local_devices: cannot replicate over {len(devices)} devices {devices!r}: in SPMD mode a "
            f"process has {len(supported)} xla device ({supported!r}); pass xm.get_xla_supported_devices()"
        )
    return sorted(set(xla_real_devices(devices)), key=lambda d: int(d.rpartition(":")[2]))


def set_replication(device: Any, devices: Sequence[Any] | None) -> None:
    """Accepts PyTorch/XLA's replication setup (accelerate calls it for every XLA run).

    In SPMD mode there is one replica per process and the partitioner places
    the data, so there is nothing to set up; the arguments are checked as
    PyTorch/XLA checks them (``device`` must be one of ``devices``).

    Raises:
        ArgumentError: ``device`` is not an xla device, or ``devices`` is given
            and does not hold it or is not the process's device list.
    """
    name = str(torch.device(device)) if isinstance(device, (str, torch.device)) else device
    _virtual_index(device, "set_replication")
    if devices:
        listed = [str(d) for d in devices]
        xla_replication_devices(listed)
        if name not in listed:
            raise ArgumentError(
                f"xm.set_replication: device must be one of devices {listed!r}, got {name!r}; "
                "pass the device you run on and xm.get_xla_supported_devices()"
            )


def xla_device_kind(device: Any = None) -> str:
    """The vendor's device kind string of the devices (JAX's ``device_kind``: ``'cpu'``, ``'TPU v5 lite'``...)."""
    if device is not None:
        _virtual_index(device, "xla_device_kind")
    return str(runtime.local_jax_devices()[0].device_kind)


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


def _fetch_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The ``.grad.data`` of every parameter of ``optimizer`` that has a gradient, in group order.

    accelerate and PyTorch/XLA's ``reduce_gradients`` take these and all-reduce
    them in place (an identity in a one-process SPMD job, see :func:`all_reduce`).
    """
    return [
        p.grad.data
        for group in optimizer.param_groups
        for p in group["params"]
        if isinstance(p, torch.Tensor) and p.grad is not None
    ]


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


#: The spmdtorch.sharding collective (inside shard_map) that does what each xm one does between devices.
_SHARD_MAP_COLLECTIVE = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "collective_broadcast": "all_gather (then take the root's block)",
}


def _check_groups(groups: Any, name: str) -> None:
    """Refuses ``groups`` naming any replica but 0: one process is one replica in SPMD mode.

    ``groups=[[0, 1], [2, 3], ...]`` asks for a collective between devices;
    taken as one replica it would return the input unchanged, where the
    collective the user meant (a ``shard_map`` psum over those devices) gives
    another value.
    """
    if groups is None:
        return
    try:
        members = [int(r) for group in groups for r in group]
    except (TypeError, ValueError):
        raise ReplicaGroupsError(
            f"xm.{name}: groups must be a list of lists of replica ordinals, got {groups!r}"
        ) from None
    if any(r != 0 for r in members):
        raise ReplicaGroupsError(
            f"xm.{name}(groups={groups!r}): in SPMD mode this process is one replica (ordinal 0), so groups over "
            f"other ordinals name replicas that do not exist; the collective you mean is one between devices. "
            f"Write it as spmdtorch.sharding.{_SHARD_MAP_COLLECTIVE.get(name, 'all_reduce')} inside "
            "spmdtorch.sharding.shard_map over the mesh axis that forms those groups, or drop groups= "
            "(the whole job is one replica: the result is the input)"
        )


def all_reduce(reduce_type: str, inputs: Any, scale: float = 1.0, groups: Any = None, pin_layout: bool = True) -> Any:
    """A job of one process holds one replica: a copy of the tensor (times ``scale``), as PyTorch/XLA does.

    Raises:
        MultiprocessNotSupportedError: the job has several processes.
        ReplicaGroupsError: ``groups`` names replicas other than 0.
    """
    if runtime.world_size() != 1:
        raise _multiprocess_collective("all_reduce")
    _check_groups(groups, "all_reduce")
    if isinstance(inputs, torch.Tensor):
        return inputs.clone() if scale == 1.0 else inputs * scale
    if scale != 1.0:
        for t in inputs:
            t.mul_(scale)
    return inputs


def all_gather(
    value: torch.Tensor, dim: int = 0, groups: Any = None, output: Any = None, pin_layout: bool = True
) -> Any:
    """One replica: the value itself (copied into ``output`` when given).

    Raises:
        MultiprocessNotSupportedError: the job has several processes.
        ReplicaGroupsError: ``groups`` names replicas other than 0.
    """
    if runtime.world_size() != 1:
        raise _multiprocess_collective("all_gather")
    _check_groups(groups, "all_gather")
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
    _check_groups(groups, "reduce_scatter")
    out = input * scale
    if output is not None:
        output.copy_(out)
        return output
    return out


def all_to_all(*args: Any, **kwargs: Any) -> Any:
    raise _multiprocess_collective("all_to_all")


def collective_broadcast(
    tensors: Sequence[torch.Tensor], root_ordinal: int = 0, groups: Any = None, pin_layout: bool = True
) -> None:
    """Every replica's ``tensors`` take the root replica's values, in place: with one replica, they are left alone.

    Raises:
        ArgumentError: ``root_ordinal`` is not a replica's ordinal (only 0 exists).
        MultiprocessNotSupportedError: the job has several processes.
        ReplicaGroupsError: ``groups`` names replicas other than 0.
    """
    if runtime.world_size() != 1:
        raise _multiprocess_collective("collective_broadcast")
    _check_groups(groups, "collective_broadcast")
    if root_ordinal != 0:
        raise ArgumentError(
            f"xm.collective_broadcast: root_ordinal must be a replica's ordinal (0: a one-process SPMD job has "
            f"one replica), got {root_ordinal!r}; pass root_ordinal=0"
        )


def _point_to_point(name: str) -> MultiprocessNotSupportedError:
    return MultiprocessNotSupportedError(
        f"xm.{name} moves data between the replicas of a multiprocess job; spmdtorch is SPMD only: tensors are "
        "global, so annotate them with xs.mark_sharding, or use jax.lax.ppermute through "
        "spmdtorch.sharding.shard_map for a hand-written exchange"
    )


def collective_permute(value: torch.Tensor, pairs: Any) -> torch.Tensor:
    raise _point_to_point("collective_permute")


def send(value: torch.Tensor, channel_id: int) -> torch.Tensor:
    raise _point_to_point("send")


def recv(output: torch.Tensor, channel_id: int) -> torch.Tensor:
    raise _point_to_point("recv")


def rendezvous(tag: str, payload: bytes = b"", replicas: Sequence[int] = ()) -> list[bytes]:
    """Every process's payload, in process order (``spmdtorch.runtime.rendezvous``)."""
    if replicas:
        raise MultiprocessNotSupportedError(
            f"xm.rendezvous(..., replicas={list(replicas)!r}): a rendezvous of some replicas only; in SPMD mode "
            "every process takes part (pass replicas=[])"
        )
    return runtime.rendezvous(tag, payload)


def xla_rendezvous(payload: bytes = b"", ordinals: Sequence[int] | None = None, tag: str | None = None) -> list[bytes]:
    """Every process's ``payload``, in process order (``ordinals`` must be all or None)."""
    if ordinals is not None and sorted(ordinals) != list(range(runtime.world_size())):
        raise MultiprocessNotSupportedError(
            f"xm.xla_rendezvous(ordinals={list(ordinals)!r}): a rendezvous of some replicas only; in SPMD mode "
            "every process takes part (pass ordinals=None)"
        )
    return runtime.rendezvous(tag or "xla_rendezvous", payload)


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


@contextlib.contextmanager
def fork_rng(device: Any = None, enabled: bool = True) -> Iterator[None]:
    """Random numbers drawn inside the block leave the generator where it was before it."""
    if not enabled:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        yield


def _maybe_convert_to_cpu(data: Any, convert: bool = True) -> Any:
    """``data`` with every plain xla tensor (not a ``Parameter``) replaced by a CPU copy, as PyTorch/XLA does.

    Everything pending is computed first; with ``convert=False`` the tensors stay
    on the device. transformers and accelerate call it on state dicts before saving.
    """
    spmdtorch.sync(wait=True)
    if not convert:
        return data

    def to_cpu(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter) and is_xla_tensor(x):
            return x.cpu()
        return x

    return pytree.tree_map(to_cpu, data)


def send_cpu_data_to_device(datas: Any, device: Any, input_sharding: ShardingSpec | None = None) -> Any:
    """``datas`` with every CPU tensor moved to ``device`` (sharded by ``input_sharding`` when given).

    A bare tensor comes back as a one-element list, as in PyTorch/XLA. Other
    leaves (numbers, strings, tensors already on xla) are left as they are.
    """
    if isinstance(datas, torch.Tensor) and not is_xla_tensor(datas):
        datas = [datas]
    # Counted as PyTorch/XLA counts them (its OutboundData metric, read back by
    # its tests); spmdtorch.data's batch transfer keeps no counters of its own.
    moved = [t for t in pytree.tree_leaves(datas) if isinstance(t, torch.Tensor) and not is_xla_tensor(t)]
    with metrics.timed("TransferToDeviceTime"):
        out = data.send_cpu_data_to_device(datas, device, input_sharding=input_sharding)
    metrics.inc("TransferToDevice", len(moved))
    metrics.inc("OutboundBytes", sum(t.nbytes for t in moved))
    return out


def optimization_barrier_(tensors: list[torch.Tensor]) -> None:
    """Keeps XLA from moving computation across this point: ``tensors`` are replaced in place by the barrier's outputs."""
    outs = fsdp.optimization_barrier(*tensors)
    with torch.no_grad():
        for t, o in zip(tensors, outs):
            t.data = o


class RateTracker:
    """Items per second, smoothed, as PyTorch/XLA's examples print it.

    ``add(count)`` counts items; ``rate()`` is the rate since the previous
    ``rate()`` call, blended with that previous rate by ``smooth_factor``
    (``RATE_TRACKER_SMOOTHING``, default 0.4); ``global_rate()`` is the rate
    since construction.
    """

    def __init__(self, smooth_factor: float | None = None) -> None:
        if smooth_factor is None:
            smooth_factor = float(os.environ.get("RATE_TRACKER_SMOOTHING", "0.4"))
        self._smooth_factor = smooth_factor
        self._start_time = time.time()
        self._last_time = self._start_time
        self._last_rate: float | None = None
        self._count = 0.0  # since the last rate()
        self._total = 0.0

    def add(self, count: float) -> None:
        self._count += count
        self._total += count

    def rate(self) -> float:
        now = time.time()
        elapsed = now - self._last_time
        if elapsed <= 0:
            return 0.0
        current = self._count / elapsed
        if self._last_rate is not None:
            current = (1 - self._smooth_factor) * current + self._smooth_factor * self._last_rate
        self._last_rate = current
        self._last_time = now
        self._count = 0.0
        return current

    def global_rate(self) -> float:
        elapsed = time.time() - self._start_time
        return self._total / elapsed if elapsed > 0 else 0.0


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
