"""``torch_xla._XLAC``: the calls PyTorch/XLA's guides, test suite and Hugging Face use, with their signatures.

PyTorch/XLA's C extension has hundreds of entry points into its own IR and
runtime; those with an spmdtorch meaning are here (the sharding string and
type of a tensor, its debug summary and a stable id, the pending graph's HLO
and hash, building a sharded tensor from per-device CPU shards, joining the
job's coordinator). Every other ``_XLAC`` name of PyTorch/XLA 2.9 raises
:class:`~spmdtorch.compat.TorchXlaNameError` when used (see ``_placeholders``).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import signal
import threading
import types
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import torch

import spmdtorch
from spmdtorch import debug, lazy, runtime, sharding
from spmdtorch.compat import _lowering as lowering  # torch_xla._XLAC.lowering.LoweringContext
from spmdtorch.compat.errors import CompatError
from spmdtorch.mesh import Mesh as _Mesh
from spmdtorch.sharding import ShardingError
from spmdtorch.tensor import transfer

__all__ = [
    "lowering",
    "CpuShardsError",
    "OpSharding",
    "OpShardingError",
    "_activate_preemption_sync_manager",
    "_deactivate_preemption_sync_manager",
    "_ensure_xla_coordinator_initialized",
    "_get_executed_fallback_ops",
    "_get_graph_hash",
    "_get_xla_sharding_spec",
    "_get_xla_sharding_type",
    "_get_xla_tensor_debug_info",
    "_get_xla_tensors_hlo",
    "_get_xla_tensors_text",
    "_global_tensor_from_cpu_shards",
    "_is_placecholder",
    "_mark_manual_sharding",
    "_spmd_full_to_shard_shape",
    "_spmd_shard_to_full_shape",
    "_sync_point_reached",
    "_xla_get_auto_sharding",
    "_xla_get_tensor_id",
    "_xla_metrics_report",
    "_xla_sync_multi",
]

#: XLA's primitive type names, as PyTorch/XLA prints shapes (``f32[8,32]``).
_XLA_TYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int64: "s64",
    torch.int32: "s32",
    torch.int16: "s16",
    torch.int8: "s8",
    torch.uint8: "u8",
    torch.bool: "pred",
    torch.complex64: "c64",
    torch.complex128: "c128",
}

#: PyTorch/XLA's device name for SPMD's virtual device, which every tensor reports in SPMD mode.
_SPMD_DEVICE = "SPMD:0"


def _xla_tensor(t: Any, fn: str) -> spmdtorch.XlaTensor:
    if not isinstance(t, spmdtorch.XlaTensor):
        raise TypeError(
            f"torch_xla._XLAC.{fn}: expected a tensor on the xla device, got "
            f"{type(t).__name__ if not isinstance(t, torch.Tensor) else f'a tensor on {t.device}'}; "
            "move it with t.to('xla')"
        )
    return t


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    """The tensor's HLO sharding string (``""`` when it has no annotation), as PyTorch/XLA prints it.

    An explicitly replicated tensor (``mark_sharding`` with an all-``None``
    spec, or a one-way mesh axis) reports ``{replicated}``, as in PyTorch/XLA,
    and so does a replicated value a program computed (PyTorch/XLA gives every
    SPMD program output its executable's output sharding); data just placed
    from the host reports ``""``.
    """
    return sharding.get_sharding_spec(tensor, computed=True)


def _get_xla_sharding_type(tensor: torch.Tensor) -> int | None:
    """PyTorch/XLA's ``ShardingType`` value of the tensor's sharding, or None when it has none."""
    if not sharding.get_sharding_spec(tensor, computed=True):
        return None
    return int(sharding.sharding_type(tensor))


def _post_optimizations() -> bool:
    """``XLA_DUMP_POST_OPTIMIZATIONS`` is set true: HLO dumps show the compiled (partitioned) program."""
    return os.environ.get("XLA_DUMP_POST_OPTIMIZATIONS", "").strip().lower() in ("1", "true", "yes")


def _get_xla_tensors_hlo(tensors: Sequence[torch.Tensor]) -> str:
    """HLO text of a program computing ``tensors``, as PyTorch/XLA gives it (before partitioning, or
    after when ``XLA_DUMP_POST_OPTIMIZATIONS`` is set).

    Pending tensors: the pending graph computing them. Tensors already
    computed (all of them): PyTorch/XLA's graph of a computed tensor is its
    device data, a parameter carrying the data's sharding, so the program is
    the identity over their arrays, each parameter annotated with its sharding
    (``sharding={devices=[1,8]...}``, ``{replicated}``).
    """
    tensors = list(tensors)
    # PyTorch/XLA reads XLA_DUMP_POST_OPTIMIZATIONS at each call (its suite patches it around one test).
    text = debug.get_hlo_text(tensors, optimized=_post_optimizations())
    if text or not tensors:
        return text
    arrays = []
    for i, t in enumerate(tensors):
        value = debug.read_value(_xla_tensor(t, "_get_xla_tensors_hlo"))
        if isinstance(value, debug.LazyRef):  # pragma: no cover - get_hlo_text lowered every pending one
            raise AssertionError(f"tensors[{i}] is pending but had no graph")
        arrays.append(value)

    def device_data(*xs: jax.Array) -> tuple[jax.Array, ...]:  # names the module: HloModule jit_device_data
        return xs

    identity = jax.jit(device_data, out_shardings=tuple(a.sharding for a in arrays))
    return str(identity.lower(*arrays).as_text(dialect="hlo"))


def _get_xla_tensors_text(tensors: Sequence[torch.Tensor]) -> str:
    """The pending graph computing ``tensors`` as text: StableHLO (spmdtorch's IR is JAX's)."""
    return debug.get_stablehlo(list(tensors))


def _xla_sync_multi(
    tensors: Sequence[torch.Tensor], devices: Sequence[str] = (), wait: bool = True, sync_xla_data: bool = True
) -> None:
    """Computes the pending tensors (spmdtorch computes every pending tensor at a barrier)."""
    spmdtorch.sync(wait=wait)


def _get_graph_hash(tensors: Sequence[torch.Tensor]) -> bytes:
    """A hash of the pending graph computing ``tensors`` (16 bytes, as PyTorch/XLA's ``hash_t``).

    Equal graphs (same ops, shapes and sharding annotations) hash equal; the
    hash is over the graph's HLO text, without the module's name, and, as
    PyTorch/XLA's, over the auto-sharding mode and its mesh
    (``XLA_AUTO_SPMD_MESH`` as set now), which decide how the graph compiles.
    """
    text = debug.get_hlo_text(list(tensors))
    text = re.sub(r"^HloModule \S+", "HloModule", text, count=1)
    auto = runtime.auto_sharding()
    if auto is not None:
        text += f"\nauto-sharding mesh={auto.mesh_shape}"
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


# --- per-tensor ids -------------------------------------------------------------------------------------------


def _xla_get_tensor_id(tensor: torch.Tensor) -> int:
    """An id of the tensor's storage, stable for its life (PyTorch/XLA's ``XLATensor::GetUniqueId`` role).

    transformers (``id_tensor_storage``) and Hugging Face's shard splitter use
    it on xla tensors to find tied weights, on the detached tensors of a
    ``state_dict()``, which are new objects every call; safetensors and
    accelerate then check the same state dict by ``untyped_storage().data_ptr()``.
    So the id is that storage identity: one tensor (or a parameter tied into
    two modules, or its detached copies and views) always gets the same id, two
    tensors of distinct storages never share one, and both checks agree.
    """
    _xla_tensor(tensor, "_xla_get_tensor_id")
    return tensor.untyped_storage().data_ptr()


# --- debug summary --------------------------------------------------------------------------------------------


def _shape_string(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{_XLA_TYPES.get(dtype, str(dtype).removeprefix('torch.'))}[{','.join(str(int(d)) for d in shape)}]"


def _op_name(op: Any) -> str:
    """``aten.div.Tensor`` -> ``aten::div``, the form PyTorch/XLA's IR prints; other names as they are.

    A node's name is a torch ``OpOverload`` (its str is ``aten.div.Tensor``) or a string.
    """
    name = str(op)
    if name.startswith("aten."):
        return "aten::" + name.split(".")[1]
    return name


def _get_xla_tensor_debug_info(tensor: torch.Tensor) -> str:
    """PyTorch/XLA's per-tensor summary: id, device, shape, sharding, pending IR and device data.

    The fields and their names are PyTorch/XLA's (``TensorID``, ``Device:
    SPMD:0``, ``XLA Shape``, ``ShardingSpec``, ``IR``, ``XLAShardedData`` with
    ``Data Shape``, ``OpSharding`` and ``NumShards``, ``Tensor on host``). A
    tensor whose upload is still deferred (``t.to("xla")`` before its first
    use: ``spmdtorch.tensor.transfer``) shows ``IR: None``, ``XLAData: None``
    and ``Tensor on host: with size [..]``; a pending tensor the op computing
    it (``IR: [] <op>``) and no data; a computed one ``IR: [] xla::device_data``
    and its data's sharding. Asking about a tensor on the host uploads
    nothing; a view holds no host data of its own (its value is an op on its
    base's, as PyTorch/XLA's view IR), so asking about one uploads its base.
    """
    if not isinstance(tensor, spmdtorch.XlaTensor):
        return "Not a XLATensor\n"
    shape = _shape_string(tensor.dtype, tensor.shape)
    spec = sharding.get_sharding_spec(tensor, computed=True)
    lines = [
        "XLATensor {",
        f"TensorID: {_xla_get_tensor_id(tensor)}",
        f"Device: {_SPMD_DEVICE}",
        f"XLA Shape: {shape}",
        f"ShardingSpec: {spec or 'None'}",
    ]
    on_host = transfer.host_shape(tensor)
    if on_host is not None:
        # PyTorch/XLA prints the host tensor's sizes as an IntArrayRef ("[5, 5]").
        sizes = ", ".join(map(str, on_host))
        lines += ["IR: None", "XLAData: None", f"Tensor on host: with size [{sizes}]", "}"]
        return "\n".join(lines) + "\n"
    value = debug.read_value(tensor)
    if isinstance(value, debug.LazyRef):
        lines.append(f"IR: [] {_op_name(value.node.name)}, xla_shape={shape}")
        lines.append("XLAData: None")
    else:
        lines.append(f"IR: [] xla::device_data, xla_shape={shape}, device={_SPMD_DEVICE}")
        arr: jax.Array = value
        op_sharding = sharding.hlo_sharding_string(arr.sharding, arr.ndim)
        lines += [
            "XLAShardedData: ",
            f"  Data Device: {_SPMD_DEVICE}",
            f"  Data Shape: {_shape_string(tensor.dtype, arr.shape)}",
            f"  OpSharding: {op_sharding}",
            f"  NumShards: {len(arr.sharding.device_set)}",
        ]
    lines.append("Tensor on host: None")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _is_placecholder(tensor: torch.Tensor) -> bool:
    """Whether the tensor's data was given away (PyTorch/XLA's placeholder); spmdtorch never hands out one."""
    _xla_tensor(tensor, "_is_placecholder")
    return False


def _xla_get_auto_sharding() -> bool:
    """Whether auto-sharding is on (``xr.use_spmd(auto=True)``: spmdtorch's own rule, see the migration guide)."""
    return runtime.auto_sharding_enabled()


def _get_executed_fallback_ops() -> list[str]:
    """``torch_xla.debug.metrics.executed_fallback_ops()``."""
    from spmdtorch.compat import _metrics

    return _metrics.executed_fallback_ops()


def _xla_metrics_report() -> str:
    """``torch_xla.debug.metrics.metrics_report()``."""
    from spmdtorch.compat import _metrics

    return _metrics.metrics_report()


# --- building tensors from shards, the coordinator -------------------------------------------------------------


class CpuShardsError(ShardingError, CompatError):
    """``_global_tensor_from_cpu_shards`` got shards that do not make a tensor of the given shape and sharding.

    A ``RuntimeError`` (PyTorch/XLA's type for it) and spmdtorch's ``ShardingError`` (a ``ValueError``).
    """


def _tiles(mesh_shape: dict[str, int], spec: Sequence[Any]) -> tuple[int, ...]:
    """How many pieces each tensor dim is cut into by a resolved partition spec (names of mesh axes)."""
    out = []
    for entry in spec:
        axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        out.append(math.prod(int(mesh_shape[a]) for a in axes))
    return tuple(out)


def _global_tensor_from_cpu_shards(
    shards: Sequence[torch.Tensor], sharding_: Any, global_shape: Sequence[int] | None = None
) -> torch.Tensor:
    """An xla tensor of ``global_shape`` sharded as ``sharding_``, built from this process's CPU shards.

    As in PyTorch/XLA, every shard has the padded shape XLA gives each device
    (``ceil(global_dim / pieces)`` along each dim): data past the end of the
    global tensor is padding and dropped. A fully replicated sharding takes
    shards of any rank, each the whole tensor.

    Args:
        shards: one CPU tensor per local device, in ``XLAShardedTensor.local_shards`` order
            (``xr.local_runtime_devices()`` order on a mesh of ``range(n)``), all of one shape.
        sharding_: an ``OpSharding`` from ``Mesh.get_op_sharding(partition_spec)``.
        global_shape: the whole tensor's shape; None: a shard's shape times the pieces of each dim.

    Raises:
        TypeError: ``sharding_`` is not a mesh's ``OpSharding`` or a shard is not a CPU tensor.
        CpuShardsError: the number or shapes of the shards do not fit the sharding and ``global_shape``.
    """
    fn = "torch_xla._XLAC._global_tensor_from_cpu_shards"
    mesh = getattr(sharding_, "mesh", None)
    named = getattr(sharding_, "sharding", None)
    if mesh is None or not isinstance(named, jax.sharding.NamedSharding):
        raise TypeError(
            f"{fn}: sharding must be the OpSharding of mesh.get_op_sharding(partition_spec), "
            f"got {type(sharding_).__name__}"
        )
    shards = list(shards)
    if not shards or not all(isinstance(s, torch.Tensor) and s.device.type == "cpu" for s in shards):
        raise TypeError(f"{fn}: shards must be a non-empty list of CPU tensors (one per local device)")
    n_local = len(named.addressable_devices)
    if len(shards) != n_local:
        raise CpuShardsError(
            f"{fn}: got {len(shards)} shards, expected {n_local} (one per local device of the mesh); "
            "pass one CPU tensor per device, as XLAShardedTensor.local_shards lists them"
        )
    shard_shape = tuple(shards[0].shape)
    for i, s in enumerate(shards):
        if tuple(s.shape) != shard_shape:
            raise CpuShardsError(
                f"{fn}: shards[{i}] has shape {tuple(s.shape)}, expected {shard_shape} (shards[0]'s): every "
                "device holds a shard of the same (padded) shape; pad the last shards"
            )
    spec = tuple(named.spec)
    replicated = all(e is None for e in spec)
    if replicated:  # a replicated OpSharding has no rank: each shard is the whole tensor
        spec = (None,) * len(shard_shape)
    elif len(spec) != len(shard_shape):
        raise CpuShardsError(
            f"{fn}: the sharding's partition spec {tuple(sharding_.partition_spec)} has {len(spec)} dims but the "
            f"shards have {len(shard_shape)} (shape {shard_shape}); give shards of the spec's rank"
        )
    tiles = _tiles(dict(named.mesh.shape), spec)
    padded = tuple(d * t for d, t in zip(shard_shape, tiles))
    shape = tuple(int(d) for d in global_shape) if global_shape is not None else padded
    fits = len(shape) == len(shard_shape) and all(-(-g // t) == d for g, t, d in zip(shape, tiles, shard_shape))
    if not fits:
        raise CpuShardsError(
            f"{fn}: global_shape {shape} does not fit shards of shape {shard_shape} cut {tiles} ways per dim "
            f"(each dim must have ceil(global / pieces) == shard size, so at most {padded}, less under one "
            "shard of padding); pass global_shape=None for the shards' full shape, or shards of the padded "
            "shape for this global_shape"
        )
    trimmed = shards
    if not replicated:
        # Each device's slice of the padded tensor, cut back to the global shape (padding is dropped).
        where = jax.sharding.NamedSharding(named.mesh, jax.sharding.PartitionSpec(*spec))
        indices = list(where.addressable_devices_indices_map(padded).values())
        trimmed = []
        for s, index in zip(shards, indices):
            assert index is not None  # every device of a NamedSharding holds a slice
            keep = tuple(
                slice(0, max(0, min(sl.indices(p)[1], g) - sl.indices(p)[0])) for sl, g, p in zip(index, shape, padded)
            )
            trimmed.append(s[keep])
    out = torch.empty(shape, dtype=shards[0].dtype, device="xla")
    sharding.mark_sharding(out, mesh, tuple(sharding_.partition_spec) if not replicated else spec)
    sharding.load_local_shards_(out, trimmed)
    return out


class OpShardingError(CompatError, ValueError):
    """``_XLAC.OpSharding(...)`` with a kind or layout spmdtorch does not build (a ``RuntimeError`` and ``ValueError``)."""


class OpSharding:
    """PyTorch/XLA's ``_XLAC.OpSharding(tile_assignment, group_assignment, replication_groups, sharding_type)``.

    The kinds its manual-sharding calls take: ``REPLICATED`` and ``MANUAL``
    (every list empty), and ``TILED`` with a ``tile_assignment`` (an n-d list
    of device ids, one dim per tensor dim). Partial replication
    (``group_assignment`` / ``replication_groups``) is refused: build it with
    ``xs.Mesh(...).get_op_sharding(partition_spec)``.

    Attributes:
        type: the ``ShardingType``.
        sharding: the ``jax.sharding.NamedSharding`` it stands for (None for MANUAL).
    """

    def __init__(
        self,
        tile_assignment: Sequence[Any],
        group_assignment: Sequence[Any],
        replication_groups: Sequence[Any],
        sharding_type: int,
    ) -> None:
        try:
            self.type = sharding.ShardingType(int(sharding_type))
        except (TypeError, ValueError):
            raise OpShardingError(
                f"OpSharding: sharding_type must be an xs.ShardingType, got {sharding_type!r}"
            ) from None
        self.sharding: jax.sharding.NamedSharding | None = None
        if list(group_assignment) or list(replication_groups):
            raise OpShardingError(
                "OpSharding: group_assignment / replication_groups (partial replication) are not built from lists "
                "in spmdtorch; use xs.Mesh(device_ids, mesh_shape, axis_names).get_op_sharding(partition_spec)"
            )
        tiles = np.asarray(tile_assignment, dtype=np.int64)
        if self.type in (sharding.ShardingType.REPLICATED, sharding.ShardingType.MANUAL):
            if tiles.size:
                raise OpShardingError(
                    f"OpSharding: a {self.type.name} sharding takes an empty tile_assignment, got {tile_assignment!r}"
                )
            if self.type == sharding.ShardingType.REPLICATED:
                self.sharding = lazy.replicated_sharding()
        elif self.type == sharding.ShardingType.TILED and tiles.size:
            names = tuple(f"tile{i}" for i in range(tiles.ndim))
            tile_mesh = _Mesh(tiles.reshape(-1), tiles.shape, names)
            self.sharding = tile_mesh.named_sharding(names)
        else:
            raise OpShardingError(
                f"OpSharding: a {self.type.name} sharding with tile_assignment {tile_assignment!r} is not built "
                "from lists in spmdtorch; use xs.Mesh(device_ids, mesh_shape, axis_names).get_op_sharding(spec)"
            )

    def __repr__(self) -> str:
        return f"OpSharding(type={self.type.name}, sharding={self.sharding})"


def _spmd_full_to_shard_shape(tensor: torch.Tensor) -> torch.Tensor:
    """This device's block of a sharded tensor, manually sharded (``spmdtorch.sharding.full_to_shard_shape``).

    Raises:
        spmdtorch.sharding.ManualShardingError: the tensor has no sharding (a
            ``RuntimeError``, as PyTorch/XLA's check).
    """
    return sharding.full_to_shard_shape(_xla_tensor(tensor, "_spmd_full_to_shard_shape"))


def _target_sharding(sharding_: Any, fn: str) -> jax.sharding.NamedSharding:
    target = getattr(sharding_, "sharding", None)
    if not isinstance(target, jax.sharding.NamedSharding):
        raise OpShardingError(
            f"torch_xla._XLAC.{fn}: sharding must be a non-manual OpSharding (mesh.get_op_sharding(partition_spec) "
            f"or _XLAC.OpSharding([], [], [], xs.ShardingType.REPLICATED)), got {sharding_!r}"
        )
    return target


def _spmd_shard_to_full_shape(
    tensor: torch.Tensor, sharding_: Any, full_shape: Sequence[int], dtype: torch.dtype
) -> torch.Tensor:
    """The global tensor of ``full_shape`` whose blocks are each device's manual ``tensor``.

    ``spmdtorch.sharding.shard_to_full_shape`` with the ``OpSharding``'s sharding.

    Raises:
        spmdtorch.sharding.ManualShardingError: the tensor is not manually
            sharded, or its shape is not the sharding's block of ``full_shape``.
        OpShardingError: ``sharding_`` is not a non-manual ``OpSharding``, or
            ``dtype`` is not the tensor's.
    """
    fn = "_spmd_shard_to_full_shape"
    t = _xla_tensor(tensor, fn)
    target = _target_sharding(sharding_, fn)
    if dtype != t.dtype:
        raise OpShardingError(
            f"torch_xla._XLAC.{fn}: dtype {dtype} is not the tensor's {t.dtype}; convert the tensor first "
            "(a manual value keeps its dtype)"
        )
    return sharding.shard_to_full_shape(t, target, full_shape)


def _mark_manual_sharding(tensor: torch.Tensor, sharding_: Any) -> None:
    """Mark a pending tensor manually sharded in place (``spmdtorch.sharding.mark_manual_sharding``).

    Raises:
        OpShardingError: ``sharding_`` is not a MANUAL ``OpSharding``.
        spmdtorch.sharding.ManualShardingError: the tensor holds data (a ``RuntimeError``).
    """
    if not (isinstance(sharding_, OpSharding) and sharding_.type == sharding.ShardingType.MANUAL):
        raise OpShardingError(
            "torch_xla._XLAC._mark_manual_sharding: sharding must be "
            f"_XLAC.OpSharding([], [], [], xs.ShardingType.MANUAL), got {sharding_!r}"
        )
    sharding.mark_manual_sharding(_xla_tensor(tensor, "_mark_manual_sharding"))


def _ensure_xla_coordinator_initialized(
    global_rank: int, world_size: int, master_addr: str, master_port: str = "8547"
) -> None:
    """Joins this process to the job's coordinator unless it already has (``spmdtorch.runtime.initialize_distributed``).

    A one-process job needs no coordinator. A process already initialized
    (``import spmdtorch`` does it under a launcher) keeps its settings.
    """
    if int(world_size) <= 1 or runtime.is_distributed_initialized():
        return
    runtime.initialize_distributed(f"{master_addr}:{master_port}", int(world_size), int(global_rank))


# --- preemption: PyTorch/XLA's PreemptionSyncManager ------------------------------------------------------------


class _Preemption:
    """The SIGTERM watch ``_activate_preemption_sync_manager`` starts (one per process)."""

    active = False
    seen = False
    previous: Any = None


def _on_sigterm(signum: int, frame: types.FrameType | None) -> None:
    _Preemption.seen = True  # a flag only: the training loop acts at its next sync point


def _activate_preemption_sync_manager() -> None:
    """Start watching for a preemption notice (SIGTERM), as PyTorch/XLA's ``PreemptionSyncManager``.

    In a multi-process job JAX's preemption service (started by
    ``jax.distributed.initialize``) watches, and every process agrees on the
    sync step. In one process a SIGTERM handler is installed (main thread
    only); :func:`_deactivate_preemption_sync_manager` restores the previous one.

    Raises:
        RuntimeError: called outside the main thread of a one-process job (no
            signal handler can be installed there).
    """
    if _Preemption.active:
        return
    if runtime.process_count() == 1:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "torch_xla._XLAC._activate_preemption_sync_manager must be called from the main thread "
                "(it installs a SIGTERM handler); call it before starting worker threads"
            )
        _Preemption.previous = signal.signal(signal.SIGTERM, _on_sigterm)
    _Preemption.active, _Preemption.seen = True, False


def _deactivate_preemption_sync_manager() -> None:
    """Stop watching; the SIGTERM handler that was there before comes back."""
    if not _Preemption.active:
        return
    if runtime.process_count() == 1 and _Preemption.previous is not None:
        signal.signal(signal.SIGTERM, _Preemption.previous)
    _Preemption.active, _Preemption.seen, _Preemption.previous = False, False, None


def _sync_point_reached(step: int) -> bool:
    """Whether ``step`` is the step to save and stop at: True from the first step after a preemption notice.

    Raises:
        RuntimeError: the manager was not activated (PyTorch/XLA's check).
    """
    if not _Preemption.active:
        raise RuntimeError(
            "torch_xla._XLAC._sync_point_reached needs torch_xla._XLAC._activate_preemption_sync_manager() first"
        )
    if runtime.process_count() > 1:
        from jax.experimental import multihost_utils

        return bool(multihost_utils.reached_preemption_sync_point(int(step)))
    return _Preemption.seen
