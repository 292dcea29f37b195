"""Per-device memory plans: what each device will hold, before anything is allocated.

:func:`memory_plan` takes a model (on ``meta``, CPU or xla) or a state dict and
the shardings it will have (a rules dict as for ``mark_sharding(module, mesh,
rules)``, ``"fsdp"``, or the annotations the tensors already carry) and
returns, per tensor, its partition spec, its shard shape and its bytes on each
device, plus per-device totals for parameters, gradients, optimizer state and
buffers. Given a compiled step (``spmdtorch.compile``) it adds XLA's own memory
analysis of that program: its temporaries (activations and workspace) and its
argument/output bytes per device. With ``budget_bytes`` it raises
:class:`MemoryBudgetError`, naming the largest tensors, when the step will not
fit.

Shard shapes are those of the device storage: a dim that its mesh axes do not
divide is padded up to the next multiple (``spmdtorch.lazy.padding``), so each
device holds ``ceil(n / k)`` of it.

Example:
    >>> import numpy as np, torch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.plan import memory_plan
    >>> with torch.device("meta"):
    ...     model = torch.nn.Linear(1024, 4096)
    >>> mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    >>> plan = memory_plan(model, mesh, rules="fsdp", optimizer="adamw")
    >>> plan.tensors[0].shard_shape, plan.tensors[0].bytes_per_device
    ((512, 1024), 2097152)
    >>> plan.optimizer_bytes == 2 * plan.parameter_bytes + 2 * 4
    True
"""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Mapping
from typing import Any

import jax
import torch
from torch import nn

from spmdtorch import _checks, _dtypes
from spmdtorch.fsdp import FSDP_AXIS, param_spec
from spmdtorch.lazy import padding
from spmdtorch.sharding import ShardingError, match_rules, tensor_sharding
from spmdtorch.tensor import view_chain
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = [
    "CompiledMemory",
    "MemoryBudgetError",
    "MemoryPlan",
    "MemoryPlanError",
    "TensorMemory",
    "compiled_memory",
    "memory_plan",
]


class MemoryPlanError(ValueError):
    """Bad input to :func:`memory_plan` (unknown optimizer, no mesh for rules...)."""


class MemoryBudgetError(MemoryPlanError):
    """The planned step needs more memory per device than the given budget."""


