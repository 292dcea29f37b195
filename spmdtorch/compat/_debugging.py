"""``torch_xla.distributed.spmd.debugging``: sharding pictures drawn as PyTorch/XLA draws them.

:func:`spmdtorch.sharding.visualize_sharding` with ``style="torch_xla"``: a
tile's block reads ``CPU 4``, a replica group's ``CPU [0, 1]``, each block as
wide as its label, so programs and tests that compare the printed table with
PyTorch/XLA's see the same text. ``visualize_sharding`` first prints
``Visualizing <sharding> (showing up to the first two dimensions)``, as
PyTorch/XLA does. (``xs.visualize_sharding`` keeps spmdtorch's drawing.)
"""

from __future__ import annotations

from typing import Any

import rich.table
import torch

from spmdtorch import sharding

__all__ = ["visualize_sharding", "visualize_tensor_sharding"]


def visualize_sharding(
    sharding_: str,
    use_color: bool = True,
    scale: float = 1.0,
    min_width: int = 9,
    max_width: int = 80,
) -> rich.table.Table:
    """Prints and returns the ``rich`` table of an HLO sharding string's blocks, in PyTorch/XLA's form.

    Args:
        sharding_: e.g. ``'{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}'``; ``''`` draws as replicated.
        use_color, scale, min_width, max_width: PyTorch/XLA's parameters (see
            :func:`spmdtorch.sharding.visualize_sharding`).

    Raises:
        HloShardingError, VisualizationError: as :func:`spmdtorch.sharding.visualize_sharding`.
    """
    if isinstance(sharding_, str):
        print(f"Visualizing {sharding_} (showing up to the first two dimensions)")
    return sharding.visualize_sharding(sharding_, use_color, scale, min_width, max_width, style="torch_xla")


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> rich.table.Table:
    """:func:`visualize_sharding` of ``t``'s sharding string (an ``XLAShardedTensor``'s global tensor's)."""
    inner = getattr(t, "global_tensor", t)
    return visualize_sharding(sharding.get_sharding_spec(inner), **kwargs)
