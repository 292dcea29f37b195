"""``plan_sharding``: propose ``mark_sharding`` rules for a model from its structure.

Strategies (mesh axis names are arguments; the defaults are ``"fsdp"`` and
``"tp"``):

* ``"fsdp"``: every parameter split on its largest dim over ``fsdp_axis``
  (FSDPv2's rule).
* ``"tp"``: Megatron-style tensor parallelism over ``tp_axis``. Inside each
  module, its ``nn.Linear`` children are paired: those that read the module's
  input width ``d`` are *column*-parallel (weight dim 0, the output features,
  split; their bias too), the one that writes back to width ``d`` is
  *row*-parallel (weight dim 1 split), so each pair needs one all-reduce.
  Embedding tables and output heads (a Linear whose ``out_features`` is an
  embedding's vocabulary size) are split on the vocabulary. Everything else
  is replicated.
* ``"fsdp+tp"``: the ``"tp"`` split, and the other dim of each weight over
  ``fsdp_axis``; parameters ``"tp"`` leaves alone get the ``"fsdp"`` rule.
* ``"ep"``: expert parallelism over ``ep_axis``: *stacked expert weights*
  (a module holding 3-d parameters with one leading size ``E``, the experts,
  as Hugging Face's MoE expert modules do: ``gate_up_proj (E, 2I, H)``,
  ``down_proj (E, H, I)``, and their ``(E, n)`` biases) are split on the
  expert dim; everything else is replicated.
* ``"fsdp+ep"``: the ``"ep"`` split plus the largest other dim of each
  expert weight over ``fsdp_axis``; every other parameter gets the
  ``"fsdp"`` rule.

Pairs are found from shapes and registration order, not names: ``d`` is the
most common ``in_features`` of the module's Linear children; a Linear with
``in_features == d`` is a column; one with ``out_features == d`` whose
``in_features`` is a column's ``out_features`` is a row (when every Linear
reads ``d``, as in attention, the last registered one that writes ``d`` is
the row). Two consecutive Linears ``a -> b -> c`` with no ``d`` pattern are
paired as column then row. Wrong guesses cost speed, never correctness: GSPMD
makes any sharding compute the same values.

Example:
    >>> import numpy as np, torch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.plan import plan_sharding
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    >>> plan = plan_sharding(mlp, Mesh(np.arange(8), (8,), ("tp",)), "tp")
    >>> dict(plan.rules)
    {'0.weight': ('tp', None), '0.bias': ('tp',), '2.weight': (None, 'tp'), '2.bias': (None,)}
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import itertools
import re
import types
from collections.abc import Mapping

from torch import nn

from spmdtorch import _checks
from spmdtorch.mesh import Mesh
from spmdtorch.plan._memory import MemoryPlan, memory_plan

__all__ = ["PlanError", "ShardingPlan", "plan_sharding"]

STRATEGIES = ("fsdp", "tp", "fsdp+tp", "ep", "fsdp+ep")


class PlanError(ValueError):
    """``plan_sharding`` cannot plan as asked (unknown strategy, missing mesh axis)."""


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Proposed rules for ``mark_sharding(model, mesh, rules)`` and what they cost.

    Attributes:
        strategy: one of ``STRATEGIES``.
        rules: read-only mapping of parameter-name globs to partition specs;
            ``dict(plan.rules)`` gives an editable copy.
        roles: parameter name -> why it got its spec: ``"column"``, ``"row"``,
            ``"vocab"`` (embedding or output head), ``"expert"`` (stacked
            expert weights), ``"fsdp"`` or ``"replicated"``.
        memory: the :class:`~spmdtorch.plan.MemoryPlan` of the
            model under these rules.
    """

    strategy: str
    rules: Mapping
    roles: Mapping
    memory: MemoryPlan

    def __str__(self) -> str:
        width = max((len(k) for k in self.rules), default=0)
        lines = [f"{self.strategy} rules:"]
        lines += [f"  {k:<{width}}  {v}" for k, v in self.rules.items()]
        return "\n".join(lines) + "\n" + str(self.memory)


