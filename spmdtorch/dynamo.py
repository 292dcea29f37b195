"""``torch.compile(fn, backend="spmdtorch")``: TorchDynamo graphs over xla tensors.

TorchDynamo captures a function's tensor operations as an FX graph (guarding
the Python state it depends on) and hands the graph to a *backend*. This
backend runs the captured graph's operations on the real xla tensors through
spmdtorch's lazy engine, so the whole graph becomes one recorded program,
and then computes it (``spmdtorch.sync()``) before returning, as PyTorch/XLA's
``openxla`` backend executes each graph at the call. Consequences:

* shardings of the inputs (``mark_sharding``, FSDPv2 parameters) are honoured,
  outputs keep the shardings the program gives them, and
  ``spmdtorch.sharding.mark_sharding`` called inside the compiled function is
  recorded in the graph (as ``torch.ops.spmdtorch.mark_sharding_``) and
  applied when the graph runs;
* gradients flow as in eager: the graph's ops run under autograd on the real
  tensors (no AOTAutograd), so ``loss.backward()`` after a compiled forward
  records the backward lazily, computed at the next sync;
* a graph break runs the Python between graphs lazily, as plain lazy mode;
* Dynamo re-traces only when a guard fails (new shapes, dtypes, Python
  state); a new input sharding does not re-trace, the engine compiles one
  more XLA program for it (cached by the engine like any lazy step).

* ``dynamic=True`` (or Dynamo's automatic dynamic shapes) keeps one graph
  for every size; the engine compiles one XLA program per concrete shape;
* ``functorch``'s ``aot_function`` over xla tensors works too: annotations
  become ``torch.ops.spmdtorch.sharded_copy`` in its forward and backward graphs.

Not yet: the program is re-recorded op by op on every call (the engine's
program cache avoids the XLA compile, not the Python recording, so a compiled
call is not faster than lazy mode), and an explicit ``device="xla"`` or
``.to("xla")`` inside the compiled function fails in Dynamo's tracing with
torch's "Tensor device mismatch" (move inputs to xla before the call; create
tensors with ``device=x.device``).

How Dynamo sees an xla tensor: its fake stand-in is a ``meta`` tensor
(``XlaTensor.__tensor_unflatten__``), since torch has no device guard for
"xla" without torch_xla and autograd needs one. The backend therefore maps
the ``meta`` device that Dynamo recorded for tensors created inside the
graph back to ``xla:0``.

Example:
    >>> import torch, spmdtorch
    >>> lin = torch.nn.Linear(4, 2).to("xla")
    >>> fast = torch.compile(lin, backend="spmdtorch")
    >>> fast(torch.ones(3, 4, device="xla")).shape
    torch.Size([3, 2])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from spmdtorch._step import sync
from spmdtorch.lazy import metrics
from spmdtorch.tensor.xla_tensor import XLA_DEVICE, XlaTensor

__all__ = ["backend"]

_META = torch.device("meta")


def _to_xla_device(arg: Any) -> Any:
    """``arg`` with the ``meta`` device (Dynamo's stand-in for xla) replaced by ``xla:0``."""
    if isinstance(arg, torch.device) and arg == _META:
        return XLA_DEVICE
    if isinstance(arg, str) and arg == "meta":
        return "xla"
    return arg


def _retarget_devices(gm: torch.fx.GraphModule) -> None:
    """Point factory calls and ``.to(device)`` in ``gm`` that Dynamo recorded on ``meta`` at ``xla:0``."""
    changed = False
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method"):
            continue
        args = pytree.tree_map(_to_xla_device, node.args)
        kwargs = pytree.tree_map(_to_xla_device, node.kwargs)
        if args != node.args or kwargs != node.kwargs:
            node.args, node.kwargs = args, kwargs
            changed = True
    if changed:
        gm.recompile()


def _has_xla(values: Sequence[Any]) -> bool:
    return any(isinstance(v, XlaTensor) for v in pytree.tree_leaves(list(values)))


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """The TorchDynamo backend ``"spmdtorch"``: run the captured graph as one lazy program.

    Registered with TorchDynamo under the name ``"spmdtorch"`` (the
    ``torch_dynamo_backends`` entry point), so ``torch.compile(fn,
    backend="spmdtorch")`` finds it without importing anything first.

    Args:
        gm: the FX graph TorchDynamo captured (one per graph break).
        example_inputs: the graph's inputs for this first call.

    Returns:
        A callable taking the graph's inputs: it records the graph's ops on
        xla tensors, computes them in one program and returns the outputs
        (sharded as the program left them). A graph without xla tensors runs
        as plain torch.
    """
    metrics.inc("DynamoGraphs")
    on_xla = _has_xla(example_inputs)
    if on_xla:
        _retarget_devices(gm)

    def run(*args: Any) -> Any:
        out = gm(*args)
        if on_xla or _has_xla(args):
            # One program per graph, computed now (as PyTorch/XLA's dynamo
            # bridge does): the next graph, or the Python after a break,
            # starts from concrete values.
            sync()
        return out

    return run
