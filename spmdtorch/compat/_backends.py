"""``torch_xla.backends``: the float32 matmul precision, as torch's own setting.

PyTorch/XLA's ``set_mat_mul_precision`` sets XLA's precision for float32
products; spmdtorch follows ``torch.set_float32_matmul_precision`` instead
(``spmdtorch.lazy._precision``), so these two set and read that:
``"default"`` is torch's ``"medium"`` (one bf16 pass on TPU), ``"high"`` and
``"highest"`` are torch's names.
"""

from __future__ import annotations

import torch

from spmdtorch._checks import ArgumentError

__all__ = ["get_mat_mul_precision", "set_mat_mul_precision"]

_TO_TORCH = {"default": "medium", "high": "high", "highest": "highest"}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}


def set_mat_mul_precision(precision: str) -> None:
    """``torch_xla.backends.set_mat_mul_precision``: ``"default"``, ``"high"`` or ``"highest"``.

    Example:
        >>> from spmdtorch.compat import _backends
        >>> _backends.set_mat_mul_precision("high")
        >>> torch.get_float32_matmul_precision()
        'high'
        >>> _backends.set_mat_mul_precision("highest")
    """
    if precision not in _TO_TORCH:
        raise ArgumentError(
            f"set_mat_mul_precision: precision={precision!r} is not one of 'default', 'high', 'highest'; "
            "pass one of them (or call torch.set_float32_matmul_precision, which spmdtorch follows)"
        )
    torch.set_float32_matmul_precision(_TO_TORCH[precision])


def get_mat_mul_precision() -> str:
    """``torch_xla.backends.get_mat_mul_precision``: the current setting in PyTorch/XLA's names."""
    return _FROM_TORCH.get(torch.get_float32_matmul_precision(), "highest")
