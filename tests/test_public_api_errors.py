"""Every public function refuses bad input with a named spmdtorch error naming the parameter.

The walk covers ``spmdtorch.__all__`` and the ``__all__`` of each public
subpackage. For every callable it starts from one valid call (``VALID``),
replaces one parameter at a time with a bad value and expects an exception
whose class is defined by spmdtorch (never a bare ``TypeError``/``KeyError``/
``AttributeError`` from an internal line, nor a raw jax error) and whose
message names the parameter. The bad values come from the signature (a value
of an unrelated type for every parameter, ``None`` where None is not allowed,
a str for an int, an int for a sequence...) plus explicit cases (``EXTRA``)
for wrong *values* of the right type.

Names not walked are listed in ``NOT_WALKED`` with the reason (result value
objects, exception classes, constants).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import re
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel

import spmdtorch
from spmdtorch import checkpoint, data, debug, dtensor, fsdp, models, plan, runtime, sharding
from spmdtorch.launch import free_port
from spmdtorch.mesh import DeviceRecord, Mesh

SUBPACKAGES = (
    "mesh",
    "sharding",
    "fsdp",
    "plan",
    "checkpoint",
    "data",
    "runtime",
    "debug",
    "launch",
    "partition",
    "dtensor",
)


class _Junk:
    """A value of a type no spmdtorch parameter accepts."""

    def __repr__(self) -> str:
        return "<junk>"


JUNK = _Junk()

#: Public names that are not called: why each one is left out.
NOT_WALKED: dict[str, str] = {
    # Result / record value objects: built by the library, read by the user.
    "DeviceRecord": "NamedTuple record (typed value object; hybrid_device_ids validates records)",
    "ParsedHloSharding": "NamedTuple result of parse_hlo_sharding_string",
    "XLAShard": "result of local_shards",
    "ShardingType": "enum",
    "CompiledMemory": "result of compiled_memory",
    "MemoryPlan": "result of memory_plan",
    "ShardingPlan": "result of plan_sharding",
    "TensorMemory": "part of MemoryPlan",
    "DistributedConfig": "result of resolve_distributed_config",
    "LaunchResult": "result of launch",
    "RankResult": "part of LaunchResult",
    "CPU_REMAT_XLA_FLAG": "a str constant",
    "PEER_LOST_EXIT_STATUS": "an int constant",
    "AUTO_SHARDING_MIN_ELEMENTS_PER_DEVICE": "an int constant",
    "AutoSharding": "result of runtime.auto_sharding",
    "MemoryInfo": "result of runtime.memory_info",
    "PretrainedLoad": "NamedTuple result of checkpoint.load_pretrained",
    "HfLayout": "result of checkpoint.save_pretrained (read_layout builds it from a directory)",
    "DeviceActivity": "result of debug.device_activity",
    "LoweredGraph": "result of debug.lower_graph",
    "GraphParameter": "part of LoweredGraph",
    # Built by the dispatcher from a storage, never by user code.
    "XlaTensor": "internal constructor (user code gets XlaTensors from torch with device='xla')",
    "PerDeviceLoader": "built by ParallelLoader.per_device_loader",
    "XlaDeviceMesh": "built by spmdtorch.dtensor.init_device_mesh (walked) and by slicing",
    "XlaDTensor": "built by distribute_tensor / from_local (walked) and by ops",
    "XlaFSDPModule": "the class fully_shard (walked) gives a module",
    # Torch's auto-wrap policy contract: torch's FSDP (and recursive_wrap) call
    # these with (module, recurse, nonwrapped_numel); users pass them, not call them.
    "lambda_auto_wrap_policy": "auto-wrap policy called by recursive_wrap/FSDPv2",
    "size_based_auto_wrap_policy": "auto-wrap policy called by recursive_wrap/FSDPv2",
    "transformer_auto_wrap_policy": "auto-wrap policy called by recursive_wrap/FSDPv2",
    # Joins a multi-process job (process-global, irreversible); its arguments
    # are resolved (and validated) by resolve_distributed_config, walked below.
    "initialize_distributed": "irreversible; validated through resolve_distributed_config",
}


def _public_callables() -> dict[str, Callable[..., Any]]:
    """``name -> object`` for every public callable (each object once, first name wins)."""
    found: dict[str, Callable[..., Any]] = {}
    seen: set[int] = set()
    for modname in ("spmdtorch", *(f"spmdtorch.{m}" for m in SUBPACKAGES)):
        mod = importlib.import_module(modname)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or (isinstance(obj, type) and issubclass(obj, BaseException)):
                continue
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            found[name] = obj
    return found


# ----------------------------------------------------------------- valid calls


def _mesh() -> Mesh:
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def _xt(*shape: int) -> torch.Tensor:
    return torch.arange(float(np.prod(shape) if shape else 1)).reshape(shape).to("xla")


def _ckpt(tmp: str) -> str:
    path = os.path.join(tmp, "ckpt")
    if not os.path.exists(path):
        checkpoint.save(path, {"w": torch.zeros(4, 2), "step": 1})
    return path


def _compiled() -> Any:
    fn = spmdtorch.compile(lambda x: x * 2)
    fn(_xt(2))
    return fn


class Case(NamedTuple):
    """One valid call: keyword arguments built fresh (tensors are mutated by some calls)."""

    kwargs: Callable[[str], dict[str, Any]]
    #: Positional-only / ``*args`` parameters given positionally, in order.
    args: Callable[[str], tuple[Any, ...]] = lambda tmp: ()
    #: Called inside a manual region opened on an (8, 2) tensor; ``REGION_T``
    #: in ``kwargs`` stands for the region's local block.
    region: bool = False
    #: Run first (inside the clean-up): puts the process in the state the call
    #: needs (a profiler server, a trace); returns keyword arguments that depend
    #: on it (a server's address), overridden by the bad value.
    setup: Callable[[str], dict[str, Any]] = lambda tmp: {}


REGION_T = object()


def _linear() -> torch.nn.Module:
    return torch.nn.Linear(4, 8)


def _dmesh() -> Any:
    return dtensor.init_device_mesh("xla", (8,), mesh_dim_names=("dp",))


def _hf_dir(tmp: str) -> str:
    path = os.path.join(tmp, "hf")
    if not os.path.exists(path):
        checkpoint.save_pretrained(_linear(), path)
    return path


def _server(tmp: str) -> dict[str, Any]:
    port = free_port()
    debug.start_server(port)
    return {"service_addr": f"localhost:{port}"}


def _tracing(tmp: str) -> dict[str, Any]:
    debug.start_trace(os.path.join(tmp, "profile"))
    return {}


def _captured(tmp: str) -> dict[str, Any]:
    """A trace of one small program, captured into ``tmp/captured`` (once)."""
    path = os.path.join(tmp, "captured")
    if not os.path.exists(path):
        with debug.profile(path):
            (_xt(2) * 2).cpu()
    return {"trace": path}


#: A valid call of every walked callable (tmp: a fresh temporary directory).
VALID: dict[str, Case] = {
    "CompiledFunction": Case(lambda tmp: {"fn": lambda x: x}),
    "assume_pure": Case(lambda tmp: {"fn": lambda x: x}),
    "call_jax": Case(lambda tmp: {"jax_func": lambda x: x * 2, "args": (_xt(3),), "kwargs": None, "name": "f"}),
    "compile": Case(lambda tmp: {"fn": lambda x: x}),
    "device": Case(lambda tmp: {"index": 0}),
    "device_count": Case(lambda tmp: {}),
    "devices": Case(lambda tmp: {}),
    "manual_seed": Case(lambda tmp: {"seed": 0}),
    "mark_step": Case(lambda tmp: {"wait": False}),
    "materialize": Case(
        lambda tmp: {
            "model": torch.nn.Linear(4, 8, device="meta"),
            "mesh": Mesh(np.arange(8), (8,), ("fsdp",)),
            "rules_or_fsdp": "fsdp",
            "init_fn": None,
            "sync": True,
        }
    ),
    "step": Case(lambda tmp: {"pause_gc": True}),
    "scan": Case(lambda tmp: {"fn": lambda c, x: (c + x, c * x), "init": _xt(3), "xs": _xt(4, 3)}),
    "scan_layers": Case(
        lambda tmp: {
            "layers": torch.nn.ModuleList(torch.nn.Linear(3, 3) for _ in range(2)).to("xla"),
            "input_data": _xt(2, 3),
        }
    ),
    "sync": Case(lambda tmp: {"wait": False}),
    "wait_device_ops": Case(lambda tmp: {}),
    # mesh
    "HybridMesh": Case(lambda tmp: {"ici_mesh_shape": (4, 2), "dcn_mesh_shape": (1, 1), "axis_names": ("a", "b")}),
    "Mesh": Case(lambda tmp: {"device_ids": np.arange(8), "mesh_shape": (4, 2), "axis_names": ("a", "b")}),
    "device_records": Case(lambda tmp: {"devices": None}),
    "get_1d_mesh": Case(lambda tmp: {"axis_name": "x"}),
    "get_global_mesh": Case(lambda tmp: {}),
    "global_devices": Case(lambda tmp: {}),
    "hybrid_device_ids": Case(
        lambda tmp: {
            "records": [DeviceRecord(i, i // 4) for i in range(8)],
            "ici_mesh_shape": (1, 4),
            "dcn_mesh_shape": (2, 1),
        }
    ),
    "set_global_mesh": Case(lambda tmp: {"mesh": None}),
    # sharding
    "ShardingSpec": Case(lambda tmp: {"mesh": _mesh(), "partition_spec": ("data", None), "minibatch": False}),
    "clear_sharding": Case(lambda tmp: {"t": _xt(8, 2)}),
    "mark_sharding": Case(lambda tmp: {"t": _xt(8, 2), "mesh": _mesh(), "partition_spec": ("data", None)}),
    "mark_sharding_with_gradients": Case(
        lambda tmp: {"t": _xt(8, 2), "mesh": _mesh(), "partition_spec": ("data", None)}
    ),
    "tensor_sharding": Case(lambda tmp: {"t": _xt(8, 2)}),
    "get_sharding_spec": Case(lambda tmp: {"t": _xt(8, 2)}),
    "hlo_sharding_string": Case(
        lambda tmp: {"sharding": _mesh().named_sharding(("data", None)), "ndim": 2, "device_order": None}
    ),
    "logical_device_order": Case(lambda tmp: {"devices": None}),
    "parse_hlo_sharding_string": Case(lambda tmp: {"s": "{devices=[8,1]0,1,2,3,4,5,6,7}"}),
    "sharding_type": Case(lambda tmp: {"t": _xt(8, 2)}),
    "sharding_type_of": Case(lambda tmp: {"sharding": _mesh().named_sharding(("data", None)), "ndim": 2}),
    "visualize_array_sharding": Case(
        lambda tmp: {"shape": (8, 2), "sharding": _mesh().named_sharding(("data", None)), "print_": False}
    ),
    "visualize_sharding": Case(lambda tmp: {"sharding": "{devices=[8,1]0,1,2,3,4,5,6,7}", "print_": False}),
    "visualize_tensor_sharding": Case(lambda tmp: {"t": _xt(8, 2)}),
    "load_local_shards_": Case(lambda tmp: {"t": _xt(8, 2), "shards": [torch.zeros(8, 2)] * 8}),
    "local_shards": Case(lambda tmp: {"t": _xt(8, 2)}),
    "shard_map": Case(
        lambda tmp: {"fn": lambda x: x, "mesh": _mesh(), "in_specs": (("data", None),), "out_specs": ("data", None)}
    ),
    "enable_manual_sharding": Case(lambda tmp: {"t": _xt(8, 2), "partition_spec": ("data", None), "mesh": _mesh()}),
    "disable_manual_sharding": Case(
        lambda tmp: {"t": REGION_T, "partition_spec": ("data", None), "full_shape": (8, 2), "mesh": _mesh()},
        region=True,
    ),
    "full_to_shard_shape": Case(lambda tmp: {"t": sharding.mark_sharding(_xt(8, 2), _mesh(), ("data", None))}),
    "shard_to_full_shape": Case(
        lambda tmp: {
            "t": sharding.full_to_shard_shape(sharding.mark_sharding(_xt(8, 2), _mesh(), ("data", None))),
            "sharding": sharding.ShardingSpec(_mesh(), ("data", None)),
            "full_shape": (8, 2),
        }
    ),
    "mark_manual_sharding": Case(lambda tmp: {"t": _xt(8, 2) + 1}),
    "all_gather": Case(lambda tmp: {"t": REGION_T, "axis": "data", "dim": 0}, region=True),
    "all_reduce": Case(lambda tmp: {"t": REGION_T, "axis": "data", "op": "sum"}, region=True),
    "axis_index": Case(lambda tmp: {"axis": "data"}, region=True),
    "ppermute": Case(lambda tmp: {"t": REGION_T, "axis": "data", "perm": [(0, 1), (1, 0)]}, region=True),
    "reduce_scatter": Case(lambda tmp: {"t": REGION_T, "axis": "model", "dim": 0}, region=True),
    # fsdp
    "FSDPv2": Case(lambda tmp: {"module": _linear().to("xla"), "mesh": Mesh(np.arange(8), (8,), ("fsdp",))}),
    # dtensor (torch's DeviceMesh/DTensor/FSDP2 API on an xla mesh)
    "init_device_mesh": Case(lambda tmp: {"device_type": "xla", "mesh_shape": (2, 4), "mesh_dim_names": ("dp", "tp")}),
    "distribute_tensor": Case(
        lambda tmp: {"tensor": torch.zeros(8, 4), "device_mesh": _dmesh(), "placements": [Shard(0)]}
    ),
    "from_local": Case(lambda tmp: {"local_tensor": _xt(8, 4), "device_mesh": _dmesh(), "placements": [Shard(0)]}),
    "distribute_module": Case(lambda tmp: {"module": _linear(), "device_mesh": _dmesh()}),
    "parallelize_module": Case(
        lambda tmp: {"module": _linear(), "device_mesh": _dmesh(), "parallelize_plan": ColwiseParallel()}
    ),
    "fully_shard": Case(lambda tmp: {"module": _linear(), "mesh": _dmesh()}),
    "parallelize_llama": Case(
        lambda tmp: {
            "model": models.LlamaForCausalLM(models.LlamaConfig(vocab_size=16, dim=16, n_heads=2, ffn_dim=16)),
            "mesh": dtensor.init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp")),
        }
    ),
    "get_model_state_dict": Case(lambda tmp: {"model": _linear()}),
    "get_optimizer_state_dict": Case(
        lambda tmp: {"model": (m := _linear()), "optimizers": torch.optim.SGD(m.parameters())}
    ),
    "set_model_state_dict": Case(lambda tmp: {"model": _linear(), "model_state_dict": _linear().state_dict()}),
    "set_optimizer_state_dict": Case(
        lambda tmp: {
            "model": (m := _linear()),
            "optimizers": torch.optim.SGD(m.parameters()),
            "optim_state_dict": {"state": {}, "param_groups": [{"lr": 1e-3, "params": ["weight", "bias"]}]},
        }
    ),
    "mesh_groups": Case(lambda tmp: {"device_mesh": _dmesh()}),
    "root_axes": Case(lambda tmp: {"device_mesh": _dmesh()}),
    "spmd_mesh": Case(lambda tmp: {"device_mesh": _dmesh()}),
    "partition_spec": Case(lambda tmp: {"mesh": _dmesh(), "placements": [Shard(0)], "ndim": 2}),
    "placements_of_spec": Case(lambda tmp: {"mesh": _dmesh(), "spec": ("dp", None)}),
    "accumulate_gradients": Case(
        lambda tmp: {
            "model": _linear().to("xla"),
            "loss_fn": lambda model, x: model(x).mean(),
            "micro_batches": [_xt(8, 4)],
            "mesh": Mesh(np.arange(8), (8,), ("fsdp",)),
        }
    ),
    "plain_state_dict": Case(lambda tmp: {"module": _linear()}),
    "load_plain_state_dict": Case(lambda tmp: {"module": _linear(), "state_dict": _linear().state_dict()}),
    "recursive_wrap": Case(
        lambda tmp: {
            "module": torch.nn.Sequential(_linear()),
            "auto_wrap_policy": lambda module, recurse, nonwrapped_numel: False,
            "wrapper_cls": lambda m: m,
        }
    ),
    "MixedPrecision": Case(lambda tmp: {"param_dtype": torch.bfloat16, "output_dtype": None}),
    "checkpoint_module": Case(lambda tmp: {"module": _linear()}),
    "cpu_keeps_barriers": Case(lambda tmp: {"xla_flags": ""}),
    "optimization_barrier": Case(lambda tmp: {}, lambda tmp: (_xt(2),)),
    # plan
    "compiled_memory": Case(lambda tmp: {"compiled": _compiled()}),
    "memory_plan": Case(lambda tmp: {"model_or_state": _linear(), "mesh": Mesh(np.arange(8), (8,), ("fsdp",))}),
    "plan_sharding": Case(lambda tmp: {"model": _linear(), "mesh": Mesh(np.arange(8), (8,), ("fsdp",))}),
    # checkpoint
    "CheckpointManager": Case(lambda tmp: {"directory": os.path.join(tmp, "mgr"), "async_save": False}),
    "export": Case(lambda tmp: {"path": _ckpt(tmp), "out": os.path.join(tmp, "out.safetensors")}),
    "import_state_dict": Case(lambda tmp: {"file_or_dict": _linear().state_dict(), "model": _linear()}),
    "init_optimizer_state": Case(lambda tmp: {"optimizer": torch.optim.SGD(_linear().parameters(), lr=0.1)}),
    "load": Case(lambda tmp: {"path": _ckpt(tmp), "state": {"w": torch.zeros(4, 2), "step": 0}}),
    "save": Case(lambda tmp: {"path": os.path.join(tmp, "new"), "state": {"w": torch.zeros(4, 2)}}),
    "XlaCheckpointManager": Case(lambda tmp: {"path": os.path.join(tmp, "xmgr"), "save_interval": 1}),
    "SPMDSavePlanner": Case(lambda tmp: {}),
    "SPMDLoadPlanner": Case(lambda tmp: {}),
    "prime_optimizer": Case(lambda tmp: {"optimizer": torch.optim.SGD(_linear().parameters(), lr=0.1)}),
    "load_pretrained": Case(lambda tmp: {"directory": _hf_dir(tmp), "model": _linear(), "mesh": None, "rules": None}),
    "save_pretrained": Case(lambda tmp: {"model": _linear(), "directory": os.path.join(tmp, "hf-out")}),
    # data
    "MpDeviceLoader": Case(lambda tmp: {"loader": [torch.zeros(8, 2)], "device": "xla"}),
    "ParallelLoader": Case(lambda tmp: {"loader": [torch.zeros(8, 2)], "devices": ["xla"]}),
    "send_cpu_data_to_device": Case(lambda tmp: {"data": torch.zeros(8, 2), "device": "xla"}),
    # runtime
    "addressable_runtime_device_count": Case(lambda tmp: {}),
    "device_type": Case(lambda tmp: {}),
    "global_runtime_device_count": Case(lambda tmp: {}),
    "initialize_cache": Case(lambda tmp: {"path": os.path.join(tmp, "cache"), "readonly": True}),
    "is_distributed_initialized": Case(lambda tmp: {}),
    "jax_devices": Case(lambda tmp: {}),
    "local_jax_devices": Case(lambda tmp: {}),
    "max_gather_bytes": Case(lambda tmp: {}),
    "process_count": Case(lambda tmp: {}),
    "process_index": Case(lambda tmp: {}),
    "resolve_distributed_config": Case(
        lambda tmp: {
            "coordinator_address": "127.0.0.1:1234",
            "num_processes": 2,
            "process_id": 0,
            "local_device_ids": None,
            "env": {},
        }
    ),
    "set_max_gather_bytes": Case(lambda tmp: {"limit": None}),
    "addressable_device_count": Case(lambda tmp: {}),
    "auto_initialize_distributed": Case(lambda tmp: {}),
    "global_device_count": Case(lambda tmp: {}),
    "global_ordinal": Case(lambda tmp: {}),
    "is_spmd": Case(lambda tmp: {}),
    "local_device_count": Case(lambda tmp: {}),
    "local_ordinal": Case(lambda tmp: {}),
    "local_process_count": Case(lambda tmp: {}),
    "world_size": Case(lambda tmp: {}),
    "memory_info": Case(lambda tmp: {"index": 0}),
    "rendezvous": Case(lambda tmp: {"tag": "walk", "payload": b"x"}),
    "use_spmd": Case(lambda tmp: {"auto": False}),
    "set_auto_sharding": Case(lambda tmp: {"enabled": False}),
    "auto_sharding": Case(lambda tmp: {}),
    "auto_sharding_enabled": Case(lambda tmp: {}),
    "auto_partition_spec": Case(lambda tmp: {"shape": (64, 128), "axes": {"x": 8}}),
    "add_step_closure": Case(lambda tmp: {"closure": lambda: None, "args": (), "run_async": False}),
    # debug
    "metrics_report": Case(lambda tmp: {}),
    "counter_names": Case(lambda tmp: {}),
    "counter_value": Case(lambda tmp: {"name": "UncachedCompile"}),
    "metric_names": Case(lambda tmp: {}),
    "metric_data": Case(lambda tmp: {"name": "ExecuteTime"}),
    "cache_sizes": Case(lambda tmp: {}),
    "cache_stats": Case(lambda tmp: {}),
    "clear_caches": Case(lambda tmp: {}),
    "clear_metrics": Case(lambda tmp: {}),
    "get_hlo_text": Case(lambda tmp: {"tensors": [_xt(2) * 2]}),
    "get_stablehlo": Case(lambda tmp: {"tensors": [_xt(2) * 2]}),
    "last_executable": Case(lambda tmp: {}),
    "last_executable_outputs": Case(lambda tmp: {}),
    "lower_graph": Case(lambda tmp: {"tensors": [_xt(2) * 2], "name": "walk"}),
    "log_recompiles": Case(lambda tmp: {"enabled": False}),
    "clear_counters": Case(lambda tmp: {}),
    "clear_timers": Case(lambda tmp: {}),
    "get_stablehlo_bytecode": Case(lambda tmp: {"tensors": [_xt(2) * 2]}),
    "metric_samples": Case(lambda tmp: {"name": "ExecuteTime"}),
    "short_metrics_report": Case(lambda tmp: {"counter_names": None, "metric_names": None}),
    # debug.profiler (the profiler server / trace a call starts is stopped by _cleanup)
    "profile": Case(lambda tmp: {"logdir": os.path.join(tmp, "profile")}),  # the block is not entered
    "start_trace": Case(lambda tmp: {"log_dir": os.path.join(tmp, "profile")}),
    "stop_trace": Case(lambda tmp: {}, setup=_tracing),
    "start_server": Case(lambda tmp: {"port": free_port()}),
    "stop_server": Case(lambda tmp: {}, setup=lambda tmp: _server(tmp) and {}),
    "trace": Case(lambda tmp: {"logdir": os.path.join(tmp, "trace"), "duration_ms": 10}, setup=_server),
    "trace_detached": Case(lambda tmp: {"logdir": os.path.join(tmp, "trace"), "duration_ms": 10}, setup=_server),
    "trace_me": Case(lambda tmp: {"name": "walk"}),
    "device_activity": Case(lambda tmp: {}, setup=_captured),
    "Trace": Case(lambda tmp: {"name": "walk"}),
    "StepTrace": Case(lambda tmp: {"name": "walk"}),
    # launch
    "child_env": Case(
        lambda tmp: {
            "rank": 0,
            "nprocs": 2,
            "devices_per_proc": 1,
            "coordinator": "127.0.0.1:1234",
            "master_port": 1235,
            "base": {},
        }
    ),
    "free_port": Case(lambda tmp: {"host": "127.0.0.1"}),
    "describe_exit": Case(lambda tmp: {"returncode": 75}),
    "launch": Case(lambda tmp: {"command": ["-c", "pass"], "nprocs": 1, "timeout_s": 60.0}),
}

#: Parameters that really accept any value (the reason each), not walked.
ANY_VALUE: dict[tuple[str, str], str] = {
    ("compile", "fn"): "compile(None) is the decorator form; other values are checked",
    ("call_jax", "override_hash"): "any hashable value names the call (PyTorch/XLA's contract)",
    ("CompiledFunction", "fn"): "checked; see compile",
    ("send_cpu_data_to_device", "data"): "a pytree: leaves that are not tensors pass through unchanged",
    ("save", "state"): "a pytree; unsupported leaves are refused by key path (tested in tests/checkpoint)",
    ("load", "state"): "a pytree target; see save",
    ("shard_map", "fn"): "called lazily with the placeholders",
    ("memory_plan", "model_or_state"): "a module or a state dict",
}

#: Parameters whose name is a poor word for a message: what the message says instead.
PARAM_WORDS: dict[tuple[str, str], str] = {
    ("parse_hlo_sharding_string", "s"): "sharding string",
}

#: Explicit bad values of the right type: name -> [(param, value), ...].
EXTRA: dict[str, list[tuple[str, Any]]] = {
    "device": [("index", -1), ("index", 8)],
    "manual_seed": [("seed", 1.5)],
    "Mesh": [
        ("device_ids", [0, 0, 1, 2, 3, 4, 5, 6]),
        ("device_ids", np.arange(16)),
        ("mesh_shape", (3, 3)),
        ("mesh_shape", (0, 8)),
        ("axis_names", ("a", "a")),
        ("axis_names", ("a",)),
    ],
    "HybridMesh": [("ici_mesh_shape", (4, 4)), ("dcn_mesh_shape", (2, 1)), ("dcn_mesh_shape", (1,))],
    "hybrid_device_ids": [("records", [JUNK] * 8), ("ici_mesh_shape", (3, 4)), ("dcn_mesh_shape", (1, 2, 1))],
    "get_1d_mesh": [("axis_name", "")],
    "ShardingSpec": [("partition_spec", ("nope", None)), ("partition_spec", ("data", "data"))],
    "mark_sharding": [
        ("partition_spec", ("nope", None)),
        ("partition_spec", ("data",)),
        ("t", torch.zeros(8, 2)),
    ],
    "mark_sharding_with_gradients": [("partition_spec", ("nope", None)), ("t", torch.zeros(8, 2))],
    "hlo_sharding_string": [("ndim", -1)],
    "parse_hlo_sharding_string": [("s", "{devices=[8,1]0,1}"), ("s", "garbage")],
    "sharding_type_of": [("ndim", -1)],
    "visualize_sharding": [("sharding", "garbage")],
    "visualize_array_sharding": [("shape", (8, -2))],
    "load_local_shards_": [("shards", [torch.zeros(3, 3)])],
    "shard_map": [("in_specs", (("nope", None),))],
    "enable_manual_sharding": [("partition_spec", ("nope", None))],
    "full_to_shard_shape": [("t", torch.zeros(8, 2))],
    "mark_manual_sharding": [("t", torch.zeros(8, 2))],
    "shard_to_full_shape": [("full_shape", (8, 4)), ("full_shape", (8, -2))],
    "FSDPv2": [("mesh", _mesh)],
    "init_device_mesh": [("mesh_shape", (3, 3)), ("mesh_dim_names", ("a", "a")), ("device_type", "cuda")],
    "fully_shard": [("reshard_after_forward", 3)],
    "from_local": [("shape", (4, 4))],
    "accumulate_gradients": [("micro_batches", []), ("micro_batches", [torch.zeros(8, 4)]), ("micro_batches", [3])],
    "MixedPrecision": [("param_dtype", torch.int64)],
    "memory_plan": [("budget_bytes", -1)],
    "plan_sharding": [("strategy", "nope"), ("ep_axis", "")],
    "auto_partition_spec": [("shape", (4, -1)), ("axes", {"x": 0}), ("axes", {3: 8})],
    "CheckpointManager": [("save_interval_steps", 0), ("max_to_keep", 0)],
    "export": [("format", "nope"), ("max_host_bytes", 0)],
    "load": [("path", "/nonexistent/ckpt")],
    "XlaCheckpointManager": [("save_interval", 0), ("max_to_keep", -1), ("max_pending_async", 0), ("path", "")],
    "load_pretrained": [("directory", "/nonexistent/hf"), ("rules", "nope"), ("rules", "fsdp")],
    "save_pretrained": [("max_shard_size", "5MiB"), ("max_shard_size", 0), ("max_shard_size", True)],
    "memory_info": [("index", -1), ("index", 8)],
    "rendezvous": [("tag", "")],
    "short_metrics_report": [("counter_names", "CachedCompile"), ("metric_names", [3])],
    "start_trace": [("log_dir", ""), ("host_tracer_level", 4), ("python_tracer_level", -1)],
    "profile": [("logdir", ""), ("python_tracer_level", 2)],
    "start_server": [("port", 0), ("port", 65536)],
    "trace": [
        ("service_addr", ""),
        ("service_addr", "localhost"),
        ("duration_ms", 0),
        ("num_tracing_attempts", 0),
        ("host_tracer_level", 4),
        ("delay_ms", -1),
    ],
    "trace_detached": [("service_addr", "localhost"), ("duration_ms", 0), ("logdir", "")],
    "ParallelLoader": [
        ("batches_per_execution", 0),
        ("loader_prefetch_size", 0),
        ("device_prefetch_size", 0),
        ("host_to_device_transfer_threads", 0),
    ],
    "set_max_gather_bytes": [("limit", -1)],
    "child_env": [("rank", -1), ("nprocs", 0), ("devices_per_proc", 0), ("rank", 2)],
    "launch": [("nprocs", 0), ("devices_per_proc", 0), ("grace_period_s", -1.0), ("command", [])],
    "resolve_distributed_config": [("num_processes", 0), ("process_id", 2), ("process_id", -1)],
}


def _lazy(value: Any) -> Any:
    # EXTRA values that must be built per call (meshes, tensors) are given as zero-arg functions.
    return value() if callable(value) and value is _mesh else value


def _generic_bad(param: inspect.Parameter) -> list[Any]:
    """Bad values read off a parameter's annotation (a string: the modules use postponed annotations)."""
    ann = param.annotation if isinstance(param.annotation, str) else ""
    optional = "None" in ann or param.default is None
    bad: list[Any] = [JUNK]
    if not optional and param.annotation is not inspect.Parameter.empty and "Any" not in ann:
        bad.append(None)
    base = ann.replace(" | None", "")
    if base == "int":
        bad += ["3", 2.5, True]
    elif base == "float":
        bad += ["1.0"]
    elif base == "bool":
        bad += ["no", 2]
    elif base == "str":
        bad += [3]
    elif base.startswith("Sequence["):
        bad += [5]
    return bad


