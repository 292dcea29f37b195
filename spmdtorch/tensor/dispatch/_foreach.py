"""``_foreach_*`` ops: the per-tensor op once per list element, in-place ones recorded as one node.

torch.optim's default (foreach) step on xla tensors reaches here once per
parameter group instead of once per op per parameter
(``spmdtorch.tensor.optim_hooks``); an in-place foreach op over independent
tensors becomes one node (``_paths.inplace_batch``), and so does an
out-of-place one (``_paths.lowering_batch``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch

from spmdtorch.lazy import caches
from spmdtorch.tensor._router import dispatch, special
from spmdtorch.tensor.dispatch._errors import ForeachError
from spmdtorch.tensor.dispatch._paths import decompose, inplace_batch, lowering_batch, write

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op, OpFacts

__all__ = ["foreach"]

aten = torch.ops.aten

# Foreach ops whose per-tensor op has another name (torch's own slow path
# computes ``_foreach_maximum(l, 0.5)`` with ``clamp_min``).
_FOREACH_ALIASES = {"maximum": ("maximum", "clamp_min"), "minimum": ("minimum", "clamp_max")}


def _match_overload(packet: torch._ops.OpOverloadPacket[..., Any], want: list[tuple[str, int]]) -> Op | None:
    """The overload of ``packet`` whose leading argument types are ``want`` (fewest extra defaults)."""
    best: Op | None = None
    for ov in packet.overloads():
        cand: Op = getattr(packet, ov)
        cargs = cand._schema.arguments
        if any(c.kwarg_only and c.alias_info is not None and c.alias_info.is_write for c in cargs):
            continue  # an out= variant
        if len(cargs) < len(want) or any(str(c.type) != w[0] for c, w in zip(cargs, want)):
            continue
        if not all(c.has_default_value() for c in cargs[len(want) :]):
            continue
        if best is None or len(cargs) < len(best._schema.arguments):
            best = cand
    return best


@caches.memoize("tensor.dispatch.foreach_plans", maxsize=1024)
def _foreach_plan(func: Op) -> tuple[Op, tuple[tuple[int, str | None], ...], bool, bool] | None:
    """How ``_foreach_X`` maps onto the per-tensor op ``X``, or None if it cannot.

    The per-tensor overload is found by argument *types* (the names differ:
    ``_foreach_add_.Scalar(self, scalar)`` is ``add_.Scalar(self, other,
    alpha=1)``; ``_foreach_pow.ScalarAndTensor`` is ``pow.Scalar``): each
    ``List[T]`` argument becomes a ``T`` and ``.Tensor`` overloads' ``scalars``
    tensor (one number per list element) becomes a number. An in-place
    foreach op with no in-place per-tensor op (``maximum_``) runs the
    functional one and writes the result back.

    Returns:
        ``(op, specs, inplace, write_back)`` where ``specs[i]`` is
        ``(kind, kwarg)`` for foreach argument ``i``: kind 0 passes it to
        every call, 1 passes element ``j`` of the list, 2 element ``j`` of a
        tensor of scalars; ``kwarg`` is the per-tensor op's keyword for it
        (None: positional).
    """
    schema = func._schema
    if func._schema.name == "aten::_foreach_norm" and func._overloadname == "Scalar":
        # (self, ord=2, dtype=None): torch's slow path is linalg_vector_norm per tensor.
        return aten.linalg_vector_norm.default, ((1, None), (0, None), (0, "dtype")), False, False
    name = schema.name.split("::")[-1][len("_foreach_") :]
    inplace = not schema.returns
    base = name[:-1] if inplace else name
    want: list[tuple[str, int]] = []
    for a in schema.arguments:
        t = str(a.type)
        if t.startswith("List[") and t.endswith("]"):
            want.append((t[5:-1], 1))
        elif t == "Tensor" and a.name == "scalars":
            want.append(("number", 2))
        else:
            want.append((t, 0))
    for write_back in (False, True) if inplace else (False,):
        for pname in _FOREACH_ALIASES.get(base, (base,)):
            packet = getattr(aten, pname + ("_" if inplace and not write_back else ""), None)
            best = None if packet is None else _match_overload(packet, want)
            if best is not None:
                cargs = best._schema.arguments
                specs = tuple((w[1], c.name if c.kwarg_only else None) for w, c in zip(want, cargs))
                return best, specs, inplace, write_back
    return None


@special(prefix="aten::_foreach_")
def foreach(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:  # noqa: C901  (why: the argument plan (lists, scalars, keywords), then the batched or per-element path, inline on the optimizer hot path)
    """``_foreach_X(lists, ...)`` → ``X`` once per list element.

    Each element op goes straight to ``dispatch`` (this already runs below
    autograd), not through the torch dispatcher again: an optimizer's foreach
    step is hundreds of element ops. Ops with no per-tensor twin use torch's
    decomposition.
    """
    plan = _foreach_plan(func)
    if plan is None:
        return decompose(func, args, kwargs)
    op, specs, inplace, write_back = plan
    fargs = facts.arg_names
    given = []  # (kind, kwarg, value) of each argument passed
    n = None
    for i, spec in enumerate(specs):
        if i < len(args):
            v = args[i]
        elif fargs[i] in kwargs:
            v = kwargs[fargs[i]]
        else:
            continue  # left to the per-tensor op's default
        kind = spec[0]
        if kind == 2:
            v = v.tolist()  # a host tensor of scalars (torch's slow path reads them the same way)
        if kind:
            if n is None:
                n = len(v)
            elif len(v) != n:
                raise ForeachError(
                    f"{func}: all tensor and scalar lists must have the same length, got {n} and {len(v)} "
                    f"(argument {fargs[i]!r})"
                )
        given.append((kind, spec[1], v))
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
    if all(kwarg is None for _, kwarg, _ in given):
        # All positional (the optimizers' calls): the element calls are the
        # lists zipped, each with its own empty kwargs (a handler may add to them).
        cols = [v if kind else itertools.repeat(v, n or 0) for kind, _, v in given]
        calls = [(elem, {}) for elem in zip(*cols)] if n else []
    else:
        calls = []
        for j in range(n or 0):
            elem: list[Any] = []
            kw: dict[str, Any] = {}
            for kind, kwarg, v in given:
                e = v[j] if kind else v
                if kwarg is None:
                    elem.append(e)
                else:
                    kw[kwarg] = e
            calls.append((tuple(elem), kw))
    if inplace and not write_back and inplace_batch(op, calls):
        return None
    if not inplace:
        batched = lowering_batch(op, calls)
        if batched is not None:
            return batched
    results = []
    for pos, kwargs_j in calls:
        out = dispatch(op, pos, kwargs_j)
        if write_back:
            write(pos[0], out)
        results.append(out)
    return None if inplace else results