@dataclasses.dataclass(frozen=True)
class TensorMemory:
    """One tensor of a :class:`MemoryPlan`.

    Attributes:
        name: its state-dict name.
        kind: ``"parameter"`` (trainable), ``"frozen"`` (a parameter without
            gradient) or ``"buffer"``.
        shape: the global shape.
        dtype: the torch dtype.
        spec: the partition spec, one entry per dim (mesh axis names, None =
            replicated).
        shard_shape: the block each device stores (padded when uneven).
        bytes_per_device: bytes of that block (storage dtype: int64 is stored
            as int32 on device).
        global_bytes: bytes of the whole (unsharded) tensor.
    """

    name: str
    kind: str
    shape: tuple
    dtype: torch.dtype
    spec: tuple
    shard_shape: tuple
    bytes_per_device: int
    global_bytes: int


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """XLA's memory analysis of one compiled program, per device, in bytes.

    Attributes:
        argument_bytes: inputs (parameters, optimizer state, batch...).
        output_bytes: outputs (donated inputs are reused for them).
        alias_bytes: outputs that alias inputs.
        temp_bytes: temporaries: activations kept for backward and workspace.
        code_bytes: generated code.
    """

    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int

    @property
    def peak_bytes(self) -> int:
        """Arguments + outputs that do not alias them + temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Per-device memory of a model under a sharding (all byte counts per device).

    Attributes:
        tensors: one :class:`TensorMemory` per parameter and buffer.
        num_devices: devices of the mesh (1 without one).
        optimizer: the optimizer the state estimate is for (a name), or None.
        parameter_bytes: trainable and frozen parameters.
        gradient_bytes: one gradient per trainable parameter, sharded like it.
        optimizer_bytes: optimizer state (e.g. Adam: two parameter-sized
            moments per trainable parameter, plus a 4-byte step each).
        buffer_bytes: buffers.
        compiled: XLA's analysis of the compiled step, when one was given.
    """

    tensors: tuple
    num_devices: int
    optimizer: str | None
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    compiled: CompiledMemory | None = None

    @property
    def state_bytes(self) -> int:
        """Parameters, gradients, optimizer state and buffers."""
        return self.parameter_bytes + self.gradient_bytes + self.optimizer_bytes + self.buffer_bytes

    @property
    def activation_bytes(self) -> int | None:
        """The compiled step's temporaries (activations, workspace), or None before compiling."""
        return None if self.compiled is None else self.compiled.temp_bytes

    @property
    def total_bytes(self) -> int:
        """:attr:`state_bytes` plus :attr:`activation_bytes` when known."""
        return self.state_bytes + (self.activation_bytes or 0)

    def largest(self, n: int = 5) -> list[TensorMemory]:
        """The ``n`` tensors taking the most bytes per device."""
        return sorted(self.tensors, key=lambda t: -t.bytes_per_device)[:n]

    def check_budget(self, budget_bytes: int) -> MemoryPlan:
        """Raise :class:`MemoryBudgetError` if :attr:`total_bytes` exceeds ``budget_bytes``.

        Returns:
            ``self``, so that calls chain.
        """
        if self.total_bytes <= budget_bytes:
            return self
        worst = ", ".join(f"{t.name} {t.shape} spec {t.spec}: {_fmt(t.bytes_per_device)}" for t in self.largest(5))
        parts = (
            f"parameters {_fmt(self.parameter_bytes)}, gradients {_fmt(self.gradient_bytes)}, "
            f"optimizer state {_fmt(self.optimizer_bytes)}, buffers {_fmt(self.buffer_bytes)}"
        )
        if self.activation_bytes is not None:
            parts += f", activations {_fmt(self.activation_bytes)}"
        raise MemoryBudgetError(
            f"the step needs {_fmt(self.total_bytes)} per device ({parts}) but the budget is "
            f"{_fmt(budget_bytes)}; the largest tensors per device are {worst}. Shard them over more "
            "devices (spmdtorch.partition.plan_sharding, mark_sharding, FSDPv2) or use a bigger mesh"
        )

    def table(self):
        """The plan as a ``rich.table.Table`` (tensors, then per-device totals)."""
        from rich.table import Table

        table = Table(title=f"memory plan per device ({self.num_devices} devices)", show_footer=False)
        for col in ("tensor", "shape", "dtype", "spec", "shard shape", "per device"):
            table.add_column(col, justify="right" if col == "per device" else "left")
        for t in self.tensors:
            spec = "(" + ", ".join("None" if s is None else str(s) for s in t.spec) + ")"
            table.add_row(
                t.name,
                str(t.shape),
                str(t.dtype).replace("torch.", ""),
                spec,
                str(t.shard_shape),
                _fmt(t.bytes_per_device),
            )
        table.add_section()
        rows = [
            ("parameters", self.parameter_bytes),
            ("gradients", self.gradient_bytes),
            (f"optimizer state ({self.optimizer or 'none'})", self.optimizer_bytes),
            ("buffers", self.buffer_bytes),
        ]
        if self.compiled is not None:
            rows.append(("activations + temporaries (XLA)", self.compiled.temp_bytes))
        rows.append(("total", self.total_bytes))
        for label, value in rows:
            table.add_row(label, "", "", "", "", _fmt(value))
        return table

    def print(self, console=None) -> None:
        """Print :meth:`table` (to ``console``, a ``rich.console.Console``, or stdout)."""
        from rich.console import Console

        if console is None:
            # Full names beat a table that fits 80 columns (rich's default off a terminal).
            console = Console(width=max(Console().width, 120))
        console.print(self.table())

    def __str__(self) -> str:
        from rich.console import Console

        console = Console(width=120, record=True, file=io.StringIO())  # recorded; nothing shown
        console.print(self.table())
        return console.export_text()


