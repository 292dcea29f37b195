"""``torch_xla.experimental.gradient_accumulation``: ``gradient_accumulation`` as one traced loop."""

from __future__ import annotations

__all__: list[str] = []
