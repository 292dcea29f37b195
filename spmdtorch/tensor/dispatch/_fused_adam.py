"""``_fused_adam_`` / ``_fused_adamw_``: a whole Adam(W) step over xla tensors recorded as ONE node.

torch.optim's foreach Adam step is eight ``_foreach_*`` ops; each is one node
(``_paths.inplace_batch``) but costs Python work per list element (argument
walk, meta-cache key, storage write): ~100 µs per parameter per step, most of
a lazy step's host time on a deep model. ``spmdtorch.tensor.optim_hooks``
points an eligible Adam/AdamW at torch's fused path (``_fused_adam``), whose
single ATen call reaches :func:`fused_adam` here: it reads each tensor's value
once, records one node computing every parameter's update, and writes each
parameter and moment once.

The node computes, per parameter, the same per-element lowerings in the same
order as the foreach path (``_multi_tensor_adam``, not capturable) with each
intermediate rounded to its tensor's dtype as a node output would be, and
the same Python-float bias corrections from each (CPU) ``step`` tensor, so a
lazy step gives the values the foreach path gives (and eager CPU's within
rounding). Tensors that share a storage (parameters that are views of one
buffer) take the foreach ops instead, element by element as torch orders
them. Calls neither covers (a ``grad_scale`` or ``found_inf``, a tensor
learning rate, complex or non-xla tensors) go to torch's decomposition,
which has none: the router's named ``NotImplementedError`` says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import torch

from spmdtorch.lazy import caches, keys, metrics, record
from spmdtorch.lazy.graph import Slot, interned_scalar
from spmdtorch.ops import registry
from spmdtorch.tensor._router import special
from spmdtorch.tensor._values import assign_value, read_value
from spmdtorch.tensor.dispatch._paths import decompose
from spmdtorch.tensor.xla_tensor import XlaTensor

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op, OpFacts

__all__ = ["fused_adam"]

aten = torch.ops.aten
_DEFAULTS = {"grad_scale": None, "found_inf": None, "amsgrad": False, "maximize": False}
_LIST_ARGS = ("self", "grads", "exp_avgs", "exp_avg_sqs", "max_exp_avg_sqs", "state_steps")


def _low(op: Op) -> Any:
    low = registry.get_lowering(op)
    if low is None:  # the elementwise table always has these; a clear message if a rename drops one
        raise NotImplementedError(f"spmdtorch's fused Adam step needs a lowering for {op}")
    return low.fn


class _AdamUpdate:
    """The node's function: ``(hyper-parameters, then per parameter p, g, m, v[, vmax], step_size, bc2_sqrt)``.

    Returns ``p, m, v[, vmax]`` per parameter. Each op is the lowering the
    foreach path records for it, its result cast to the dtype that op's node
    output has (the executor casts every node output the same way).
    """

    __slots__ = ("amsgrad", "branch", "decoupled", "decay", "maximize", "n")

    def __init__(self, n: int, decoupled: bool, decay: bool, amsgrad: bool, maximize: bool, branch: Any) -> None:
        self.n, self.decoupled, self.decay, self.amsgrad, self.maximize = n, decoupled, decay, amsgrad, maximize
        self.branch = branch

    def __call__(self, *vals: Any) -> list[Any]:
        mul, add, lerp = _low(aten.mul.Tensor), _low(aten.add.Tensor), _low(aten.lerp.Scalar)
        addcmul, addcdiv, sqrt = _low(aten.addcmul.default), _low(aten.addcdiv.default), _low(aten.sqrt.default)
        div, neg, maximum = _low(aten.div.Tensor), _low(aten.neg.default), _low(aten.maximum.default)
        wd, w1, b2, one_minus_b2, eps = vals[:_N_HYPER]
        lerp_kw = {} if self.branch is None else {"branch": self.branch}
        outs: list[Any] = []
        k = _N_HYPER
        per = 7 if self.amsgrad else 6
        for _ in range(self.n):
            p, g, m, v = vals[k : k + 4]
            vmax = vals[k + 4] if self.amsgrad else None
            step_size, bc2_sqrt = vals[k + per - 2], vals[k + per - 1]
            k += per
            if self.maximize:
                g = _as(neg(g), g)
            if self.decay:
                if self.decoupled:
                    p = _as(mul(p, wd), p)  # wd here is 1 - lr * weight_decay
                else:
                    g = _as(add(g, p, alpha=wd), g)
            m = _as(lerp(m, g, w1, **lerp_kw), m)
            v = _as(mul(v, b2), v)
            v = _as(addcmul(v, g, g, value=one_minus_b2), v)
            if vmax is not None:
                vmax = _as(maximum(vmax, v), vmax)
                denom = _as(sqrt(vmax), vmax)
            else:
                denom = _as(sqrt(v), v)
            denom = _as(div(denom, bc2_sqrt), denom)
            denom = _as(add(denom, eps), denom)
            p = _as(addcdiv(p, m, denom, value=step_size), p)
            outs += (p, m, v) if vmax is None else (p, m, v, vmax)
        return outs


_N_HYPER = 5  # wd (or 1 - lr * wd), 1 - beta1, beta2, 1 - beta2, eps


def _as(x: Any, like: Any) -> Any:
    """``x`` in ``like``'s dtype (a node output's rounding)."""
    x = jnp.asarray(x)
    return x if x.dtype == like.dtype else x.astype(like.dtype)


@caches.memoize("tensor.dispatch.fused_adam_nodes", maxsize=256)
def _node_kind(n_inputs: int, name: tuple[Any, ...]) -> tuple[tuple[tuple[Slot, ...], tuple[()]], int]:
    """The template (every input a slot) and the node signature of one fused step's node."""
    template = (tuple(Slot(i) for i in range(n_inputs)), ())
    return template, keys.node_sig(name, template)