def _cases() -> list[Any]:
    public = _public_callables()
    out = []
    for name, obj in sorted(public.items()):
        if name in NOT_WALKED:
            continue
        sig = inspect.signature(obj)
        for p in sig.parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.name.startswith("_") or (name, p.name) in ANY_VALUE:
                continue
            for i, bad in enumerate(_generic_bad(p)):
                out.append(pytest.param(name, p.name, bad, id=f"{name}-{p.name}-{i}"))
        for i, (pname, bad) in enumerate(EXTRA.get(name, [])):
            out.append(pytest.param(name, pname, bad, id=f"{name}-{pname}-x{i}"))
    return out


def test_every_public_callable_is_walked():
    """A new public callable needs a VALID call (or a NOT_WALKED reason)."""
    public = _public_callables()
    missing = sorted(n for n in public if n not in NOT_WALKED and n not in VALID)
    assert not missing, f"add a valid call to VALID (or a reason to NOT_WALKED) for {missing}"
    stale = sorted(n for n in [*VALID, *NOT_WALKED] if n not in public)
    assert not stale, f"VALID/NOT_WALKED name no public callable: {stale}"


def _call(name: str, tmp: str, override: dict[str, Any]) -> None:
    """Runs ``VALID[name]`` with ``override`` applied (inside a region when the case needs one)."""
    obj = _public_callables()[name]
    case = VALID[name]
    args = case.args(tmp)
    with _cleanup():
        kwargs = {**case.kwargs(tmp), **case.setup(tmp), **override}
        if case.region:
            local = sharding.enable_manual_sharding(_xt(8, 2), ("data", None), mesh=_mesh())
            kwargs = {k: local if v is REGION_T else v for k, v in kwargs.items()}
        result = obj(*args, **kwargs)
        if isinstance(result, threading.Thread):  # trace_detached: its capture ends before the clean-up
            result.join(60)


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_call_works(name, tmp_path):
    """The base calls are valid (so a bad-value case fails because of its bad value only)."""
    _call(name, str(tmp_path), {})


