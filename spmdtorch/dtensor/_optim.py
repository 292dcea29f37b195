"""torch optimizers over ``XlaDTensor`` parameters take their ``foreach`` and fused Adam paths.

Why: ``torch.optim`` picks its multi-tensor (``foreach``) implementation only
for cuda-like devices, so a ``foreach=None`` optimizer runs its per-parameter
Python loop on xla tensors. ``spmdtorch.tensor.optim_hooks`` switches such
groups to ``foreach`` (and Adam/AdamW from their second step to the fused
path, recorded as one node) for plain xla parameters; this module registers
``XlaDTensor`` with it, so a group whose parameters are all ``XlaDTensor``
is switched the same way: each ``_foreach_*`` op (or ``_fused_adamw_``) over
every parameter then crosses ``XlaDTensor.__torch_function__`` once (one
sharding propagation, one record) instead of once per parameter and op. The
recorded per-element arithmetic is the same.
"""

from __future__ import annotations

import torch
from torch.optim.optimizer import _foreach_supported_types as _optim_foreach_types
from torch.utils._foreach_utils import _foreach_supported_types as _util_foreach_types

from spmdtorch.tensor import optim_hooks

__all__ = ["install"]


def _floating(p: torch.Tensor) -> bool:
    return p.dtype.is_floating_point


def install(cls: type[torch.Tensor]) -> None:
    """Switch optimizer groups over ``cls`` parameters as xla tensors' are (idempotent).

    Also lists ``cls`` with the parameter types torch's foreach paths accept,
    as torch lists its own ``DTensor``.
    """
    if cls not in _optim_foreach_types:
        _optim_foreach_types.append(cls)
    if cls not in _util_foreach_types:
        _util_foreach_types.append(cls)
    optim_hooks.register_parameter_type(cls, _floating)
    optim_hooks.install()
