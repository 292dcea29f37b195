"""``torch_xla.distributed.fsdp`` and ``.fsdp.wrap``: ``checkpoint_module`` and the wrap policies.

``XlaFullyShardedDataParallel`` (FSDPv1) shards parameters across the
processes of a multiprocess job; spmdtorch refuses it with
:class:`MultiprocessNotSupportedError`, naming FSDPv2, its SPMD successor.
"""

from __future__ import annotations

from typing import Any

from spmdtorch.compat.errors import MultiprocessNotSupportedError
from spmdtorch.fsdp import (
    MixedPrecision,
    checkpoint_module,
    lambda_auto_wrap_policy,
    recursive_wrap,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

__all__ = [
    "MixedPrecision",
    "XlaFullyShardedDataParallel",
    "always_wrap_policy",
    "checkpoint_module",
    "consolidate_sharded_model_checkpoints",
    "lambda_auto_wrap_policy",
    "recursive_wrap",
    "size_based_auto_wrap_policy",
    "transformer_auto_wrap_policy",
]

_FSDPV1 = (
    "XlaFullyShardedDataParallel (FSDPv1) shards parameters across the processes of PyTorch/XLA's multiprocess "
    "mode; spmdtorch runs SPMD only. Use FSDPv2, its SPMD form: "
    "`from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2`; "
    "mesh = xs.Mesh(np.arange(n), (n, 1), ('fsdp', 'model')); model = FSDPv2(model, mesh, "
    "auto_wrap_policy=..., auto_wrapper_callable=...). Optimizers and wrap policies stay as they are; "
    "sharded checkpoints come from torch_xla.experimental.distributed_checkpoint or spmdtorch.checkpoint"
)


class XlaFullyShardedDataParallel:
    """Refused: FSDPv1 is multiprocess-only (see :data:`_FSDPV1`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise MultiprocessNotSupportedError(_FSDPV1)


def consolidate_sharded_model_checkpoints(*args: Any, **kwargs: Any) -> Any:
    """Refused: FSDPv1's per-rank checkpoint files do not exist in SPMD mode."""
    raise MultiprocessNotSupportedError(
        "consolidate_sharded_model_checkpoints stitches FSDPv1's per-rank files; SPMD checkpoints are one "
        "checkpoint of global tensors: spmdtorch.checkpoint.export(path, state) writes one plain torch/safetensors file"
    )


def always_wrap_policy(*args: Any, **kwargs: Any) -> bool:
    """Wrap every submodule (torch's ``always_wrap_policy``)."""
    return True
