"""ATen → JAX lowerings, one module per op family.

Importing this package fills ``registry.LOWERINGS`` (and
``views.VIEW_INVERSES``). See ``registry`` for the calling convention.
"""

from spmdtorch.ops import (  # noqa: F401
    _batched_matmul,
    _linear,
    _pallas_attention,
    activations,
    attention,
    conv,
    elementwise,
    factories,
    fft,
    grouped,
    histograms,
    indexing,
    linalg,
    losses,
    norms,
    random,
    reductions,
    registry,
    shape,
    special,
    views,
)
from spmdtorch.ops._linear import LinearFn  # the autograd function of F.linear on xla tensors
from spmdtorch.ops.registry import LOWERINGS, get_lowering, register, resolve_ops
from spmdtorch.ops.views import VIEW_INVERSES, get_inverse, register_inverse

# The layer's memo tables: functools.lru_cache functions with an explicit
# maxsize. ops sits below the engine, so spmdtorch.lazy.caches registers them
# (debug.cache_sizes() lists them, clear_caches() empties them).
MEMOS = (_pallas_attention._kernels,)

__all__ = [
    "LinearFn",
    "LOWERINGS",
    "MEMOS",
    "VIEW_INVERSES",
    "get_inverse",
    "get_lowering",
    "register",
    "register_inverse",
    "resolve_ops",
]
