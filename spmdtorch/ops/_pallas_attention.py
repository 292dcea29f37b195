"""jax's Pallas flash-attention kernel for TPU, partitioned over batch and heads.

GSPMD cannot partition a Pallas kernel: it is an opaque custom call. So the
kernel runs under :func:`jax.experimental.custom_partitioning`, which asks
the partitioner for the operands' shardings and runs the kernel once per
shard. Batch and head dimensions keep their sharding (attention is
independent per batch row and head); the sequence and head dimensions are
replicated first (``need_replication``: a sequence-sharded input is gathered,
never computed on a slice). Forward and backward are two such calls: the
backward one differentiates the kernel per shard (its own custom VJP, i.e.
its backward kernels), so no gradient crosses a partition boundary.

Which calls take this path is :func:`use_pallas`'s decision
(``SPMDTORCH_ATTENTION_KERNEL``, docs/models.md "Attention"); everything else
stays on ``jax.nn.dot_product_attention``.

Invariant: for the inputs :func:`supports` accepts, :func:`attention` and
:func:`attention_vjp` equal XLA's attention (``spmdtorch.ops.attention``) up
to float rounding, whatever the shardings.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from spmdtorch import _jax_private, config
from spmdtorch.ops._util import Array

#: The kernel's default tile (jax's ``BlockSizes.get_default``): sequence
#: lengths must be multiples of it.
BLOCK = 128
_DTYPES = (jnp.float32, jnp.bfloat16)


def supports(
    query: Array | jax.ShapeDtypeStruct,
    key: Array | jax.ShapeDtypeStruct,
    value: Array | jax.ShapeDtypeStruct,
    attn_mask: Array | jax.ShapeDtypeStruct | None,
) -> bool:
    """Whether the Pallas kernel takes these (B, H, L, D) inputs.

    No mask (``is_causal`` is the kernel's own), equal dtypes (float32 or
    bfloat16), equal head dims, whole 128-blocks of queries and keys, and
    grouped-query heads that divide evenly (key/value heads are repeated).
    """
    if attn_mask is not None or not (query.ndim == key.ndim == value.ndim == 4):
        return False
    if not (query.dtype == key.dtype == value.dtype) or query.dtype not in _DTYPES:
        return False
    (b, h, q_len, d), (bk, hk, k_len, dk) = query.shape, key.shape
    if value.shape != key.shape or bk != b or dk != d or h % hk:
        return False
    return q_len % BLOCK == 0 and k_len % BLOCK == 0


def use_pallas(
    query: Array | jax.ShapeDtypeStruct,
    key: Array | jax.ShapeDtypeStruct,
    value: Array | jax.ShapeDtypeStruct,
    attn_mask: Array | jax.ShapeDtypeStruct | None,
) -> bool:
    """Whether this SDPA call lowers to the Pallas kernel (read at trace time)."""
    mode = config.settings().attention_kernel
    if mode == "xla" or (mode == "auto" and jax.default_backend() != "tpu"):
        return False
    return supports(query, key, value, attn_mask)


class _Static(NamedTuple):
    """The kernel's compile-time arguments (the custom call's static part)."""

    causal: bool
    scale: float
    interpret: bool  # Pallas's TPU interpret mode: the kernel off TPU (tests)


def _static(query: Array, is_causal: bool, scale: float | None) -> _Static:
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return _Static(bool(is_causal), scale, jax.default_backend() != "tpu")


def _repeat_kv(query: Array, key: Array, value: Array) -> tuple[Array, Array]:
    rep = query.shape[1] // key.shape[1]
    if rep == 1:
        return key, value
    return jnp.repeat(key, rep, axis=1), jnp.repeat(value, rep, axis=1)


def attention(query: Array, key: Array, value: Array, is_causal: bool, scale: float | None) -> Array:
    """The Pallas kernel's output in torch's (B, H, L, D) layout."""
    key, value = _repeat_kv(query, key, value)
    return _kernels(_static(query, is_causal, scale)).forward(query, key, value)


def attention_vjp(
    grad_out: Array, query: Array, key: Array, value: Array, is_causal: bool, scale: float | None
) -> tuple[Array, Array, Array]:
    """(dq, dk, dv) of :func:`attention`'s output, through the kernel's backward."""
    static = _static(query, is_causal, scale)
    k_heads = key.shape[1]
    key_r, value_r = _repeat_kv(query, key, value)
    dq, dk, dv = _kernels(static).backward(query, key_r, value_r, grad_out.astype(query.dtype))
    if k_heads != query.shape[1]:  # gradients of the repeated heads sum back
        b, _, s, d = dk.shape
        dk = dk.reshape(b, k_heads, -1, s, d).sum(axis=2)
        dv = dv.reshape(b, k_heads, -1, s, d).sum(axis=2)
    return dq, dk, dv


class _Kernels(NamedTuple):
    forward: Callable[[Array, Array, Array], Array]  # custom_partitioning: (q, k, v) -> out
    backward: Callable[[Array, Array, Array, Array], tuple[Array, Array, Array]]  # -> (dq, dk, dv)


# Bounded and registered with the engine through ops.MEMOS (ops sits below it).
@functools.lru_cache(maxsize=16)
def _kernels(static: _Static) -> _Kernels:
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention

    def interpret() -> contextlib.AbstractContextManager[None]:
        if not static.interpret:
            return contextlib.nullcontext()
        return _jax_private.pallas_interpret_mode()

    def kernel(q: Array, k: Array, v: Array) -> Array:
        out: Array = flash_attention(q, k, v, causal=static.causal, sm_scale=static.scale)  # Pallas's op is unannotated
        return out

    def forward(q: Array, k: Array, v: Array) -> Array:
        with interpret():
            return kernel(q, k, v)

    def backward(q: Array, k: Array, v: Array, g: Array) -> tuple[Array, Array, Array]:
        with interpret():
            _, vjp = jax.vjp(kernel, q, k, v)
            grads: tuple[Array, Array, Array] = vjp(g)  # jax types a pullback's result Any
            return grads

    fwd, bwd = custom_partitioning(forward), custom_partitioning(backward)
    fwd.def_partition(
        partition=functools.partial(_partition, forward, 1),
        infer_sharding_from_operands=functools.partial(_infer, 1),
        sharding_rule="b h q d, b h k d, b h k d -> b h q d",
        need_replication_factors=("q", "d", "k"),
    )
    bwd.def_partition(
        partition=functools.partial(_partition, backward, 3),
        infer_sharding_from_operands=functools.partial(_infer, 3),
        sharding_rule="b h q d, b h k d, b h k d, b h q d -> b h q d, b h k d, b h k d",
        need_replication_factors=("q", "d", "k"),
    )
    return _Kernels(fwd, bwd)


def _batch_heads(mesh: Mesh, sharding: jax.sharding.Sharding | None) -> NamedSharding:
    """``sharding`` kept on batch and heads, replicated on sequence and head dim."""
    spec = tuple(getattr(sharding, "spec", ())) + (None, None)
    return NamedSharding(mesh, PartitionSpec(spec[0], spec[1], None, None))


def _infer(
    n_out: int, mesh: Mesh, arg_shapes: Sequence[jax.ShapeDtypeStruct], result_shape: object
) -> NamedSharding | tuple[NamedSharding, ...]:
    # GSPMD (non-Shardy) propagation: the results follow the query's batch/heads.
    s = _batch_heads(mesh, arg_shapes[0].sharding)
    return s if n_out == 1 else (s,) * n_out


def _partition(
    fn: Callable[..., object], n_out: int, mesh: Mesh, arg_shapes: Sequence[jax.ShapeDtypeStruct], result_shape: object
) -> tuple[Mesh, Callable[..., object], NamedSharding | tuple[NamedSharding, ...], tuple[NamedSharding, ...]]:
    s = _batch_heads(mesh, arg_shapes[0].sharding)
    return mesh, fn, (s if n_out == 1 else (s,) * n_out), (s,) * len(arg_shapes)
