"""Mapping between torch dtypes (what users see) and JAX storage dtypes.

spmdtorch does not turn on ``jax_enable_x64`` (it would change every JAX
program in the process and slow accelerators down), so 64-bit torch dtypes are
*stored* in their 32-bit JAX counterparts while the tensor keeps *reporting*
the torch dtype. ``.cpu()`` converts back, so users see torch's dtypes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float32,
    torch.bfloat16: jnp.bfloat16,
    torch.float16: jnp.float16,
    torch.int64: jnp.int32,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint32,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex64,
}

# The numpy dtype a torch dtype round-trips through on the host (full width:
# host copies keep what the user gave until the device narrows it).
_TORCH_TO_NUMPY = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
    torch.complex64: np.complex64,
    torch.complex128: np.complex128,
}


class UnsupportedDtypeError(TypeError):
    """A torch dtype has no JAX storage type (for example quantized dtypes)."""


def to_jax_dtype(dtype: torch.dtype) -> jnp.dtype:
    """Return the JAX dtype that stores a tensor of torch ``dtype``.

    Example:
        >>> to_jax_dtype(torch.int64)
        dtype('int32')
    """
    try:
        return jnp.dtype(_TORCH_TO_JAX[dtype])
    except KeyError:
        raise UnsupportedDtypeError(
            f"dtype {dtype} has no spmdtorch storage type; supported: {sorted(str(d) for d in _TORCH_TO_JAX)}"
        ) from None


_JAX_TO_TORCH = {
    jnp.dtype(jnp.float32): torch.float32,
    jnp.dtype(jnp.float64): torch.float64,
    jnp.dtype(jnp.bfloat16): torch.bfloat16,
    jnp.dtype(jnp.float16): torch.float16,
    jnp.dtype(jnp.int64): torch.int64,
    jnp.dtype(jnp.int32): torch.int32,
    jnp.dtype(jnp.int16): torch.int16,
    jnp.dtype(jnp.int8): torch.int8,
    jnp.dtype(jnp.uint8): torch.uint8,
    jnp.dtype(jnp.uint16): torch.uint16,
    jnp.dtype(jnp.uint32): torch.uint32,
    jnp.dtype(jnp.bool_): torch.bool,
    jnp.dtype(jnp.complex64): torch.complex64,
    jnp.dtype(jnp.complex128): torch.complex128,
}


def to_torch_dtype(dtype) -> torch.dtype:
    """Return the torch dtype matching a JAX/numpy dtype (exact width)."""
    try:
        return _JAX_TO_TORCH[jnp.dtype(dtype)]
    except KeyError:
        raise UnsupportedDtypeError(f"JAX dtype {dtype} has no torch dtype") from None
