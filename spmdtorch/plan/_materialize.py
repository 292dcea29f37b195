"""Sharded initialisation: turn a model built on ``meta`` into sharded xla tensors.

A model too large for one device (or one host) must never exist in full
anywhere. Build it on the ``meta`` device (shapes only, no data), then
:func:`materialize` gives every parameter and buffer an xla tensor whose data
is still pending, annotates the parameters with their sharding, runs the
model's own initialisation lazily (``reset_parameters()``, or your
``init_fn``) and computes everything in **one** compiled program. GSPMD
propagates each output's sharding back into the random draws, so every
device computes only its own shard; no device and no host holds a full copy
of a sharded parameter.

Values depend only on the seed (``torch.manual_seed``) and the model: the
same seed gives the same parameters on 1, 4 or 8 devices and under any
sharding (JAX's partitionable threefry; each random op is keyed by its place
in recording order, see ``spmdtorch.lazy.graph.Node.draw``). They follow the
distributions of the ``nn.init`` functions the model calls, not the CPU
generator's bit stream.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.sharding import get_sharding_spec
    >>> with torch.device("meta"):
    ...     model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 16))
    >>> mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    >>> model = spmdtorch.materialize(model, mesh, "fsdp")
    >>> get_sharding_spec(model[0].weight)
    '{devices=[8,1]0,1,2,3,4,5,6,7}'
    >>> model[0].weight.device
    device(type='xla', index=0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
from torch import nn

from spmdtorch import _checks
from spmdtorch.fsdp import FSDP_AXIS, param_spec
from spmdtorch.lazy import executor
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import mark_sharding
from spmdtorch.tensor import storage_of
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["MaterializeError", "materialize"]


class MaterializeError(ValueError):
    """A model that :func:`materialize` cannot initialise as asked."""


def _owned(module: nn.Module):
    """``(kind, name, tensor)`` for the module's own (non-recursive) parameters and buffers."""
    for name, p in module._parameters.items():
        if p is not None:
            yield "parameter", name, p
    for name, b in module._buffers.items():
        if b is not None:
            yield "buffer", name, b


def _check_placement(model: nn.Module) -> None:
    bad = [
        f"{mod_name + '.' if mod_name else ''}{name} ({t.device})"
        for mod_name, mod in model.named_modules()
        for _, name, t in _owned(mod)
        if not (t.is_meta or isinstance(t, XlaTensor))
    ]
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise MaterializeError(
            f"materialize expects a model built on the meta device, but {shown} hold real data; "
            "build it with `with torch.device('meta'): model = ...` (or move it with model.to('xla') "
            "and annotate it with mark_sharding instead)"
        )


def _to_pending(model: nn.Module, undo: list) -> dict[int, tuple[str, XlaTensor]]:
    """Replace every meta tensor by an uninitialised (pending) xla tensor; tied tensors stay tied.

    Returns ``id(new tensor) -> (qualified name, new tensor)`` of what was
    replaced; ``undo`` receives ``(table, name, meta tensor)`` to put back.
    """
    made: dict[int, XlaTensor] = {}  # id(meta tensor) -> its replacement
    fresh: dict[int, tuple[str, XlaTensor]] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        for kind, name, t in list(_owned(mod)):
            if not t.is_meta:
                continue
            qual = f"{mod_name}.{name}" if mod_name else name
            new = made.get(id(t))
            if new is None:
                # ``empty`` records a zeros node: nothing is computed until the sync,
                # and the init ops that overwrite it make the zeros dead code.
                # (A Parameter of an xla tensor is an XlaTensor: torch keeps a subclass's type.)
                data = cast(XlaTensor, torch.empty(t.shape, dtype=t.dtype, device="xla"))
                new = (
                    cast(XlaTensor, nn.Parameter(data, requires_grad=t.requires_grad)) if kind == "parameter" else data
                )
                made[id(t)] = new
                fresh[id(new)] = (qual, new)
            table = mod._parameters if kind == "parameter" else mod._buffers
            undo.append((table, name, t))
            table[name] = new
    return fresh


def _annotate(model: nn.Module, mesh, rules) -> None:
    if rules is None:
        return
    if isinstance(rules, str):
        if rules != "fsdp":
            raise MaterializeError(
                f"rules_or_fsdp={rules!r}: give a dict of parameter-name patterns to partition specs "
                "(as for mark_sharding(module, mesh, rules)), the string 'fsdp', or None"
            )
        if FSDP_AXIS not in tuple(mesh.axis_names or ()):
            raise MaterializeError(
                f"rules_or_fsdp='fsdp' shards every parameter on its largest dim over the mesh axis "
                f"'fsdp', but the mesh's axes are {mesh.axis_names!r}; name an axis 'fsdp'"
            )
        for _, p in model.named_parameters():
            if not storage_of(cast(XlaTensor, p)).annotated:  # materialised: every parameter is an xla tensor
                mark_sharding(p, mesh, param_spec(p.shape))
        return
    if not isinstance(rules, Mapping):
        raise MaterializeError(
            f"rules_or_fsdp must be a dict of parameter-name patterns to partition specs, 'fsdp' "
            f"or None, got {type(rules).__name__}"
        )
    mark_sharding(model, mesh, rules)


def _default_init(module: nn.Module) -> None:
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()