def _linear_roles(model: nn.Module) -> dict[int, str]:
    """``id(nn.Linear) -> "column" | "row"`` from each module's Linear children."""
    roles: dict[int, str] = {}
    for module in model.modules():
        lins = [m for m in module.children() if isinstance(m, nn.Linear)]
        if len(lins) < 2:
            continue
        counts = collections.Counter(m.in_features for m in lins)
        top = max(counts.values())
        d = next(m.in_features for m in lins if counts[m.in_features] == top)  # ties: the first
        cols = [m for m in lins if m.in_features == d]
        col_outs = {m.out_features for m in cols}
        rows = [m for m in lins if m.in_features != d and m.out_features == d and m.in_features in col_outs]
        if not rows:
            # Every Linear reads d (attention: q, k, v, o): the last one writing d is the row.
            back = [m for m in cols if m.out_features == d]
            if back and len(cols) > 1 and back[-1].in_features in {m.out_features for m in cols if m is not back[-1]}:
                rows = [back[-1]]
                cols = [m for m in cols if m is not back[-1]]
        if rows:
            for m in cols:
                roles.setdefault(id(m), "column")
            for m in rows:
                roles.setdefault(id(m), "row")
            continue
        for a, b in itertools.pairwise(lins):  # a chain a -> b: column then row
            if b.in_features == a.out_features and id(a) not in roles and id(b) not in roles:
                roles[id(a)], roles[id(b)] = "column", "row"
    return roles


def _module_roles(model: nn.Module) -> dict[str, tuple[str, str]]:
    """Parameter name -> (role, which parameter of its module: "weight"/"bias"/other)."""
    vocab = {m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)}
    lin_roles = _linear_roles(model)
    owner = {}
    for _mod_name, mod in model.named_modules():
        experts = _expert_count(mod)
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in owner:
                continue
            role = "other"
            if experts is not None and p.dim() >= 2 and p.shape[0] == experts:
                role = "expert"
            elif isinstance(mod, nn.Embedding) and pname == "weight":
                role = "vocab"
            elif isinstance(mod, nn.Linear):
                role = lin_roles.get(id(mod)) or ("vocab" if mod.out_features in vocab else "other")
            owner[id(p)] = (role, pname)
    return {name: owner[id(p)] for name, p in model.named_parameters()}


def _expert_count(mod: nn.Module) -> int | None:
    """``E`` when ``mod``'s own 3-d parameters are stacked expert weights (all lead with ``E`` > 1)."""
    leads = {p.shape[0] for p in mod.parameters(recurse=False) if p.dim() == 3}
    if len(leads) == 1 and not isinstance(mod, (nn.Linear, nn.Embedding)):
        (e,) = leads
        return e if e > 1 else None
    return None


def _largest_dim_spec(shape, axis) -> tuple:
    spec = [None] * len(shape)
    if spec:
        spec[list(shape).index(max(shape))] = axis
    return tuple(spec)


def _spec(role, pname, shape, strategy, fsdp, tp, ep) -> tuple[tuple, str]:
    ndim = len(shape)
    use_tp = strategy in ("tp", "fsdp+tp")
    use_fsdp = strategy in ("fsdp", "fsdp+tp", "fsdp+ep")
    if strategy in ("ep", "fsdp+ep") and role == "expert":
        rest = (None,) * (ndim - 1)
        if use_fsdp and ndim > 1:
            rest = _largest_dim_spec(shape[1:], fsdp)
        return (ep, *rest), "expert"
    if use_tp and role in ("column", "row", "vocab") and ndim in (1, 2):
        if ndim == 2 and pname == "weight":
            tp_dim = 1 if role == "row" else 0
            spec = [None, None]
            spec[tp_dim] = tp
            if use_fsdp:
                spec[1 - tp_dim] = fsdp
            return tuple(spec), role
        if ndim == 1 and pname == "bias" and role != "row":
            return (tp,), role
    if use_fsdp and ndim:
        return _largest_dim_spec(shape, fsdp), "fsdp"
    return (None,) * ndim, "replicated"


_INDEX = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def _escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _compact(specs: dict[str, tuple]) -> dict[str, tuple]:
    """Collapse ``layers.0.x``, ``layers.1.x``... into ``layers.*.x`` when they share a spec.

    A glob is kept only if it matches exactly its group (``*`` also matches
    dots, so ``a.*.w`` could reach deeper names); otherwise names stay exact.
    """
    groups: dict[str, list[str]] = {}
    for name in specs:
        groups.setdefault(_INDEX.sub("*", _escape(name)), []).append(name)
    names = list(specs)
    collapse = {
        pattern
        for pattern, members in groups.items()
        if len(members) > 1
        and len({specs[m] for m in members}) == 1
        and set(fnmatch.filter(names, pattern)) == set(members)
    }
    out: dict[str, tuple] = {}
    for name in names:  # in parameter order, each glob where its first member is
        pattern = _INDEX.sub("*", _escape(name))
        if pattern in collapse:
            out.setdefault(pattern, specs[name])
        else:
            out[_escape(name)] = specs[name]
    return out


