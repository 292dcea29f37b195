"""``torch_xla._XLAC``: the debugging calls PyTorch/XLA's guides use, with their signatures."""

from __future__ import annotations

from collections.abc import Sequence

import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.sharding import get_sharding_spec

__all__ = [
    "_get_xla_sharding_spec",
    "_get_xla_tensors_hlo",
    "_get_xla_tensors_text",
    "_xla_sync_multi",
]


def _get_xla_sharding_spec(tensor: torch.Tensor) -> str:
    """The tensor's HLO sharding string (``""`` when it has no annotation), as PyTorch/XLA prints it."""
    return get_sharding_spec(tensor)


def _get_xla_tensors_hlo(tensors: Sequence[torch.Tensor]) -> str:
    """HLO text of the pending graph computing ``tensors`` (``""`` when they are already computed)."""
    return debug.get_hlo_text(list(tensors))


def _get_xla_tensors_text(tensors: Sequence[torch.Tensor]) -> str:
    """The pending graph computing ``tensors`` as text: StableHLO (spmdtorch's IR is JAX's)."""
    return debug.get_stablehlo(list(tensors))


def _xla_sync_multi(
    tensors: Sequence[torch.Tensor], devices: Sequence[str] = (), wait: bool = True, sync_xla_data: bool = True
) -> None:
    """Computes the pending tensors (spmdtorch computes every pending tensor at a barrier)."""
    spmdtorch.sync(wait=wait)
