"""``torch.distributed.checkpoint.state_dict``'s four functions for models annotated with ``spmdtorch.dtensor``.

torch's ``get_model_state_dict`` / ``get_optimizer_state_dict`` run here as
they are (they need no process group for sharded state dicts) and return the
parameters and optimizer state as ``XlaDTensor`` s. DCP's planners cannot
write those: for a ``DTensor`` they ask the mesh for this rank's coordinate
(``NoRankError`` on a single-controller mesh) and then handle the local tensor
as this rank's shard, where here it is the whole tensor. spmdtorch's
``SPMDSavePlanner`` / ``SPMDLoadPlanner`` write and fill plain xla tensors
shard by shard, in their own shardings. So the getters here return torch's
state dicts with every DTensor replaced by its global xla tensor
(:func:`global_tensors`, the one place that unwrapping happens): the very
tensor the parameter (or optimizer state) holds, so ``dcp.load`` with
``SPMDLoadPlanner`` fills the model and optimizer in place, in *their*
layouts, whatever mesh the checkpoint was saved from. The setters take such
a state dict (or torch's, with DTensors, or full CPU tensors) and lay each
tensor out as the model's parameter is before handing it to torch's setter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint import state_dict as torch_sd
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.tensor import DTensor

from spmdtorch import _checks
from spmdtorch.dtensor._tensor import XlaDTensor, distribute_tensor
from spmdtorch.dtensor.errors import DTensorError, StateDictError

# global_tensors is the one unwrapping step; not exported (the getters apply it).
__all__ = [
    "get_model_state_dict",
    "get_optimizer_state_dict",
    "set_model_state_dict",
    "set_optimizer_state_dict",
]


def global_tensors(state: Any) -> Any:
    """``state`` (nested dicts, lists, tuples) with every ``XlaDTensor`` replaced by its global xla tensor.

    This is the step between torch's state-dict functions and DCP's
    ``save``/``load`` with spmdtorch's planners. The tensor put in is the
    DTensor's own global tensor (not a copy), annotated with the GSPMD
    sharding its placements mean, so ``SPMDSavePlanner`` writes each distinct
    shard once and ``SPMDLoadPlanner`` fills it in place, in that layout (a
    parameter loaded this way is restored). Other values are kept as they are.

    Args:
        state: a state dict (what torch's ``get_model_state_dict`` /
            ``get_optimizer_state_dict`` return), or any nesting of dicts,
            lists and tuples.

    Returns:
        The same nesting, new containers, with plain tensors where there were DTensors.
    """
    if isinstance(state, XlaDTensor):
        with torch.no_grad():  # to_local() outside autograd is the DTensor's own global tensor
            return state.to_local()
    if isinstance(state, dict):
        return {k: global_tensors(v) for k, v in state.items()}
    if isinstance(state, list):
        return [global_tensors(v) for v in state]
    if isinstance(state, tuple):
        return tuple(global_tensors(v) for v in state)
    return state


# -- argument checks ------------------------------------------------------------------------
def _check_model(model: Any, func: str) -> nn.Module:
    return _checks.check_instance(model, nn.Module, func, "model", DTensorError, "a torch.nn.Module")


def _check_options(options: Any, func: str) -> StateDictOptions:
    if options is None:
        return StateDictOptions()
    _checks.check_instance(options, StateDictOptions, func, "options", DTensorError, "a StateDictOptions or None")
    return options


def _check_submodules(submodules: Any, func: str) -> set[nn.Module] | None:
    if submodules is None:
        return None
    if not isinstance(submodules, (set, frozenset)) or not all(isinstance(m, nn.Module) for m in submodules):
        _checks.fail(DTensorError, func, "submodules", "a set of torch.nn.Module or None", submodules)
    return set(submodules)


def _check_optimizers(optimizers: Any, func: str) -> tuple[torch.optim.Optimizer, ...]:
    if isinstance(optimizers, torch.optim.Optimizer):
        return (optimizers,)
    if isinstance(optimizers, Iterable) and not isinstance(optimizers, (str, bytes, dict)):
        found = tuple(optimizers)
        if found and all(isinstance(o, torch.optim.Optimizer) for o in found):
            return found
    _checks.fail(DTensorError, func, "optimizers", "a torch.optim.Optimizer or a non-empty list of them", optimizers)


def _check_state_dict(state_dict: Any, func: str, param: str) -> dict[str, Any]:
    if not isinstance(state_dict, dict) or not all(isinstance(k, str) for k in state_dict):
        _checks.fail(
            DTensorError,
            func,
            param,
            "a dict with str keys (what get_model_state_dict / get_optimizer_state_dict returned)",
            state_dict,
        )
    return state_dict


# -- the getters --------------------------------------------------------------------------------
def get_model_state_dict(
    model: nn.Module, *, submodules: set[nn.Module] | None = None, options: StateDictOptions | None = None
) -> dict[str, Any]:
    """torch's ``get_model_state_dict`` with every DTensor as its global xla tensor (:func:`global_tensors`).

    Pass the result to ``torch.distributed.checkpoint.save(...,
    planner=SPMDSavePlanner())``, or, from the model to restore,
    to ``load(..., planner=SPMDLoadPlanner())``, which fills the model's
    parameters in place (the model may be laid out on another mesh shape than
    the one saved). ``StateDictOptions(full_state_dict=True)`` gives replicated
    copies instead (``cpu_offload=True``: CPU copies), which ``load`` does not
    write back into the model: call :func:`set_model_state_dict` after it.

    Args:
        model: the model (``fully_shard``, ``parallelize_module``,
            ``distribute_module`` or plain).
        submodules: torch's (deprecated) option, passed on.
        options: torch's ``StateDictOptions``.

    Returns:
        ``{fqn: tensor}``, the keys torch's function gives.

    Raises:
        DTensorError: a bad argument.

    Example:
        >>> import tempfile, torch
        >>> import torch.distributed.checkpoint as dcp
        >>> from spmdtorch.checkpoint import SPMDLoadPlanner, SPMDSavePlanner
        >>> from spmdtorch.dtensor import fully_shard, get_model_state_dict, init_device_mesh
        >>> mesh = init_device_mesh("xla", (8,), mesh_dim_names=("dp",))
        >>> model = fully_shard(torch.nn.Linear(8, 16), mesh=mesh)
        >>> d = tempfile.mkdtemp()
        >>> _ = dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=d, planner=SPMDSavePlanner())
        >>> fresh = fully_shard(torch.nn.Linear(8, 16), mesh=mesh)
        >>> dcp.load({"model": get_model_state_dict(fresh)}, checkpoint_id=d, planner=SPMDLoadPlanner())
        >>> torch.equal(fresh.weight.full_tensor().cpu(), model.weight.full_tensor().cpu())
        True
    """
    func = "get_model_state_dict"
    model = _check_model(model, func)
    sd = torch_sd.get_model_state_dict(
        model, submodules=_check_submodules(submodules, func), options=_check_options(options, func)
    )
    out: dict[str, Any] = global_tensors(sd)
    return out


def get_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    *,
    submodules: set[nn.Module] | None = None,
    options: StateDictOptions | None = None,
) -> dict[str, Any]:
    """torch's ``get_optimizer_state_dict`` with every DTensor as its global xla tensor (:func:`global_tensors`).

    As torch's, a fresh optimizer's state is made first (one step with zero
    gradients and learning rate 0), so the result of a fresh optimizer over
    the model to restore is a target for ``dcp.load(...,
    planner=SPMDLoadPlanner())``, which fills the state in place in the
    parameters' layouts; :func:`set_optimizer_state_dict` then loads the
    plain values (the step count).

    Args:
        model: the model whose parameters ``optimizers`` update.
        optimizers: a torch optimizer or a list of them.
        submodules: torch's (deprecated) option, passed on.
        options: torch's ``StateDictOptions``.

    Returns:
        ``{"state": {fqn: {name: value}}, "param_groups": [...]}`` as torch's (or
        its flattened form with ``flatten_optimizer_state_dict=True``).

    Raises:
        DTensorError: a bad argument.
    """
    func = "get_optimizer_state_dict"
    model = _check_model(model, func)
    optims = _check_optimizers(optimizers, func)
    osd = torch_sd.get_optimizer_state_dict(
        model,
        optims if len(optims) > 1 else optims[0],
        submodules=_check_submodules(submodules, func),
        options=_check_options(options, func),
    )
    out: dict[str, Any] = global_tensors(osd)
    return out


# -- the setters -----------------------------------------------------------------------------------
def _laid_out_as(value: Any, like: DTensor) -> Any:
    """``value`` (a plain tensor of ``like``'s shape) as a DTensor with ``like``'s mesh and placements."""
    if not isinstance(value, torch.Tensor) or isinstance(value, DTensor):
        return value
    if value is like.to_local():  # filled in place by dcp.load: already the DTensor's own tensor
        return like
    return distribute_tensor(value.detach().to(like.dtype), like.device_mesh, like.placements)


def _setter_options(options: StateDictOptions) -> StateDictOptions:
    # Every value is laid out here already; torch's full-state-dict path would
    # distribute (or broadcast from rank 0) through process groups.
    return dataclasses.replace(options, full_state_dict=False, broadcast_from_rank0=False)


def _shape_error(func: str, key: str, got: Any, want: torch.Tensor) -> StateDictError:
    return StateDictError(
        f"{func}: state dict entry {key!r} has shape {tuple(got.shape)} but the model's has "
        f"{tuple(want.shape)}; the state dict comes from another model (or another configuration of it): "
        "restore into a model built like the one saved"
    )


def set_model_state_dict(
    model: nn.Module, model_state_dict: dict[str, Any], *, options: StateDictOptions | None = None
) -> Any:
    """torch's ``set_model_state_dict``, for a state dict of global tensors (or DTensors, or full CPU tensors).

    Each tensor is laid out as the model's parameter (or buffer) of that key
    is (its mesh and placements) and loaded; an entry that ``dcp.load`` filled
    in place already is the parameter's own tensor and is not copied.
    ``full_state_dict`` and ``broadcast_from_rank0`` are accepted with their
    single-controller meaning: this process holds every value.

    Args:
        model: the model to load into.
        model_state_dict: ``{fqn: tensor}``, as :func:`get_model_state_dict` gives.
        options: torch's ``StateDictOptions`` (``strict`` is read here too).

    Returns:
        torch's ``_IncompatibleKeys`` (missing and unexpected keys, when not strict).

    Raises:
        StateDictError: with ``strict`` (the default), a key the model lacks or
            one the state dict lacks; any entry whose shape is not the model's
            (naming the key and both shapes).
        DTensorError: a bad argument.
    """
    func = "set_model_state_dict"
    model = _check_model(model, func)
    sd = _check_state_dict(model_state_dict, func, "model_state_dict")
    opts = _check_options(options, func)
    current = torch_sd.get_model_state_dict(model, options=dataclasses.replace(opts, full_state_dict=False))
    if opts.strict:
        missing = sorted(set(current) - set(sd))
        unexpected = sorted(set(sd) - set(current))
        if missing or unexpected:
            raise StateDictError(
                f"{func}: model_state_dict does not match the model's keys: missing {missing[:5]}"
                f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                f"{' ...' if len(unexpected) > 5 else ''}; load a state dict of this model, or pass "
                "options=StateDictOptions(strict=False)"
            )
    laid_out: dict[str, Any] = {}
    for key, value in sd.items():
        have = current.get(key)
        if isinstance(have, torch.Tensor) and isinstance(value, torch.Tensor):
            if tuple(value.shape) != tuple(have.shape):
                raise _shape_error(func, key, value, have)
            if isinstance(have, DTensor):
                value = _laid_out_as(value, have)
        laid_out[key] = value
    return torch_sd.set_model_state_dict(model, laid_out, options=_setter_options(opts))


def set_optimizer_state_dict(
    model: nn.Module,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    optim_state_dict: dict[str, Any],
    *,
    options: StateDictOptions | None = None,
) -> None:
    """torch's ``set_optimizer_state_dict``, for a state dict of global tensors (or DTensors).

    Each state tensor shaped like its parameter (AdamW's ``exp_avg``,
    ``exp_avg_sq``) is laid out as that parameter is, so the optimizer keeps
    updating DTensors in their layouts; other values (the step count) are
    loaded as they are.

    Args:
        model: the model whose parameters ``optimizers`` update.
        optimizers: a torch optimizer or a list of them.
        optim_state_dict: as :func:`get_optimizer_state_dict` gives (nested or flattened).
        options: torch's ``StateDictOptions``.

    Raises:
        StateDictError: a state entry for a parameter the model does not have,
            or shaped otherwise than it (naming the key and both shapes).
        DTensorError: a bad argument.
    """
    func = "set_optimizer_state_dict"
    model = _check_model(model, func)
    optims = _check_optimizers(optimizers, func)
    osd = _check_state_dict(optim_state_dict, func, "optim_state_dict")
    opts = _check_options(options, func)
    params = dict(model.named_parameters())

    def lay_out(key: str, fqn: str, value: Any) -> Any:
        p = params.get(fqn)
        if p is None:
            raise StateDictError(
                f"{func}: optim_state_dict has state for {fqn!r} (entry {key!r}), which is not a parameter of "
                f"the model (it has {sorted(params)[:5]}{' ...' if len(params) > 5 else ''}); load the optimizer "
                "state saved with this model"
            )
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return value
        have = next((o.state[p].get(key.rsplit(".", 1)[1]) for o in optims if p in o.state), None)
        if isinstance(have, torch.Tensor) and tuple(have.shape) != tuple(value.shape):
            raise _shape_error(func, key, value, have)
        if tuple(value.shape) != tuple(p.shape):
            return value  # state of its own shape (a factored second moment): as torch loads it
        return _laid_out_as(value, p) if isinstance(p, DTensor) else value

    laid_out = dict(osd)
    if isinstance(osd.get("state"), dict):
        laid_out["state"] = {
            fqn: (
                {name: lay_out(f"state.{fqn}.{name}", fqn, v) for name, v in entry.items()}
                if isinstance(entry, dict)
                else entry
            )
            for fqn, entry in osd["state"].items()
        }
    else:  # flatten_optimizer_state_dict=True: "state.<fqn>.<name>" keys
        for key, value in osd.items():
            if key.startswith("state."):
                fqn = key[len("state.") :].rsplit(".", 1)[0]
                laid_out[key] = lay_out(key, fqn, value)
    torch_sd.set_optimizer_state_dict(
        model, optims if len(optims) > 1 else optims[0], laid_out, options=_setter_options(opts)
    )
