"""``torch_xla.core.xla_env_vars``: the names of PyTorch/XLA's environment variables."""

from __future__ import annotations

__all__: list[str] = []
