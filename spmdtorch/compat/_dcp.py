"""``torch_xla.experimental.distributed_checkpoint``: :mod:`spmdtorch.checkpoint.distributed_checkpoint`.

``SPMDSavePlanner`` and ``SPMDLoadPlanner`` (``torch.distributed.checkpoint``'s
format), ``CheckpointManager`` with PyTorch/XLA's signature (``save``,
``save_async``, ``restore(step, state_dict)`` in place; it writes Orbax
checkpoints) and ``prime_optimizer``.
"""

from __future__ import annotations

from spmdtorch.checkpoint.distributed_checkpoint import (
    CheckpointManager,
    SPMDLoadPlanner,
    SPMDSavePlanner,
    prime_optimizer,
)

__all__ = ["CheckpointManager", "SPMDLoadPlanner", "SPMDSavePlanner", "prime_optimizer"]

#: PyTorch/XLA's names in this module.
NAMES = tuple(__all__)
