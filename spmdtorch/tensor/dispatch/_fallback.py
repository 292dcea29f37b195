"""Data-dependent ops: materialise, run on CPU, carry on (step 1 of the router).

Ops whose output *shape* depends on the data (``nonzero``, ``unique``,
boolean-mask indexing) cannot be recorded as a node with static shapes: like
PyTorch/XLA, they run on CPU copies of their arguments, and the results come
back as new xla tensors, whose upload waits for their first use (as
``t.to("xla")``'s: ``spmdtorch.tensor.transfer``). Each such call is a sync
(and raises inside ``spmdtorch.compile``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from spmdtorch.lazy import contract, metrics
from spmdtorch.tensor._router import dispatch, special
from spmdtorch.tensor._values import to_cpu
from spmdtorch.tensor.dispatch._paths import dispatch_lowering, dispatch_mutation
from spmdtorch.tensor.dispatch._special import copy_
from spmdtorch.tensor.xla_tensor import XLA_DEVICE, XlaTensor, from_host

if TYPE_CHECKING:
    from spmdtorch.tensor._facts import Op, OpFacts

aten = torch.ops.aten

__all__ = ["cpu_fallback"]

_INDEX_OPS = ("index.Tensor", "index_put.default", "index_put_.default", "_index_put_impl_.default")


@special(
    "nonzero",
    "nonzero_numpy",
    "masked_select",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "unique_dim_consecutive",
    "repeat_interleave.Tensor",
    "nonzero_static",
    # histograms: bin edges and counts come from a data pass; the CPU
    # kernels are what torch_xla falls back to as well
    "histogram",
    "_histogramdd_bin_edges",
    "_histogramdd_from_bin_cts",
    "_histogramdd_from_bin_tensors",
    # no meta kernel in torch, so no output shapes to record a node with
    "geqrf",
    "linalg_lstsq",
)
def cpu_fallback(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """Run ``func`` on CPU copies and bring the results back (data-dependent shapes).

    Counted as ``aten::<op>`` in the metrics, like PyTorch/XLA's CPU fallback.
    """
    contract.check_not_tracing(f"runs the data-dependent op {func}")
    metrics.inc(f"aten::{func._schema.name.split('::')[-1]}")

    def cpu(a: Any) -> Any:
        if isinstance(a, XlaTensor):
            return to_cpu(a)
        if isinstance(a, (list, tuple)):
            return type(a)(cpu(x) for x in a)
        return a

    cpu_args = [cpu(a) for a in args]
    cpu_kwargs = {k: cpu(v) for k, v in kwargs.items()}
    if "device" in cpu_kwargs and cpu_kwargs["device"] is not None:
        cpu_kwargs["device"] = torch.device("cpu")
    out = func(*cpu_args, **cpu_kwargs)
    # Mutated arguments: write the CPU result back into the xla tensor.
    for i in facts.mutable_pos:
        orig = args[i] if i < len(args) else kwargs.get(facts.arg_names[i])
        new = cpu_args[i] if i < len(args) else cpu_kwargs.get(facts.arg_names[i])
        if isinstance(orig, XlaTensor):
            copy_(None, (orig, new), {})

    def back(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            for i in facts.mutable_pos:
                if i < len(args) and o is cpu_args[i]:
                    return args[i]
            # Kept on the host until first needed, as PyTorch/XLA keeps a
            # fallback's result (tensor/transfer.py: deferred upload).
            return from_host(o)
        if isinstance(o, (list, tuple)):
            return type(o)(back(x) for x in o)
        return o

    return back(out)


@special(*_INDEX_OPS)
def _dispatch_index(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """index/index_put: boolean masks make the shape data-dependent."""
    if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ())):
        return cpu_fallback(func, args, kwargs, facts)
    if facts.mutable_pos and facts.lowering is None:
        return dispatch_mutation(func, args, kwargs, facts)
    return dispatch_lowering(func, args, kwargs, facts)


@special("bincount.default")
def _bincount(func: Op, args: tuple[Any, ...], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    """``bincount`` on the device: only its length comes from the data.

    The output length is ``max(self.max() + 1, minlength)``, so the extrema
    are read on the host (one small transfer, and a sync, like PyTorch/XLA);
    the counts are one ``index_add`` on the device, the input never leaves it.
    """
    names = facts.arg_names
    bound = dict(zip(names, args))
    bound.update(kwargs)
    x, weights, minlength = bound["self"], bound.get("weights"), bound.get("minlength", 0)
    if not isinstance(x, XlaTensor) or x.dim() != 1 or x.dtype.is_floating_point or x.dtype == torch.bool:
        raise RuntimeError(
            f"bincount only supports 1-d non-negative integral inputs; got a {x.dim()}-d {x.dtype} tensor"
        )
    if weights is not None and tuple(weights.shape) != tuple(x.shape):
        raise RuntimeError(
            f"weights should be 1-d and have the same length as input; got {tuple(weights.shape)} for input "
            f"{tuple(x.shape)}"
        )
    if minlength < 0:
        raise RuntimeError(f"minlength should be >= 0, got {minlength}")
    contract.check_not_tracing(f"runs bincount, whose output length depends on the data ({func})")
    metrics.inc("aten::bincount")
    length = minlength
    if x.numel():
        lo, hi = to_cpu(dispatch(aten.stack.default, (list(dispatch(aten.aminmax.default, (x,), {})),), {})).tolist()
        if lo < 0:
            raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs; the input holds {lo}")
        length = max(length, hi + 1)
    # torch's dtype rule: the count type without weights, else the weights'
    # floating type (double for integer weights).
    probe = torch.zeros(1, dtype=torch.long)
    dtype = torch.bincount(probe, None if weights is None else torch.zeros(1, dtype=weights.dtype)).dtype
    out = dispatch(aten.zeros.default, ([length],), {"dtype": dtype, "device": XLA_DEVICE})
    if x.numel() == 0:
        return out
    src = (
        dispatch(aten.ones.default, ([x.shape[0]],), {"dtype": dtype, "device": XLA_DEVICE})
        if weights is None
        else dispatch(aten._to_copy.default, (weights,), {"dtype": dtype})
    )
    return dispatch(aten.index_add.default, (out, 0, x, src), {})
