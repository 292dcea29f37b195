"""One way to start a backward pass from tensor subclasses' own graph positions (their gradient edges).

``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad``
dispatch on their tensors, so a tensor subclass's torch-function handler sees
them: ``XlaTensor``'s (``device_mode``, which runs with subclass
torch-function handling off) and ``XlaDTensor``'s (``spmdtorch.dtensor``,
which would otherwise take each DTensor through a new unwrapping node).
Both start the engine here, from the tensors' gradient edges, with the
handling on:

* the edges are looked up with subclass handling off, so they are the
  tensors' own nodes (a DTensor's handler would answer with a node of its
  global tensor, which ``inputs=`` names uselessly: nothing depends on it);
* the engine then runs with the handling on, as the forward ran: a
  non-reentrant checkpoint's recomputation runs inside it and must record
  the same ops on the same tensor types as the forward did. Calling the
  function again with the handling on would come back to the handler; its
  edges are no tensors, so the engine does not.

Seed rule: a root's gradient is the one given, or, for a root of one
floating-point element without one, ``ones_like(root)`` made in the
caller's torch-function state (a DTensor root gets a DTensor of ones); the
caller's ``seed_for(root, grad)`` then adapts each (a DTensor root takes a
DTensor gradient).

Non-leaf policy: ``backward(inputs=...)`` fills the ``.grad`` of every input,
leaf or not, as torch does: torch's engine calls ``retain_grad()`` on each
tensor input (so a non-leaf's ``retains_grad`` stays True afterwards, as in
torch), which an edge cannot do, so this module calls it on the non-leaf
ones before starting the engine from the edges; leaves accumulate through
their own ``AccumulateGrad`` nodes (their hooks run).

Forms an edge cannot express (``grad_variables``, batched grads, a root that
does not require grad, an implicit gradient of a non-scalar, an empty or
non-tensor ``inputs``, ``grad`` without ``inputs``) are not handled: the
caller runs them as an ordinary call, where torch raises its own error for
most of them.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["BACKWARD_FUNCS", "BACKWARD_NOT_HANDLED", "run_backward"]

# Each backward entry point -> the names of its parameters that hold the roots, their gradients and the inputs.
_ARGS: dict[Any, tuple[str, str, str]] = {
    torch.Tensor.backward: ("self", "gradient", "inputs"),
    torch.autograd.backward: ("tensors", "grad_tensors", "inputs"),
    torch.autograd.grad: ("outputs", "grad_outputs", "inputs"),
}
_SIGNATURES = {f: inspect.signature(f) for f in _ARGS}

#: The functions :func:`run_backward` runs.
BACKWARD_FUNCS = frozenset(_ARGS)

#: :func:`run_backward`'s answer for a call it leaves to the caller's ordinary path.
BACKWARD_NOT_HANDLED: Any = object()


def _tensor_list(x: Any) -> list[Any] | None:
    """A backward argument's tensors as a list (None if not given); a form left to torch (a dict) as ``[...]``."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        return [x]
    return list(x) if isinstance(x, (list, tuple)) else [...]


def _all_require_grad(ts: list[Any]) -> bool:
    return all(isinstance(t, torch.Tensor) and t.requires_grad for t in ts)


def run_backward(
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    seed_for: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Any:
    """Run ``func`` (one of :data:`BACKWARD_FUNCS`) from its tensors' gradient edges, torch-function handling on.

    The module docstring gives the seed rule and the non-leaf policy.

    Args:
        func: ``torch.Tensor.backward``, ``torch.autograd.backward`` or
            ``torch.autograd.grad``.
        args: its positional arguments.
        kwargs: its keyword arguments.
        seed_for: ``(root, gradient) -> gradient`` adapting each root's
            gradient (given or implicit) to the root's type; None keeps it.

    Returns:
        What ``func`` returns (``grad``'s gradients, None for the others), or
        :data:`BACKWARD_NOT_HANDLED` for a form the caller must run as an
        ordinary call.
    """
    roots_name, grads_name, inputs_name = _ARGS[func]
    try:
        bound = _SIGNATURES[func].bind(*args, **kwargs).arguments
    except TypeError:
        return BACKWARD_NOT_HANDLED  # the ordinary call reports the bad arguments
    if bound.get("grad_variables") is not None or bound.get("is_grads_batched"):
        return BACKWARD_NOT_HANDLED
    roots = _tensor_list(bound.get(roots_name))
    grads = _tensor_list(bound.get(grads_name))
    inputs = _tensor_list(bound.get(inputs_name))
    if not roots or not _all_require_grad(roots):
        return BACKWARD_NOT_HANDLED
    if inputs is None and func is torch.autograd.grad:
        return BACKWARD_NOT_HANDLED
    if inputs is not None and (not inputs or not _all_require_grad(inputs)):
        return BACKWARD_NOT_HANDLED
    grads = [None] * len(roots) if grads is None else grads
    if len(grads) != len(roots) or any(g is not None and not isinstance(g, torch.Tensor) for g in grads):
        return BACKWARD_NOT_HANDLED
    seeds = []
    for root, grad in zip(roots, grads, strict=True):
        if grad is None:
            if root.numel() != 1 or not root.is_floating_point():
                return BACKWARD_NOT_HANDLED  # torch's "grad can be implicitly created only for scalar outputs"
            with torch.no_grad():
                grad = torch.ones_like(root, memory_format=torch.preserve_format)
        seeds.append(grad if seed_for is None else seed_for(root, grad))
    edge = torch.autograd.graph.get_gradient_edge
    with torch._C.DisableTorchFunctionSubclass():
        root_edges = [edge(t) for t in roots]
        input_edges = None if inputs is None else [edge(t) for t in inputs]
        if func is not torch.autograd.grad:
            for t in inputs or ():
                if not t.is_leaf:
                    t.retain_grad()  # what torch's engine does for a tensor among backward's inputs
    retain_graph, create_graph = bound.get("retain_graph"), bool(bound.get("create_graph", False))
    with torch._C._EnableTorchFunction():
        if func is not torch.autograd.grad:
            torch.autograd.backward(root_edges, seeds, retain_graph, create_graph, inputs=input_edges)
            return None
        materialize = bool(bound.get("materialize_grads"))
        out = torch.autograd.grad(
            root_edges,
            input_edges or [],  # (never None here: grad without inputs is not handled)
            seeds,
            retain_graph=retain_graph,
            create_graph=create_graph,
            allow_unused=bound.get("allow_unused") or materialize,
        )
    if materialize and inputs is not None:  # (inputs: always here)
        out = tuple(torch.zeros_like(t) if g is None else g for t, g in zip(inputs, out, strict=True))
    return out
