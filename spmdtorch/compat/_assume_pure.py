"""``torch_xla.experimental.assume_pure``: record a pure function once, reuse it every step.

PyTorch/XLA's decorator is :func:`spmdtorch.assume_pure`; a module is marked
the same way (PyTorch/XLA's guide wraps ``torch.func.functional_call``
instead, which works too: the parameters are then ordinary arguments).
"""

from __future__ import annotations

from spmdtorch._pure import AssumePureError, assume_pure

__all__ = ["AssumePureError", "assume_pure"]
