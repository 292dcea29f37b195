"""Barriers: ``sync``/``mark_step`` and the ``step()`` context manager."""

from __future__ import annotations

import contextlib

from spmdtorch.lazy.executor import sync

__all__ = ["sync", "mark_step", "step", "wait_device_ops"]


def mark_step(wait: bool = False) -> None:
    """PyTorch/XLA's name for ``sync``: run everything recorded so far."""
    sync(wait=wait)


def wait_device_ops() -> None:
    """Block until every queued execution has finished."""
    sync(wait=True)


@contextlib.contextmanager
def step():
    """Run the body as one training step: leaving the block syncs.

    Example:
        >>> import torch, spmdtorch
        >>> w = torch.ones(3, device="xla")
        >>> with spmdtorch.step():
        ...     _ = w.mul_(2)
        >>> w.cpu()
        tensor([2., 2., 2.])
    """
    try:
        yield
    finally:
        sync()
