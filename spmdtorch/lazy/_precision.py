"""Float32 matmul precision: ``torch.set_float32_matmul_precision`` mapped to XLA's.

torch's setting says how float32 matrix products may be computed; XLA's
``precision`` attribute on dots and convolutions says the same for an
accelerator's matrix unit. The mapping (torch -> JAX's name -> what the
hardware does):

==========  ===============  ===============================================
torch       JAX              TPU / Ampere+ GPU
==========  ===============  ===============================================
"highest"   "highest"        full float32 (6 bf16 passes on TPU; no TF32)
"high"      "high"           3 bf16 passes on TPU; TF32 on GPU
"medium"    "default"        1 bf16 pass on TPU; TF32 on GPU
==========  ===============  ===============================================

torch's default is "highest", so an unchanged script gets float32 products,
as on torch's CPU and CUDA (TF32 off by default). A CPU computes float32
products in float32 at every setting. Products of bf16/f16 inputs are exact
in one pass and accumulate in float32 (``spmdtorch.ops.linalg``) whatever the
setting.

The setting is read when a program is built: it is part of the compile
cache's key (``executor.ProgramKey``) and of ``spmdtorch.compile``'s input
signature, so changing it between steps compiles a program with the new
precision instead of replaying one built with the old.
"""

from __future__ import annotations

import torch

#: torch's setting -> the name ``jax.default_matmul_precision`` takes.
_TORCH_TO_JAX = {"highest": "highest", "high": "high", "medium": "default"}


def current() -> str:
    """The JAX precision name for torch's current float32 matmul precision.

    Example:
        >>> import torch
        >>> from spmdtorch.lazy import _precision
        >>> _precision.current()  # torch's default
        'highest'
        >>> torch.set_float32_matmul_precision("medium")
        >>> _precision.current()
        'default'
        >>> torch.set_float32_matmul_precision("highest")
    """
    return _TORCH_TO_JAX.get(torch.get_float32_matmul_precision(), "highest")
