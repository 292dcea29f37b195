"""``torch_xla.experimental.assume_pure``, ``.scan`` and ``.scan_layers``: spmdtorch's own names.

``assume_pure(fn)`` is :func:`spmdtorch.assume_pure` (a module is marked the
same way; PyTorch/XLA's guide wraps ``torch.func.functional_call`` instead,
which works too: the parameters are then ordinary arguments). ``scan`` and
``scan_layers`` are :func:`spmdtorch.scan` and :func:`spmdtorch.scan_layers`,
PyTorch/XLA's arguments included.
"""

from __future__ import annotations

from spmdtorch.programs import AssumePureError, assume_pure, scan, scan_layers

__all__ = ["AssumePureError", "assume_pure", "scan", "scan_layers"]
