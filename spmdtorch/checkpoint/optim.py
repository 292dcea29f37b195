"""Giving a fresh optimizer the state entries a checkpoint will fill.

``optimizer.state_dict()`` of an optimizer that has not stepped yet has no
per-parameter state (``exp_avg``...), so there is nothing for ``load`` to fill
in place. :func:`init_optimizer_state` creates it, as
``torch.distributed.checkpoint`` does: one step with zero gradients and a zero
learning rate, which leaves the parameters unchanged.
"""

from __future__ import annotations

import torch

from spmdtorch import _checks
from spmdtorch.checkpoint.errors import CheckpointArgumentError, CheckpointArgumentTypeError

__all__ = ["init_optimizer_state"]


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Create ``optimizer``'s per-parameter state without changing any parameter.

    Does nothing if the optimizer already has state. The state tensors take
    the parameters' devices and shardings, so restoring into them keeps the
    shardings. Step counters become 1 until the checkpoint overwrites them.

    Raises:
        CheckpointArgumentError: a parameter already has a gradient (the step would use it; a ``ValueError``).

    Example:
        >>> import torch, spmdtorch
        >>> model = torch.nn.Linear(2, 2).to("xla")
        >>> opt = torch.optim.AdamW(model.parameters())
        >>> init_optimizer_state(opt)
        >>> sorted(opt.state_dict()["state"][0])
        ['exp_avg', 'exp_avg_sq', 'step']
    """
    _checks.check_instance(
        optimizer,
        torch.optim.Optimizer,
        "init_optimizer_state",
        "optimizer",
        CheckpointArgumentTypeError,
        "a torch.optim.Optimizer",
    )
    if optimizer.state:
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for p in params:
        if p.grad is not None:
            raise CheckpointArgumentError(
                "init_optimizer_state: a parameter of shape "
                f"{tuple(p.shape)} already has a gradient; call optimizer.zero_grad(set_to_none=True) first"
            )
    saved_lrs = []
    for group in optimizer.param_groups:
        lr = group.get("lr")
        saved_lrs.append(lr)
        if lr is not None:
            # A float even where the group's lr is a tensor: torch refuses a
            # tensor lr outside capturable steps, and no state depends on lr.
            group["lr"] = 0.0
    try:
        for p in params:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        for group, lr in zip(optimizer.param_groups, saved_lrs):
            if lr is not None:
                group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
