"""Gradient accumulation with one gradient reduction per step, not one per micro-batch.

In one SPMD program, the gradient of a parameter over a batch split across
devices is a sum of per-device partial gradients, and GSPMD reduces it
(all-reduce or reduce-scatter) where autograd produces it: once per
``backward()``. A step that runs ``backward()`` on 4 micro-batches and lets
``.grad`` accumulate therefore reduces 4 times the gradient bytes of a
1-micro-batch step (pytorch/xla#5760). A partition spec cannot say "not
reduced yet", so no annotation of the accumulator removes those reductions.

:func:`accumulate_gradients` keeps the partial sums apart instead. Each
micro-batch runs in a manual region (:func:`spmdtorch.sharding.shard_map`)
over the whole mesh: every device runs the model's forward and
``torch.autograd.grad`` on its own block of the micro-batch with the whole
parameters, and returns its local gradients stacked on a new leading dim
(split over every mesh axis: each device holds its own, no collective). The
stacks are added up micro-batch after micro-batch, still per device, and
summed over the device dim once at the end, where the one reduction per
parameter happens, into the parameter's own layout. This is what
``no_sync()`` / ``set_requires_gradient_sync(False)`` achieve in torch's
DDP and FSDP2, and it costs the same memory: each device holds whole
parameters and a whole gradient accumulator during the step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import torch
from torch import nn

from spmdtorch import _checks
from spmdtorch.fsdp import _fsdpv2
from spmdtorch.mesh import Mesh, get_global_mesh
from spmdtorch.programs import INTERNAL
from spmdtorch.sharding import ShardingError, mark_sharding, shard_map, tensor_sharding
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["AccumulateGradientsError", "accumulate_gradients"]


class AccumulateGradientsError(ValueError):
    """:func:`accumulate_gradients` got arguments it cannot accumulate over."""


class _Step(nn.Module):
    """``loss_fn(model, *batch)`` as the forward of a module owning ``model``, so ``functional_call`` swaps its weights.

    A new one per call, so ``spmdtorch.compile`` must not guard it (``INTERNAL``):
    a replay would find the traced one dead and trace every step again.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: Any) -> Any:
        return self.loss_fn(self.model, *batch)


setattr(_Step, INTERNAL, True)  # a per-call wrapper: spmdtorch.compile collects the model it calls, not it


def _is_dtensor(t: Any) -> bool:
    # torch's DTensor (spmdtorch.dtensor's XlaDTensor is one); read by name so this layer needs no dtensor import.
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _global(p: torch.Tensor) -> torch.Tensor:
    """The parameter's global xla tensor (an ``XlaDTensor`` holds it as its local tensor)."""
    return p.to_local() if _is_dtensor(p) else p  # type: ignore[attr-defined]


def _mesh_of_device_mesh(device_mesh: Any) -> Mesh:
    root = device_mesh._get_root_mesh()
    ids = [int(i) for i in root.mesh.flatten().tolist()]
    return Mesh(ids, tuple(root.shape), root.mesh_dim_names)


def _resolve_mesh(model: nn.Module, mesh: Any, params: Sequence[torch.Tensor]) -> Mesh:
    if mesh is None:
        if isinstance(model, _fsdpv2.FSDPv2):
            return model.mesh
        dt = next((p for p in params if _is_dtensor(p)), None)
        if dt is not None:
            return _mesh_of_device_mesh(dt.device_mesh)  # type: ignore[attr-defined]
        mesh = get_global_mesh()
        if mesh is None:
            raise AccumulateGradientsError(
                "accumulate_gradients: no mesh: pass mesh=<the spmdtorch Mesh the batch is split over>, or call "
                "spmdtorch.mesh.set_global_mesh(mesh) first (an FSDPv2 model or DTensor parameters give theirs)"
            )
    if isinstance(mesh, Mesh):
        return mesh
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(mesh, DeviceMesh) and mesh.device_type == "xla":
        return _mesh_of_device_mesh(mesh)
    raise AccumulateGradientsError(
        f"accumulate_gradients: mesh must be a spmdtorch.mesh.Mesh or an xla DeviceMesh, got {type(mesh).__name__}"
    )


