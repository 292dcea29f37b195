"""``torch_xla.amp`` and ``torch_xla.amp.syncfree``: ``torch.autocast("xla")`` and torch's optimizers.

``autocast(device, dtype=None)`` is ``torch.autocast("xla", dtype)`` with
PyTorch/XLA's default dtype (bfloat16; float16 on CUDA). The ``syncfree``
optimizers exist in PyTorch/XLA to avoid a device-to-host sync on inf checks;
torch's own optimizers never sync on spmdtorch's lazy tensors, so they are
``torch.optim.Adam``/``AdamW``/``SGD``.
"""

from __future__ import annotations

from typing import Any

import torch

from spmdtorch import runtime

__all__ = ["Adam", "AdamW", "SGD", "autocast"]

Adam = torch.optim.Adam
AdamW = torch.optim.AdamW
SGD = torch.optim.SGD


def autocast(
    device: Any = "xla", enabled: bool = True, dtype: torch.dtype | None = None, cache_enabled: bool | None = None
) -> torch.autocast:
    """``torch.autocast("xla", dtype)``; ``dtype`` defaults to bfloat16 (float16 on CUDA), as PyTorch/XLA's."""
    if dtype is None:
        dtype = torch.float16 if runtime.device_type() == "CUDA" else torch.bfloat16
    return torch.autocast("xla", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
