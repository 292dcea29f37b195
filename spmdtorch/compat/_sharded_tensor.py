"""``torch_xla.distributed.spmd.xla_sharded_tensor``: ``XLAShardedTensor`` and ``XLAShard``."""

from __future__ import annotations

__all__: list[str] = []
