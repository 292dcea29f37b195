"""``torch_xla.experimental.distributed_checkpoint._helpers``: the state-dict helpers PyTorch/XLA's checkpoint tests import."""

from __future__ import annotations

__all__: list[str] = []