def materialize(
    model: nn.Module,
    mesh=None,
    rules_or_fsdp: Mapping[str, Any] | str | None = None,
    *,
    init_fn: Callable[[nn.Module], None] | None = None,
    sync: bool = True,
) -> nn.Module:
    """Initialise a meta-device model as sharded xla tensors, in one compiled program.

    Every meta parameter and buffer becomes an xla tensor (tied tensors stay
    tied), parameters are annotated (``rules_or_fsdp``), then each submodule
    that owns a materialised tensor is initialised, in ``model.modules()``
    order, by ``init_fn(submodule)`` or, without ``init_fn``, its
    ``reset_parameters()``. All of it is recorded lazily and computed by one
    ``spmdtorch.sync()``.

    Args:
        model: a module built on the meta device (``with torch.device("meta"):``).
            Tensors already on xla are kept (and annotated by the rules).
        mesh: a ``spmdtorch.mesh.Mesh``; needed when ``rules_or_fsdp`` is given.
        rules_or_fsdp: a rules dict for ``mark_sharding(model, mesh, rules)``
            (glob patterns of parameter names to partition specs, e.g. from
            ``plan_sharding``), ``"fsdp"`` (FSDPv2's rule: each parameter split
            on its largest dim over the axis ``"fsdp"``), or None (replicated).
        init_fn: ``init_fn(submodule)`` initialises the tensors the submodule
            owns directly (not its children's), in place, e.g. with
            ``torch.nn.init``. Use it for modules without ``reset_parameters``
            (a norm whose weight ``__init__`` fills with ones) and for buffers
            ``__init__`` computes (rotary tables).
        sync: compute the program now (default). False leaves the values
            pending, to inspect the program or fold it into the next one.

    Returns:
        ``model``, now on xla.

    Raises:
        MaterializeError: a tensor holds real data on another device; bad
            ``rules_or_fsdp``; no mesh for the rules; or some materialised
            tensor was not written by the initialisation (named, with the
            module type that should initialise it).
        ShardingError: a rule matches no parameter or has a bad spec.

    Example:
        >>> import numpy as np, torch, spmdtorch
        >>> from spmdtorch.mesh import Mesh
        >>> with torch.device("meta"):
        ...     emb = torch.nn.Embedding(64, 8)
        >>> mesh = Mesh(np.arange(8), (8,), ("tp",))
        >>> emb = spmdtorch.materialize(emb, mesh, {"weight": ("tp", None)})
        >>> [s.data.shape for s in spmdtorch.sharding.local_shards(emb.weight)][0]
        torch.Size([8, 8])
    """
    if not isinstance(model, nn.Module):
        raise MaterializeError(f"materialize expects an nn.Module as model, got {type(model).__name__}")
    if mesh is not None:
        _checks.check_instance(mesh, Mesh, "materialize", "mesh", MaterializeError, "a spmdtorch.mesh.Mesh or None")
    if rules_or_fsdp is not None and not isinstance(rules_or_fsdp, (str, Mapping)):
        _checks.fail(MaterializeError, "materialize", "rules_or_fsdp", "a dict of rules, 'fsdp' or None", rules_or_fsdp)
    if init_fn is not None:
        _checks.check_callable(init_fn, "materialize", "init_fn", MaterializeError)
    sync = _checks.check_bool(sync, "materialize", "sync", MaterializeError)
    if rules_or_fsdp is not None and mesh is None:
        raise MaterializeError(
            "materialize was given sharding rules but no mesh; pass mesh=Mesh(device_ids, shape, axis_names)"
        )
    _check_placement(model)
    undo: list = []
    try:
        fresh = _to_pending(model, undo)
        _annotate(model, mesh, rules_or_fsdp)
        init = init_fn or _default_init
        versions = {key: storage_of(t).version for key, (_, t) in fresh.items()}
        with torch.no_grad():
            for mod in model.modules():
                if any(id(t) in fresh for _, _, t in _owned(mod)):
                    init(mod)
        _check_initialised(model, fresh, versions, init_fn is not None)
    except BaseException:
        # Leave the model as it was (on meta), so that the call can be retried.
        for table, name, t in reversed(undo):
            table[name] = t
        raise
    if sync:
        executor.sync()
    return model


def _check_initialised(model, fresh, versions, custom: bool) -> None:
    """Every materialised tensor must have been written (else it would silently be zeros)."""
    untouched = {key for key, (_, t) in fresh.items() if storage_of(t).version == versions[key]}
    if not untouched:
        return
    owners: dict[str, str] = {}  # qualified name -> owning module's class
    for mod_name, mod in model.named_modules():
        for _, name, t in _owned(mod):
            if id(t) in untouched:
                qual = f"{mod_name}.{name}" if mod_name else name
                owners.setdefault(qual, type(mod).__name__)
    shown = ", ".join(f"{q} (in {cls})" for q, cls in list(owners.items())[:6])
    more = f" and {len(owners) - 6} more" if len(owners) > 6 else ""
    how = (
        "your init_fn did not write them"
        if custom
        else "their modules have no reset_parameters() (values set in __init__ are lost on meta)"
    )
    raise MaterializeError(
        f"materialize left {shown}{more} uninitialised: {how}. Pass init_fn=fn where fn(module) "
        "initialises the tensors a module owns in place (e.g. torch.nn.init.ones_(module.weight), "
        "or module.reset_parameters() for the modules that have it), or give those modules a "
        "reset_parameters() method"
    )