def _micro_batch(batch: Any, i: int, devices: int) -> tuple[Any, ...]:
    items = tuple(batch) if isinstance(batch, (tuple, list)) else (batch,)
    tensors = [x for x in items if isinstance(x, torch.Tensor)]
    if not tensors:
        raise AccumulateGradientsError(
            f"accumulate_gradients: micro_batches[{i}] holds no tensor; give each micro-batch as a tensor or a "
            "tuple of tensors whose dim 0 is the batch"
        )
    out = []
    for k, x in enumerate(items):
        if not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        x = _global(x) if _is_dtensor(x) else x
        if not isinstance(x, XlaTensor):
            raise AccumulateGradientsError(
                f"accumulate_gradients: micro_batches[{i}][{k}] is on {x.device}, expected an xla tensor; "
                "move the batch with .to('xla')"
            )
        if x.dim() == 0 or x.size(0) % devices:
            raise AccumulateGradientsError(
                f"accumulate_gradients: micro_batches[{i}][{k}] has shape {tuple(x.shape)}, but its dim 0 (the "
                f"batch) is split over all {devices} devices and must be a positive multiple of {devices}"
            )
        out.append(x.detach())
    return tuple(out)


def _annotate_like(g: torch.Tensor, p: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """``g`` laid out as ``p`` is (when ``p``'s layout is over ``mesh``), so the one reduction lands in it."""
    sharding = tensor_sharding(_global(p))
    spec = getattr(sharding, "spec", None)
    if spec is None or getattr(sharding, "mesh", None) != mesh.jax_mesh:
        return g
    entries = tuple(spec) + (None,) * (g.dim() - len(tuple(spec)))
    try:
        return mark_sharding(g, mesh, entries)
    except ShardingError:
        return g  # a layout that does not fit the gradient: leave it to GSPMD's propagation


def _set_grad(p: torch.Tensor, g: torch.Tensor) -> None:
    if _is_dtensor(p):
        from torch.distributed.tensor import Partial, Replicate

        placements = [Replicate() if isinstance(q, Partial) else q for q in p.placements]  # type: ignore[attr-defined]
        g = type(p).from_local(g, p.device_mesh, placements)  # type: ignore[attr-defined]
    p.grad = g if p.grad is None else p.grad + g


def accumulate_gradients(
    model: nn.Module,
    loss_fn: Callable[..., torch.Tensor],
    micro_batches: Sequence[Any],
    *,
    mesh: Any = None,
) -> torch.Tensor:
    """Add the gradients of ``loss_fn`` over ``micro_batches`` to ``.grad``, reducing each gradient once.

    The values equal eager PyTorch's accumulation loop::

        for batch in micro_batches:
            (loss_fn(model, *batch) / len(micro_batches)).backward()

    but the step program has the gradient collectives of one micro-batch
    (one reduction per parameter, whatever the number of micro-batches)
    instead of one set per micro-batch; the module docstring says how. Use
    it in lazy mode or inside :func:`spmdtorch.compile`'d steps, then step
    the optimizer as usual. Works for :class:`~spmdtorch.fsdp.FSDPv2`
    models, models annotated with ``mark_sharding``, and models whose
    parameters are ``spmdtorch.dtensor`` DTensors (``fully_shard``); it is the
    single-controller counterpart of FSDP2's ``set_requires_gradient_sync(False)``.

    Inside the micro-steps the model runs data-parallel over every device
    of ``mesh`` with whole parameters (gathered once per step), so each
    micro-batch's dim 0 is split over all devices, and a tensor-parallel
    layout is not used there. Each device holds whole parameters and a whole
    gradient accumulator during the step (as torch's ``no_sync`` does).

    Args:
        model: the module; its parameters that require grad get the gradients.
        loss_fn: ``loss_fn(model, *batch) -> scalar``: the mean loss over the
            micro-batch's examples (e.g. ``F.cross_entropy``'s default). Each
            device computes it on its own block and the blocks' losses are
            averaged, which is the micro-batch mean for per-example means;
            a loss normalised otherwise (e.g. by a token count that differs
            per block) is averaged per block. The body of a manual region:
            no random ops (dropout with ``p > 0``), no in-place updates of
            buffers, no ``mark_sharding`` calls of its own (FSDPv2's output
            annotations and ``spmdtorch.dtensor``'s layouts, tensor-parallel
            hooks included, are left out there).
        micro_batches: a sequence of micro-batches, each a tensor or a tuple
            of xla tensors (non-tensor items are passed through) whose dim 0
            is the batch, a multiple of the mesh's device count.
        mesh: the :class:`~spmdtorch.mesh.Mesh` (or xla ``DeviceMesh``) the
            batch is split over; default: an FSDPv2 model's mesh, the
            DTensor parameters' mesh, or the global mesh.

    Returns:
        The mean of the micro-batches' losses (a scalar xla tensor).

    Raises:
        AccumulateGradientsError: no micro-batches, a batch dim that does not
            split over the devices, a loss that is not a scalar, no mesh.

    Example:
        >>> import numpy as np, torch
        >>> from spmdtorch.mesh import Mesh
        >>> from spmdtorch.fsdp import FSDPv2, accumulate_gradients
        >>> model = FSDPv2(torch.nn.Linear(4, 8), mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
        >>> batches = [torch.ones(8, 4, device="xla") for _ in range(4)]
        >>> loss = accumulate_gradients(model, lambda m, x: m(x).pow(2).mean(), batches)
        >>> tuple(model.module.weight.grad.shape), tuple(loss.shape)
        ((8, 4), ())
    """
    what = "accumulate_gradients"
    _checks.check_instance(model, nn.Module, what, "model", AccumulateGradientsError, "an nn.Module")
    _checks.check_callable(loss_fn, what, "loss_fn", AccumulateGradientsError)
    if isinstance(micro_batches, torch.Tensor) or not isinstance(micro_batches, Sequence) or not micro_batches:
        raise AccumulateGradientsError(
            f"{what}: micro_batches must be a non-empty list of micro-batches (tensors or tuples of tensors), got "
            f"{type(micro_batches).__name__}" + (" (empty)" if isinstance(micro_batches, Sequence) else "")
        )
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise AccumulateGradientsError(f"{what}: model has no parameter that requires grad")
    spmd = _resolve_mesh(model, mesh, [p for _, p in named])
    axes: tuple[Any, ...] = tuple(spmd.axis_names) if spmd.axis_names else tuple(range(len(spmd.mesh_shape)))
    devices = spmd.size()
    batch_axes = axes if len(axes) > 1 else axes[0]
    values = [_global(p).detach() for _, p in named]
    for (name, _), v in zip(named, values):
        if not isinstance(v, XlaTensor):
            raise AccumulateGradientsError(
                f"{what}: parameter {name!r} is on {v.device}, expected xla; move the model with .to('xla')"
            )
    runner = _Step(model, loss_fn)
    keys = [f"model.{name}" for name, _ in named]
    acc: list[torch.Tensor] | None = None
    for i, batch in enumerate(micro_batches):
        items = _micro_batch(batch, i, devices)
        tensor_at = [k for k, x in enumerate(items) if isinstance(x, torch.Tensor)]

        def body(*args: torch.Tensor, items: tuple[Any, ...] = items, tensor_at: list[int] = tensor_at) -> Any:
            xs, ps = args[: len(tensor_at)], args[len(tensor_at) :]
            full = list(items)
            for k, x in zip(tensor_at, xs):
                full[k] = x
            leaves = [p.requires_grad_() for p in ps]
            # The forward and its backward both run per device: annotations over the mesh are left out of both.
            with torch.enable_grad(), _fsdpv2.local_step():
                loss = torch.func.functional_call(runner, dict(zip(keys, leaves)), tuple(full), strict=False)
                if _is_dtensor(loss):
                    loss = _global(loss)  # e.g. under loss_parallel: the global value
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    got = (
                        f"a tensor of shape {tuple(loss.shape)}"
                        if isinstance(loss, torch.Tensor)
                        else type(loss).__name__
                    )
                    raise AccumulateGradientsError(
                        f"{what}: loss_fn must return a scalar tensor (the micro-batch's mean loss), got {got}"
                    )
                grads = torch.autograd.grad(loss, leaves, allow_unused=True)
            local = [torch.zeros_like(p) if g is None else g for p, g in zip(ps, grads)]
            return (loss.detach().reshape(1), *(g.unsqueeze(0) for g in local))

        in_specs = [(batch_axes,) + (None,) * (items[k].dim() - 1) for k in tensor_at]
        in_specs += [(None,) * v.dim() for v in values]
        out_specs = [(batch_axes,)] + [(batch_axes,) + (None,) * v.dim() for v in values]
        outs = shard_map(body, spmd, in_specs, out_specs)(*(items[k] for k in tensor_at), *values)
        acc = list(outs) if acc is None else [a + o for a, o in zip(acc, outs)]
    acc = cast(list[torch.Tensor], acc)  # micro_batches is non-empty (checked above)
    scale = 1.0 / (devices * len(micro_batches))
    for (_, p), stacked in zip(named, acc[1:]):
        _set_grad(p, _annotate_like(stacked.sum(0) * scale, p, spmd))
    return acc[0].sum() * scale