def _fmt(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


# -- sharding of each tensor ---------------------------------------------------


def _existing_sharding(t) -> jax.sharding.Sharding | None:
    if not isinstance(t, XlaTensor) or view_chain(t):
        return None
    return tensor_sharding(t)


def _shard_shape(shape, sharding) -> tuple:
    if sharding is None:
        return tuple(shape)
    if isinstance(sharding, jax.sharding.NamedSharding):
        parts = padding.shards_per_dim(sharding.mesh, sharding.spec, len(shape))
        return tuple(-(-n // k) for n, k in zip(shape, parts))
    return tuple(sharding.shard_shape(tuple(shape)))


def _spec_of(sharding, ndim: int) -> tuple:
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
        return spec[:ndim]
    if sharding is None or sharding.is_fully_replicated:
        return (None,) * ndim
    return ("?",) * ndim  # a sharding without a spec (GSPMD-chosen); shard shape is still exact


def _tensors(model_or_state):
    """``(name, kind, tensor)`` for a module's parameters and buffers, or a state dict's tensors."""
    if isinstance(model_or_state, nn.Module):
        seen = set()
        for name, p in model_or_state.named_parameters():
            seen.add(id(p))
            yield name, ("parameter" if p.requires_grad else "frozen"), p
        for name, b in model_or_state.named_buffers():
            if id(b) not in seen:
                yield name, "buffer", b
        return
    if isinstance(model_or_state, Mapping):
        for name, t in model_or_state.items():
            if isinstance(t, torch.Tensor):
                trainable = t.is_floating_point() or t.is_complex()
                yield str(name), ("parameter" if trainable else "buffer"), t
        return
    raise MemoryPlanError(
        f"memory_plan expects an nn.Module or a state dict (name -> tensor), got {type(model_or_state).__name__}"
    )


# -- optimizer state -------------------------------------------------------------

# Per trainable parameter: (parameter-sized state tensors, whether a step scalar is kept).
_OPTIMIZERS = {
    "sgd": (0, False),
    "adam": (2, True),
    "adamw": (2, True),
    "adamax": (2, True),
    "nadam": (2, True),
    "radam": (2, True),
    "adagrad": (1, True),
    "rmsprop": (1, True),
    "adadelta": (2, True),
}


def _optimizer_state(optimizer) -> tuple[str | None, int, bool]:
    """``(name, parameter-sized state tensors per parameter, step scalar)``."""
    if optimizer is None:
        return None, 0, False
    if isinstance(optimizer, str):
        name, defaults = optimizer.lower(), {}
    elif isinstance(optimizer, torch.optim.Optimizer):
        name, defaults = type(optimizer).__name__.lower(), optimizer.defaults
    else:
        raise MemoryPlanError(
            f"optimizer must be a torch.optim.Optimizer or a name like 'adamw', got {type(optimizer).__name__}"
        )
    if name not in _OPTIMIZERS:
        raise MemoryPlanError(
            f"memory_plan does not know the state size of optimizer {name!r}; known: {sorted(_OPTIMIZERS)}. "
            "Pass the name of the closest one (state tensors per parameter: sgd with momentum 1, adam 2)"
        )
    n, step = _OPTIMIZERS[name]
    if name == "sgd" and defaults.get("momentum", 0):
        n = 1
    if name in ("adam", "adamw") and defaults.get("amsgrad"):
        n += 1
    if name == "rmsprop":
        n += bool(defaults.get("momentum", 0)) + bool(defaults.get("centered"))
    return name, n, step


# -- the plan ------------------------------------------------------------------------


def _resolve_mesh(mesh):
    from spmdtorch.mesh import Mesh, get_global_mesh

    if mesh is None:
        return get_global_mesh()
    return _checks.check_instance(mesh, Mesh, "memory_plan", "mesh", MemoryPlanError, "a spmdtorch.mesh.Mesh or None")


def memory_plan(
    model_or_state,
    mesh=None,
    *,
    rules: Mapping[str, Any] | str | None = None,
    optimizer=None,
    compiled=None,
    budget_bytes: int | None = None,
    show: bool = False,
) -> MemoryPlan:
    """Plan the bytes each device holds for ``model_or_state``, before allocating anything.

    Each tensor's sharding is, in order: the rule that matches it (``rules``),
    the sharding it already has (an annotated or sharded xla tensor), else
    replicated.

    Args:
        model_or_state: an ``nn.Module`` (on meta, CPU or xla) or a state dict;
            in a state dict, floating-point tensors count as trainable parameters.
        mesh: the ``spmdtorch.mesh.Mesh`` the rules refer to (default: the
            global mesh). Not needed when the tensors carry their shardings.
        rules: glob patterns of parameter names to partition specs (as for
            ``mark_sharding(module, mesh, rules)``), or ``"fsdp"`` (largest dim
            over the axis ``"fsdp"``, as FSDPv2 does).
        optimizer: a ``torch.optim.Optimizer`` or its name (``"adamw"``,
            ``"sgd"``...) for the state estimate; None counts no state.
        compiled: a compiled step (``spmdtorch.compile``'d function after a
            call, or a ``jax.stages.Compiled``): adds XLA's memory analysis.
        budget_bytes: raise :class:`MemoryBudgetError` if the plan's total per
            device exceeds it.
        show: print the plan as a rich table.

    Returns:
        A :class:`MemoryPlan`.

    Raises:
        MemoryPlanError: bad input (unknown optimizer, rules without a mesh).
        MemoryBudgetError: the plan does not fit ``budget_bytes``.
        ShardingError: a rule matches nothing, or has a bad spec.

    Example:
        >>> import torch
        >>> from spmdtorch.plan import memory_plan
        >>> plan = memory_plan(torch.nn.Linear(4, 2), optimizer="sgd")
        >>> plan.parameter_bytes, plan.gradient_bytes, plan.optimizer_bytes
        (40, 40, 0)
    """
    if budget_bytes is not None:
        _checks.check_int(budget_bytes, "memory_plan", "budget_bytes", MemoryPlanError, minimum=0)
    show = _checks.check_bool(show, "memory_plan", "show", MemoryPlanError)
    entries = list(_tensors(model_or_state))
    mesh = _resolve_mesh(mesh)
    matched: dict[str, str] = {}
    rule_map: Mapping[str, Any] = {}  # the glob rules (a dict given as ``rules``)
    if rules is not None:
        if mesh is None:
            raise MemoryPlanError("memory_plan got sharding rules but no mesh (and no global mesh is set); pass mesh=")
        if isinstance(rules, str):
            if rules != "fsdp":
                raise MemoryPlanError(f"rules={rules!r}: give a dict of patterns to partition specs, 'fsdp' or None")
            if FSDP_AXIS not in tuple(mesh.axis_names or ()):
                raise MemoryPlanError(f"rules='fsdp' needs a mesh axis named 'fsdp'; the mesh has {mesh.axis_names!r}")
        elif not isinstance(rules, Mapping):
            raise MemoryPlanError(f"rules must be a dict, 'fsdp' or None, got {type(rules).__name__}")
        else:
            rule_map = rules
            params = [n for n, kind, _ in entries if kind != "buffer"]
            matched = match_rules(params, rules)
    tensors = []
    device_counts = []  # without a mesh: the devices the tensors' own shardings span
    for name, kind, t in entries:
        shape = tuple(t.shape)
        sharding = None
        if rules == "fsdp" and kind != "buffer":
            sharding = mesh.named_sharding(param_spec(shape))
        elif name in matched:
            try:
                sharding = mesh.named_sharding(tuple(rule_map[matched[name]]), t.dim())
            except ValueError as e:
                raise ShardingError(f"parameter {name!r} (rule {matched[name]!r}): {e}") from None
        else:
            sharding = _existing_sharding(t)
        if sharding is not None:
            device_counts.append(len(sharding.device_set))
        itemsize = jax.numpy.dtype(_dtypes.to_jax_dtype(t.dtype)).itemsize
        shard = _shard_shape(shape, sharding)
        tensors.append(
            TensorMemory(
                name=name,
                kind=kind,
                shape=shape,
                dtype=t.dtype,
                spec=_spec_of(sharding, len(shape)),
                shard_shape=shard,
                bytes_per_device=math.prod(shard) * itemsize,
                global_bytes=math.prod(shape) * itemsize,
            )
        )
    opt_name, n_state, step = _optimizer_state(optimizer)
    trainable = [t for t in tensors if t.kind == "parameter"]
    grad = sum(t.bytes_per_device for t in trainable)
    plan = MemoryPlan(
        tensors=tuple(tensors),
        num_devices=mesh.size() if mesh is not None else max(device_counts, default=1),
        optimizer=opt_name,
        parameter_bytes=sum(t.bytes_per_device for t in tensors if t.kind != "buffer"),
        gradient_bytes=grad,
        optimizer_bytes=n_state * grad + (4 * len(trainable) if step else 0),
        buffer_bytes=sum(t.bytes_per_device for t in tensors if t.kind == "buffer"),
        compiled=None if compiled is None else compiled_memory(compiled),
    )
    if show:
        plan.print()
    if budget_bytes is not None:
        plan.check_budget(budget_bytes)
    return plan


def compiled_memory(compiled) -> CompiledMemory:
    """XLA's memory analysis of a compiled step, per device.

    Args:
        compiled: a ``spmdtorch.compile``'d function (after at least one call),
            a ``jax.stages.Compiled``, or anything with ``memory_analysis()``.

    Raises:
        MemoryPlanError: nothing compiled yet, or the backend gives no analysis.
    """
    exe = compiled
    if hasattr(compiled, "executable") and callable(compiled.executable):
        exe = compiled.executable()
        if exe is None:
            raise MemoryPlanError(
                f"{getattr(compiled, '__name__', 'the compiled function')} has not been called yet: "
                "call it once (it compiles on the first call), then ask for its memory"
            )
    analysis = getattr(exe, "memory_analysis", None)
    stats = analysis() if callable(analysis) else None
    if stats is None:
        raise MemoryPlanError(
            f"no memory analysis for compiled={type(compiled).__name__}: pass a spmdtorch.compile'd function or a "
            "jax.stages.Compiled (this backend may not provide one)"
        )
    return CompiledMemory(
        argument_bytes=int(stats.argument_size_in_bytes),
        output_bytes=int(stats.output_size_in_bytes),
        alias_bytes=int(stats.alias_size_in_bytes),
        temp_bytes=int(stats.temp_size_in_bytes),
        code_bytes=int(stats.generated_code_size_in_bytes),
    )