def plan_sharding(
    model: nn.Module,
    mesh,
    strategy: str = "fsdp",
    *,
    fsdp_axis: str = "fsdp",
    tp_axis: str = "tp",
    ep_axis: str = "ep",
    optimizer=None,
) -> ShardingPlan:
    """Propose sharding rules for ``model`` on ``mesh`` and plan their memory.

    Works on a model on any device, ``meta`` included (nothing is allocated):
    plan, edit, then ``materialize(model, mesh, rules)`` or
    ``mark_sharding(model, mesh, rules)``.

    Args:
        model: the module.
        mesh: a ``spmdtorch.mesh.Mesh`` with the axes the strategy uses.
        strategy: ``"fsdp"``, ``"tp"``, ``"fsdp+tp"``, ``"ep"`` or ``"fsdp+ep"``
            (see the module docs).
        fsdp_axis: the mesh axis for FSDP sharding.
        tp_axis: the mesh axis for tensor parallelism.
        ep_axis: the mesh axis for expert parallelism.
        optimizer: passed to :func:`~spmdtorch.plan.memory_plan` for the
            optimizer-state estimate (an optimizer or a name like ``"adamw"``).

    Returns:
        A :class:`ShardingPlan` (``rules``, ``roles``, ``memory``).

    Raises:
        PlanError: unknown strategy, or the mesh lacks an axis it needs.

    Example:
        >>> import numpy as np, torch
        >>> from spmdtorch.mesh import Mesh
        >>> from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM
        >>> from spmdtorch.plan import plan_sharding
        >>> with torch.device("meta"):
        ...     model = LlamaForCausalLM(LlamaConfig.tiny())
        >>> plan = plan_sharding(model, Mesh(np.arange(8), (2, 4), ("fsdp", "tp")), "fsdp+tp")
        >>> plan.rules["layers.*.attention.wo.weight"], plan.roles["layers.0.attention.wo.weight"]
        (('fsdp', 'tp'), 'row')
    """
    if strategy not in STRATEGIES:
        raise PlanError(f"strategy={strategy!r} is not one of {STRATEGIES}")
    if not isinstance(model, nn.Module):
        raise PlanError(f"plan_sharding expects an nn.Module as model, got {type(model).__name__}")
    _checks.check_instance(mesh, Mesh, "plan_sharding", "mesh", PlanError, "a spmdtorch.mesh.Mesh")
    _checks.check_str(fsdp_axis, "plan_sharding", "fsdp_axis", PlanError, nonempty=True)
    _checks.check_str(tp_axis, "plan_sharding", "tp_axis", PlanError, nonempty=True)
    _checks.check_str(ep_axis, "plan_sharding", "ep_axis", PlanError, nonempty=True)
    axes = tuple(getattr(mesh, "axis_names", None) or ())
    needed = {
        "fsdp": [fsdp_axis],
        "tp": [tp_axis],
        "fsdp+tp": [fsdp_axis, tp_axis],
        "ep": [ep_axis],
        "fsdp+ep": [fsdp_axis, ep_axis],
    }[strategy]
    missing = [a for a in needed if a not in axes]
    if missing:
        raise PlanError(
            f"strategy {strategy!r} shards over the mesh axes {needed}, but the mesh's axes are {axes!r}; "
            f"name them so (e.g. Mesh(ids, shape, {tuple(needed)!r})) or pass fsdp_axis=/tp_axis=/ep_axis="
        )
    specs: dict[str, tuple] = {}
    roles: dict[str, str] = {}
    for name, (role, pname) in _module_roles(model).items():
        shape = tuple(model.get_parameter(name).shape)
        specs[name], roles[name] = _spec(role, pname, shape, strategy, fsdp_axis, tp_axis, ep_axis)
    rules = _compact(specs)
    memory = memory_plan(model, mesh, rules=rules, optimizer=optimizer)
    return ShardingPlan(
        strategy=strategy,
        rules=types.MappingProxyType(rules),
        roles=types.MappingProxyType(roles),
        memory=memory,
    )
