"""``torch_xla.utils.utils`` (``xu``): ``SampleGenerator`` and the small helpers PyTorch/XLA scripts import."""

from __future__ import annotations

__all__: list[str] = []
