"""``torch_xla.experimental.gradient_accumulation``: ``gradient_accumulation`` as one traced loop.

``gradient_accumulation(train_step, iterable_tensors, model, *carried_tensors)``
has PyTorch/XLA 2.9's meaning: iteration ``i`` runs
``train_step(*(t[i] for t in iterable_tensors), *carried)``, which returns the
loss (or ``(loss, *new_carried)``); the loss is divided by the number of
iterations and differentiated with respect to the model's parameters. The
parameters' gradients are summed over the iterations and added to each
parameter's ``.grad`` (set where it was None); the result is the summed
(so: mean) loss, followed by the final carried tensors when there are any.

It is built on :func:`spmdtorch.scan`: the iterations are ONE ``lax.scan``
(XLA's ``While``), recorded once whatever their number. The loop carries the
running loss, one gradient accumulator per trainable parameter, the
parameters themselves (unchanged: the body reads them through
``torch.func.functional_call``, so ``train_step`` calls ``model`` as usual)
and the carried tensors; the body computes its gradients with
``torch.autograd.grad``. As in PyTorch/XLA, ``train_step`` must be pure: the
limits of a scan body apply (no random numbers, e.g. dropout with ``p > 0``;
no in-place updates of buffers such as BatchNorm's statistics; no reads on
the host), each a named :class:`spmdtorch.ScanError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import spmdtorch
from spmdtorch.compat.errors import CompatError

__all__ = ["GradientAccumulationError", "gradient_accumulation"]


class GradientAccumulationError(CompatError, ValueError):
    """``gradient_accumulation`` got arguments it cannot loop over (a ``ValueError``, as in PyTorch/XLA)."""


class _Step(nn.Module):
    """``train_step`` as the forward of a module that owns ``model``, so ``functional_call`` can swap its weights."""

    def __init__(self, model: nn.Module, train_step: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self.train_step = train_step

    def forward(self, *args: Any) -> Any:
        return self.train_step(*args)


def _check(train_step: Any, iterable_tensors: Any, model: Any, carried: Sequence[Any]) -> int:
    """The number of iterations, after checking the arguments."""
    if not callable(train_step):
        raise GradientAccumulationError(
            f"gradient_accumulation: train_step must be callable, got {type(train_step).__name__}"
        )
    if not isinstance(model, nn.Module):
        raise GradientAccumulationError(
            f"gradient_accumulation: model must be a torch.nn.Module, got {type(model).__name__}"
        )
    if isinstance(iterable_tensors, torch.Tensor) or not isinstance(iterable_tensors, (tuple, list)):
        raise GradientAccumulationError(
            "gradient_accumulation: iterable_tensors must be a tuple of tensors sharing their leading "
            f"(iteration) dim, got {type(iterable_tensors).__name__}; wrap a single tensor as (t,)"
        )
    if not iterable_tensors:
        raise GradientAccumulationError("gradient_accumulation: iterable_tensors cannot be empty")
    for i, t in enumerate(iterable_tensors):
        if not isinstance(t, torch.Tensor):
            raise GradientAccumulationError(
                f"gradient_accumulation: element {i} of iterable_tensors is a {type(t).__name__}, not a tensor"
            )
        if t.numel() == 0 or t.dim() == 0:
            raise GradientAccumulationError(
                f"gradient_accumulation: element {i} of iterable_tensors is empty (shape {tuple(t.shape)}); "
                "each needs a leading iteration dim of at least 1"
            )
    steps = int(iterable_tensors[0].size(0))
    for i, t in enumerate(iterable_tensors):
        if t.size(0) != steps:
            raise GradientAccumulationError(
                f"gradient_accumulation: element {i} of iterable_tensors has inconsistent first dimension: "
                f"{t.size(0)}, element 0 has {steps}"
            )
    for i, t in enumerate(carried):
        if not isinstance(t, torch.Tensor):
            raise GradientAccumulationError(
                f"gradient_accumulation: carried tensor {i} is a {type(t).__name__}, not a tensor"
            )
    return steps


def gradient_accumulation(
    train_step: Callable[..., Any],
    iterable_tensors: Sequence[torch.Tensor],
    model: nn.Module,
    *carried_tensors: torch.Tensor,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """Accumulate ``model``'s gradients over the leading dim of ``iterable_tensors`` in one loop.

    Args:
        train_step: ``train_step(*slices, *carried) -> loss | (loss, *new_carried)``;
            the slices are the iterable tensors without their leading dim.
        iterable_tensors: tensors sharing their leading dim (the number of iterations).
        model: the module ``train_step`` calls; its trainable parameters get the gradients.
        *carried_tensors: tensors passed from one iteration to the next.

    Returns:
        The loss summed over the iterations (each divided by their number),
        then, if there are carried tensors, their final values:
        ``loss`` or ``(loss, *carried)``.

    Raises:
        GradientAccumulationError: bad arguments, or ``train_step`` returning
            the wrong number of carried tensors or a loss that is not a scalar.
        spmdtorch.ScanError: a ``train_step`` that cannot be a loop body.

    Example:
        >>> import torch, spmdtorch.compat
        >>> from spmdtorch.compat._gradient_accumulation import gradient_accumulation
        >>> model = torch.nn.Linear(2, 1).to("xla")
        >>> xs = torch.ones(4, 3, 2, device="xla")
        >>> loss = gradient_accumulation(lambda x: model(x).pow(2).mean(), (xs,), model)
        >>> tuple(model.weight.grad.shape), tuple(loss.shape)
        ((1, 2), ())
    """
    steps = _check(train_step, iterable_tensors, model, carried_tensors)
    wrapper = _Step(model, train_step)
    named = [(f"model.{n}", p) for n, p in model.named_parameters()]
    trainable = [i for i, (_, p) in enumerate(named) if p.requires_grad]
    n_carried = len(carried_tensors)
    device = iterable_tensors[0].device

    def body(carry: tuple[Any, ...], xs: tuple[torch.Tensor, ...]) -> tuple[tuple[Any, ...], tuple[()]]:
        loss_acc, grads_acc, params, carried = carry
        # The weights the body differentiates: fresh leaves over the loop's parameter values.
        leaves = [p.detach().requires_grad_(i in trainable) for i, p in enumerate(params)]
        state = {n: leaf for (n, _), leaf in zip(named, leaves)}
        result = torch.func.functional_call(wrapper, state, (*xs, *carried))
        if n_carried:
            if not isinstance(result, (tuple, list)) or len(result) != 1 + n_carried:
                raise GradientAccumulationError(
                    f"gradient_accumulation: train_step must return (loss, *carried) with {n_carried} carried "
                    f"tensor(s), got {type(result).__name__}"
                    + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
                )
            loss, new_carried = result[0], tuple(result[1:])
        else:
            loss, new_carried = result, ()
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise GradientAccumulationError(
                "gradient_accumulation: train_step's loss must be a one-element tensor, got "
                + (f"shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else type(loss).__name__)
            )
        loss = loss.reshape(()) / steps
        wanted = [leaves[i] for i in trainable]
        grads = torch.autograd.grad(loss, wanted, allow_unused=True) if wanted and loss.requires_grad else ()
        new_grads = tuple(
            acc if g is None else acc + g.to(acc.dtype) for acc, g in zip(grads_acc, grads or [None] * len(wanted))
        )
        new_loss = loss_acc + loss.detach().to(loss_acc.dtype)
        return (new_loss, new_grads, params, tuple(t.detach() for t in new_carried)), ()

    with torch.no_grad():
        init_grads = tuple(torch.zeros_like(named[i][1]) for i in trainable)
    init = (
        torch.zeros((), dtype=torch.float32, device=device),
        init_grads,
        tuple(p.detach() for _, p in named),
        tuple(t.detach() for t in carried_tensors),
    )
    with torch.enable_grad():
        (loss, grads, _, carried), _ = spmdtorch.scan(body, init, tuple(iterable_tensors))
    with torch.no_grad():
        for i, g in zip(trainable, grads):
            p = named[i][1]
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
    if not n_carried:
        return loss
    return (loss, *carried)
