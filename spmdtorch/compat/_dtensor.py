"""``torch_xla.distributed.spmd.api``: the DTensor bridge (``xla_distribute_tensor``, ``xla_distribute_module``, ``convert_to_xla_mesh``, ``auto_policy``)."""

from __future__ import annotations

__all__: list[str] = []
