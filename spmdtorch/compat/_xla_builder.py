"""``torch_xla.core.xla_builder``: ``call_jax`` runs a JAX function on xla tensors inside the traced program."""

from __future__ import annotations

__all__: list[str] = []