def _is_spmdtorch_error(e: BaseException) -> bool:
    return any(c.__module__.split(".")[0] == "spmdtorch" for c in type(e).__mro__ if issubclass(c, BaseException))


@contextlib.contextmanager
def _cleanup():
    # Some valid calls have process-wide effects: undo them.
    # The override itself (None: the environment decides), not the value it yields.
    saved_limit = runtime._limits._MAX_GATHER[0]
    try:
        yield
    finally:
        from spmdtorch.mesh import set_global_mesh

        set_global_mesh(None)
        runtime.set_max_gather_bytes(saved_limit)
        debug.log_recompiles(False)
        if debug.profiler.is_tracing():
            debug.stop_trace()
        if debug.profiler._CAPTURE.server is not None:
            debug.stop_server()
        for region in list(getattr(sharding._manual, "_ACTIVE", [])):
            sharding._manual._ACTIVE.remove(region)


@pytest.mark.parametrize(("name", "param", "bad"), _cases())
def test_bad_argument_raises_named_error(name, param, bad, tmp_path):
    _check_bad_argument(name, param, bad, str(tmp_path))


def _check_bad_argument(name: str, param: str, bad: Any, tmp: str) -> None:
    try:
        _call(name, tmp, {param: _lazy(bad)})
    except Exception as e:  # noqa: BLE001 (the point: inspect whatever was raised)
        assert _is_spmdtorch_error(e), (
            f"{name}({param}={bad!r}) raised {type(e).__module__}.{type(e).__qualname__}: {e}; "
            "expected a spmdtorch error class"
        )
        word = PARAM_WORDS.get((name, param), param)
        assert re.search(rf"\b{re.escape(word)}\b", str(e)), (
            f"{name}({param}={bad!r}): the message does not name {param!r}: {e}"
        )
    else:
        pytest.fail(f"{name}({param}={bad!r}) was accepted")


def test_argument_errors_share_one_base():
    """``except spmdtorch.ArgumentError`` catches a bad argument in any package; TypeErrors stay TypeErrors."""
    from spmdtorch.checkpoint import CheckpointArgumentTypeError
    from spmdtorch.data import LoaderArgumentTypeError
    from spmdtorch.mesh import MeshError, MeshTypeError, set_global_mesh

    for cls in (MeshTypeError, CheckpointArgumentTypeError, LoaderArgumentTypeError):
        assert issubclass(cls, spmdtorch.ArgumentTypeError)
        assert issubclass(cls, TypeError) and issubclass(cls, spmdtorch.ArgumentError)
    with pytest.raises(MeshError, match="mesh"):
        set_global_mesh("data")
    with pytest.raises(spmdtorch.ArgumentError, match="wait"):
        spmdtorch.sync(wait="yes")
    with pytest.raises(checkpoint.CheckpointArgumentError, match="format"):
        checkpoint.export("/nonexistent", "/nonexistent.out", format="npz")


# Keep the names used only through strings referenced (ruff F401).
_ = (data, fsdp, plan)