def _arguments(facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    named = dict(_DEFAULTS)
    named.update(zip(facts.arg_names, args))
    named.update(kwargs)
    return named


def _value(t: XlaTensor) -> Any:
    st = t._st
    return st.value if not t._chain and st.logical_shape is None else read_value(t)


def _foreach_step(a: dict[str, Any], decoupled: bool) -> None:
    """The same step as torch's foreach ops on the lists (the path for tensors that share storage)."""
    params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = (a[k] for k in _LIST_ARGS)
    lr, beta1, beta2, weight_decay, eps = a["lr"], a["beta1"], a["beta2"], a["weight_decay"], a["eps"]
    if a["maximize"]:
        grads = torch._foreach_neg(grads)
    if weight_decay != 0:
        if decoupled:
            torch._foreach_mul_(params, 1 - lr * weight_decay)
        else:
            grads = torch._foreach_add(grads, params, alpha=weight_decay)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    counts = [s.item() for s in steps]
    if a["amsgrad"]:
        torch._foreach_maximum_(max_sqs, exp_avg_sqs)
        denom = torch._foreach_sqrt(max_sqs)
    else:
        denom = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denom, [(1 - beta2**c) ** 0.5 for c in counts])
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(params, exp_avgs, denom, [(lr / (1 - beta1**c)) * -1 for c in counts])


@special("_fused_adam_", "_fused_adamw_")
def fused_adam(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """Record torch's fused Adam(W) step over xla tensor lists as one node (see the module docstring)."""
    a = _arguments(facts, args, kwargs)
    params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps = (a[k] for k in _LIST_ARGS)
    amsgrad, maximize = bool(a["amsgrad"]), bool(a["maximize"])
    lr, beta1, beta2, weight_decay, eps = a["lr"], a["beta1"], a["beta2"], a["weight_decay"], a["eps"]
    n = len(params)
    lists = [params, grads, exp_avgs, exp_avg_sqs] + ([max_sqs] if amsgrad else [])
    if (
        a["grad_scale"] is not None
        or a["found_inf"] is not None
        or not all(type(x) is float or type(x) is int for x in (lr, beta1, beta2, weight_decay, eps))
        or any(len(lst) != n for lst in [*lists, steps])
        or not all(isinstance(t, XlaTensor) for lst in lists for t in lst)
        or not all(isinstance(s, torch.Tensor) and s.numel() == 1 for s in steps)
    ):
        return decompose(func, args, kwargs)
    written = {id(t._st) for lst in lists[:1] + lists[2:] for t in lst}
    if len(written) != n * (len(lists) - 1) or any(id(g._st) in written for g in grads):
        # Tensors sharing a storage (parameters that are views of one buffer): one node would write
        # each storage once; the foreach ops, each element in turn, give torch's order.
        return _foreach_step(a, func._schema.name == "aten::_fused_adamw_")
    if n == 0:
        return None
    for t in params:
        if not t._mk.dtype.is_floating_point:
            return decompose(func, args, kwargs)
    decoupled = func._schema.name == "aten::_fused_adamw_"
    decay = weight_decay != 0
    w1 = 1 - beta1
    branch_fn = registry.get_branch(aten.lerp.Scalar)
    branch = None if branch_fn is None else branch_fn(None, None, w1)
    ctx = id(func)
    inputs: list[Any] = [
        interned_scalar((1 - lr * weight_decay) if decoupled else weight_decay, (ctx, "wd")),
        interned_scalar(w1, (ctx, "w1")),
        interned_scalar(beta2, (ctx, "b2")),
        interned_scalar(1 - beta2, (ctx, "1-b2")),
        interned_scalar(eps, (ctx, "eps")),
    ]
    last_step: float | None = None
    corrections: tuple[Any, ...] = ()
    avals: list[tuple[tuple[int, ...], Any]] = []  # each written tensor's value keeps its shape and dtype
    for i in range(n):
        pv, mv, vv = _value(params[i]), _value(exp_avgs[i]), _value(exp_avg_sqs[i])
        inputs += (pv, _value(grads[i]), mv, vv)
        avals += ((tuple(pv.shape), pv.dtype), (tuple(mv.shape), mv.dtype), (tuple(vv.shape), vv.dtype))
        if amsgrad:
            xv = _value(max_sqs[i])
            inputs.append(xv)
            avals.append((tuple(xv.shape), xv.dtype))
        # torch's non-capturable foreach step: Python-float bias corrections from the step count
        # (a CPU tensor; an xla one, as Dynamo leaves it when it traced the optimizer, is read as there).
        step = steps[i].item()
        if step != last_step:  # the parameters of a group usually share one count: compute the pair once
            last_step = step
            corrections = (
                interned_scalar((lr / (1 - beta1**step)) * -1, (ctx, "step_size")),
                interned_scalar((1 - beta2**step) ** 0.5, (ctx, "bc2_sqrt")),
            )
        inputs += corrections
    name = ("spmdtorch.fused_adam", decoupled, decay, amsgrad, maximize, branch, n)
    template, sig = _node_kind(len(inputs), name)
    refs = record(_AdamUpdate(n, decoupled, decay, amsgrad, maximize, branch), name, template, inputs, avals, sig=sig)
    if len(avals) == 1:
        refs = [refs]
    metrics.inc("FusedOptimizerSteps")
    it = iter(refs)
    for i in range(n):
        for t in (params[i], exp_avgs[i], exp_avg_sqs[i]) + ((max_sqs[i],) if amsgrad else ()):
            assign_value(t, next(it))
    return None
