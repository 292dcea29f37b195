"""``torch_xla.experimental.distributed_checkpoint``: mapped to :mod:`spmdtorch.checkpoint` by name.

``SPMDSavePlanner``, ``SPMDLoadPlanner``, ``CheckpointManager`` and
``prime_optimizer`` resolve, at first use, to the same names in
``spmdtorch.checkpoint``; a name spmdtorch does not have (yet) raises
:class:`TorchXlaNameError` saying so.
"""

from __future__ import annotations

from typing import Any

from spmdtorch import checkpoint
from spmdtorch.compat.errors import GUIDE, TorchXlaNameError

__all__: list[str] = []

#: PyTorch/XLA's names in this module, all looked up in spmdtorch.checkpoint.
NAMES = ("SPMDSavePlanner", "SPMDLoadPlanner", "CheckpointManager", "prime_optimizer")


def __getattr__(name: str) -> Any:
    if name in NAMES:
        found = getattr(checkpoint, name, None)
        if found is not None:
            return found
        raise TorchXlaNameError(
            f"torch_xla.experimental.distributed_checkpoint.{name} has no spmdtorch.checkpoint equivalent in this "
            f"build; spmdtorch's own checkpoints are spmdtorch.checkpoint.save/load and CheckpointManager ({GUIDE})"
        )
    raise AttributeError(name)
