"""``distribute_module`` and ``parallelize_module`` over an xla mesh: parallel styles as annotations.

torch's ``distribute_module`` / ``ParallelStyle._apply`` hand an ``xla`` mesh to
PyTorch/XLA; here the same styles become the same parameter placements and
the same input/output hooks, built on :func:`distribute_tensor` and
:func:`from_local` (whose tensors are global, so a hook's ``from_local`` of a
module input is an annotation). Every collective DTensor would issue between
layers (the all-reduce after a row-wise linear, the all-gather before a
column-wise one) is then XLA's to insert from the annotations.

Supported styles, with torch's defaults and options: ``ColwiseParallel`` and
``RowwiseParallel`` (``nn.Linear``, ``nn.Embedding``; ``input_layouts``,
``output_layouts``, ``use_local_output``), ``SequenceParallel``,
``PrepareModuleInput``, ``PrepareModuleOutput``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from fnmatch import fnmatch
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from spmdtorch import _checks
from spmdtorch.dtensor._mesh import as_xla_mesh
from spmdtorch.dtensor._tensor import _check_src_data_rank, distribute_tensor, from_local
from spmdtorch.dtensor.errors import DTensorError, UnsupportedStyleError

__all__ = ["distribute_module", "parallelize_module"]


def _replicate_rest(m: nn.Module, mesh: DeviceMesh) -> None:
    # What torch's distribute_module does after partition_fn: every other parameter and buffer is replicated.
    full = [Replicate()] * mesh.ndim
    for key, param in m._parameters.items():
        if param is not None and not isinstance(param, DTensor):
            m.register_parameter(
                key, nn.Parameter(distribute_tensor(param.data, mesh, full), requires_grad=param.requires_grad)
            )
    for key, buf in m._buffers.items():
        if buf is not None and not isinstance(buf, DTensor):
            m._buffers[key] = distribute_tensor(buf, mesh, full)


def _hook_arity(fn: Callable[..., Any], caller: str, name: str, error: type[Exception]) -> int:
    n = len(inspect.signature(fn).parameters)
    if n not in (2, 3):  # torch's wording (torch.distributed.tensor.distribute_module)
        raise error(
            f"{caller}: {name} should take in 3 arguments (module, inputs/outputs, device_mesh), but got {n}"
            " arguments! Take (module, inputs, device_mesh) for input_fn, (module, outputs, device_mesh) "
            "for output_fn"
        )
    if n == 2:
        warnings.warn(
            f"{caller}: Deprecating {name} that takes two arguments (inputs, device_mesh), please use {name} that "
            "takes in (module, inputs, device_mesh) instead!",
            FutureWarning,
            stacklevel=4,
        )
    return n


def register_mesh_hooks(
    module: nn.Module,
    mesh: Any,
    input_fn: Callable[..., Any] | None,
    output_fn: Callable[..., Any] | None,
    *,
    caller: str,
    error: type[Exception],
) -> None:
    """``distribute_module``'s ``input_fn`` / ``output_fn`` as forward hooks that are handed ``mesh``.

    torch's contract: ``input_fn(module, inputs, mesh)`` becomes a forward
    pre-hook and ``output_fn(module, outputs, mesh)`` a forward hook; the
    deprecated two-argument forms ``(inputs, mesh)`` / ``(outputs, mesh)``
    still work, with torch's ``FutureWarning``. Declared internal API of
    ``spmdtorch.dtensor``: ``spmdtorch.compat``'s ``xla_distribute_module``
    registers its hooks with it too.

    Args:
        module: the module to hook.
        mesh: what the hooks receive as their mesh argument.
        input_fn: the input hook, or None.
        output_fn: the output hook, or None.
        caller: the public function's name, which begins the messages.
        error: the exception class raised for a hook of the wrong arity
            (its constructor takes one message).

    Raises:
        error: ``input_fn`` or ``output_fn`` takes neither 2 nor 3 parameters
            (nothing is registered then).
    """
    in_n = None if input_fn is None else _hook_arity(input_fn, caller, "input_fn", error)
    out_n = None if output_fn is None else _hook_arity(output_fn, caller, "output_fn", error)
    if input_fn is not None:
        in_fn = input_fn
        if in_n == 2:
            module.register_forward_pre_hook(lambda _m, inputs: in_fn(inputs, mesh))
        else:
            module.register_forward_pre_hook(lambda m, inputs: in_fn(m, inputs, mesh))
    if output_fn is not None:
        out_fn = output_fn
        if out_n == 2:
            module.register_forward_hook(lambda _m, _i, outputs: out_fn(outputs, mesh))
        else:
            module.register_forward_hook(lambda m, _i, outputs: out_fn(m, outputs, mesh))


def distribute_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    partition_fn: Callable[[str, nn.Module, DeviceMesh], None] | None = None,
    input_fn: Callable[..., Any] | None = None,
    output_fn: Callable[..., Any] | None = None,
) -> nn.Module:
    """torch's ``distribute_module`` on an xla mesh.

    ``partition_fn(name, submodule, mesh)`` runs for every submodule (it
    replaces parameters with :func:`distribute_tensor` results); every
    parameter and buffer it leaves as a plain tensor is then replicated.
    ``input_fn(module, inputs, mesh)`` becomes a forward pre-hook and
    ``output_fn(module, outputs, mesh)`` a forward hook.

    Returns:
        ``module``, changed in place.

    Raises:
        DeviceMeshError: ``device_mesh`` is not an xla mesh.
        DTensorError: a hook with neither 2 nor 3 parameters.
    """
    if not isinstance(module, nn.Module):
        raise DTensorError(f"distribute_module: module must be an nn.Module, got {type(module).__name__}")
    mesh = as_xla_mesh(device_mesh, "distribute_module(device_mesh)")
    for param, fn in (("partition_fn", partition_fn), ("input_fn", input_fn), ("output_fn", output_fn)):
        if fn is not None:
            _checks.check_callable(fn, "distribute_module", param, DTensorError)
    for name, sub in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, sub, mesh)
        _replicate_rest(sub, mesh)
    register_mesh_hooks(module, mesh, input_fn, output_fn, caller="distribute_module", error=DTensorError)
    return module


# -- the styles -------------------------------------------------------------------------
def _shard_params(module: nn.Module, mesh: DeviceMesh, layouts: Mapping[str, Sequence[Placement]]) -> None:
    for key, placements in layouts.items():
        param = module._parameters.get(key)
        if param is not None and not isinstance(param, DTensor):
            module.register_parameter(
                key, nn.Parameter(distribute_tensor(param.data, mesh, placements), requires_grad=param.requires_grad)
            )


def _as_dtensor(t: Any, mesh: DeviceMesh, layouts: tuple[Placement, ...], desired: tuple[Placement, ...]) -> Any:
    """A module input as a DTensor with ``layouts`` (from_local of the global tensor), redistributed to ``desired``."""
    if not isinstance(t, torch.Tensor):
        return t
    d = t if isinstance(t, DTensor) else from_local(t, mesh, layouts)
    if tuple(d.placements) != tuple(desired):
        d = d.redistribute(placements=desired)
    return d


def _finish(out: Any, layouts: tuple[Placement, ...], use_local: bool) -> Any:
    if not isinstance(out, DTensor):
        return out
    if tuple(out.placements) != tuple(layouts):
        out = out.redistribute(placements=layouts)
    return out.to_local() if use_local else out


def _linear_or_embedding(style: str, module: nn.Module) -> str:
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding"
    raise UnsupportedStyleError(
        f"{style} applies to nn.Linear and nn.Embedding (as in torch), got {type(module).__name__}; give the "
        "plan entry for its Linear/Embedding children, or use PrepareModuleInput/PrepareModuleOutput"
    )


def _colwise(style: ColwiseParallel, module: nn.Module, mesh: DeviceMesh) -> None:
    kind = _linear_or_embedding("ColwiseParallel", module)
    layout = {"weight": [Shard(0)], "bias": [Shard(0)]} if kind == "linear" else {"weight": [Shard(1)]}
    _shard_params(module, mesh, layout)
    _replicate_rest(module, mesh)
    ins, want = tuple(style.input_layouts), tuple(style.desired_input_layouts)
    outs, local = tuple(style.output_layouts), style.use_local_output
    module.register_forward_pre_hook(lambda _m, inputs: (_as_dtensor(inputs[0], mesh, ins, want), *inputs[1:]))
    module.register_forward_hook(lambda _m, _i, out: _finish(out, outs, local))


def _rowwise(style: RowwiseParallel, module: nn.Module, mesh: DeviceMesh) -> None:
    kind = _linear_or_embedding("RowwiseParallel", module)
    if kind == "linear":
        _shard_params(module, mesh, {"weight": [Shard(1)], "bias": [Replicate()]})
        want: tuple[Placement, ...] = (Shard(-1),)
    else:
        _shard_params(module, mesh, {"weight": [Shard(0)]})
        want = (Replicate(),)
    _replicate_rest(module, mesh)
    ins, outs, local = tuple(style.input_layouts), tuple(style.output_layouts), style.use_local_output
    module.register_forward_pre_hook(lambda _m, inputs: (_as_dtensor(inputs[0], mesh, ins, want), *inputs[1:]))
    module.register_forward_hook(lambda _m, _i, out: _finish(out, outs, local))


def _sequence(style: SequenceParallel, module: nn.Module, mesh: DeviceMesh) -> None:
    _replicate_rest_all(module, mesh)
    seq = tuple(style.sequence_sharding)

    def pre(_m: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        first = inputs[0] if isinstance(inputs[0], DTensor) else _as_dtensor(inputs[0], mesh, seq, seq)
        return (first, *inputs[1:])

    module.register_forward_pre_hook(pre)
    local = style.use_local_output
    module.register_forward_hook(lambda _m, _i, out: out.to_local() if local and isinstance(out, DTensor) else out)


def _replicate_rest_all(module: nn.Module, mesh: DeviceMesh) -> None:
    for sub in module.modules():
        _replicate_rest(sub, mesh)


def _prepare_args(values: tuple[Any, ...], layouts: Any, desired: Any, mesh: DeviceMesh, use_local: bool) -> Any:
    if len(values) != len(layouts):
        raise DTensorError(
            f"PrepareModuleInput: the module got {len(values)} positional inputs but input_layouts has "
            f"{len(layouts)} entries; give one (None to leave it) per input"
        )
    out = []
    for v, have, want in zip(values, layouts, desired):
        if have is None or not isinstance(v, torch.Tensor):
            out.append(v)
            continue
        d = _as_dtensor(v, mesh, (have,), (want,))
        out.append(d.to_local() if use_local else d)
    return tuple(out)


def _prepare_input(style: PrepareModuleInput, module: nn.Module, mesh: DeviceMesh) -> None:
    layouts, desired, local = style.input_layouts, style.desired_input_layouts, style.use_local_output
    if layouts is not None and any(p is not None for p in layouts):
        module.register_forward_pre_hook(lambda _m, inputs: _prepare_args(tuple(inputs), layouts, desired, mesh, local))
    if style.with_kwargs:
        kw_layouts, kw_desired = style.input_kwarg_layouts, style.desired_input_kwarg_layouts

        def kw_hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            new = dict(kwargs)
            for key, have in kw_layouts.items():
                if key in new and isinstance(new[key], torch.Tensor):
                    d = _as_dtensor(new[key], mesh, (have,), (kw_desired.get(key, have),))
                    new[key] = d.to_local() if local else d
            return args, new

        module.register_forward_pre_hook(kw_hook, with_kwargs=True)


def _prepare_output(style: PrepareModuleOutput, module: nn.Module, mesh: DeviceMesh) -> None:
    layouts, desired, local = style.output_layouts, style.desired_output_layouts, style.use_local_output

    def hook(_m: nn.Module, _i: Any, out: Any) -> Any:
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != len(layouts):
            raise DTensorError(
                f"PrepareModuleOutput: the module returned {len(outs)} outputs but output_layouts has "
                f"{len(layouts)} entries; give one (None to leave it) per output"
            )
        done = []
        for o, have, want in zip(outs, layouts, desired):
            if have is None or not isinstance(o, torch.Tensor):
                done.append(o)
                continue
            d = _as_dtensor(o, mesh, (have,), (want,))
            done.append(d.to_local() if local else d)
        return tuple(done) if isinstance(out, tuple) else done[0]

    module.register_forward_hook(hook)


def _apply(style: ParallelStyle, module: nn.Module, mesh: DeviceMesh) -> None:
    # Subclasses first: a user style derived from one of these keeps torch's meaning of its base.
    if isinstance(style, ColwiseParallel):
        _colwise(style, module, mesh)
    elif isinstance(style, RowwiseParallel):
        _rowwise(style, module, mesh)
    elif isinstance(style, SequenceParallel):
        _sequence(style, module, mesh)
    elif isinstance(style, PrepareModuleInput):
        _prepare_input(style, module, mesh)
    elif isinstance(style, PrepareModuleOutput):
        _prepare_output(style, module, mesh)
    else:
        raise UnsupportedStyleError(
            f"parallelize_module: {type(style).__name__} has no spmdtorch plan; use ColwiseParallel, "
            "RowwiseParallel, SequenceParallel, PrepareModuleInput or PrepareModuleOutput, or shard the "
            "parameters yourself with distribute_module"
        )


def parallelize_module(
    module: nn.Module,
    device_mesh: DeviceMesh | None = None,
    parallelize_plan: ParallelStyle | dict[str, ParallelStyle] | None = None,
    *,
    src_data_rank: int | None = 0,
) -> nn.Module:
    """torch's ``parallelize_module`` on an xla mesh: each style's placements become annotations.

    ``parallelize_plan`` is a style or a dict from module paths (``fnmatch``
    patterns per dotted component, as in torch) to styles.
    ``src_data_rank`` is accepted (the global parameters are the source).

    Returns:
        ``module``, changed in place.

    Raises:
        UnsupportedStyleError: a style without a plan here, or a
            ``ColwiseParallel``/``RowwiseParallel`` on a module that is not
            ``nn.Linear``/``nn.Embedding``.
        DeviceMeshError: ``device_mesh`` is not an xla mesh.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
        >>> from spmdtorch.dtensor import init_device_mesh, parallelize_module
        >>> mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        >>> mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        >>> mlp = parallelize_module(mlp, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        >>> mlp[0].weight.placements, mlp[2].weight.placements, mlp(torch.ones(2, 8, device="xla")).shape
        ((Shard(dim=0),), (Shard(dim=1),), torch.Size([2, 8]))
    """
    if not isinstance(module, nn.Module):
        raise DTensorError(f"parallelize_module: module must be an nn.Module, got {type(module).__name__}")
    mesh = as_xla_mesh(device_mesh, "parallelize_module(device_mesh)")
    _check_src_data_rank(src_data_rank, "parallelize_module")
    if parallelize_plan is None:
        warnings.warn("parallelize_module: no parallelize_plan given; the module is unchanged", stacklevel=2)
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        _apply(parallelize_plan, module, mesh)
        return module
    if not isinstance(parallelize_plan, dict):
        raise DTensorError(
            f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict of them, got "
            f"{type(parallelize_plan).__name__}"
        )
    for path, style in parallelize_plan.items():
        if path == "":
            parallelize_module(module, mesh, style)
            continue
        token, _, rest = path.partition(".")
        matched = [child for name, child in module.named_children() if fnmatch(name, token)]
        if not matched:
            warnings.warn(
                f"parallelize_module: plan key {path!r} matches no submodule of {type(module).__name__}; skipped",
                stacklevel=2,
            )
        for child in matched:
            parallelize_module(child, mesh, {rest: style} if rest else style)
    return module
