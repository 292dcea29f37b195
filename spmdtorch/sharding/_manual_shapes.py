"""Manual sharding one op at a time: ``full_to_shard_shape``, ``shard_to_full_shape``, ``mark_manual_sharding``.

``shard_map`` (``spmdtorch.sharding._manual``) records a whole per-device
region as one node. PyTorch/XLA also exposes the region's two ends as single
ops, with ordinary ops between them running on each device's block:

* :func:`full_to_shard_shape`: a sharded tensor becomes this device's block
  (XLA's ``SPMDFullToShardShape``; the result is manually sharded);
* :func:`shard_to_full_shape`: each device's block becomes one global tensor
  with the sharding given (``SPMDShardToFullShape``);
* :func:`mark_manual_sharding`: a pending value becomes manually sharded in
  place (a ``Sharding`` custom call with ``{manual}``).

The nodes are those of ``spmdtorch.lazy.manual``: a manual value is never a
program output (a sync leaves it pending; reading it raises
``ManualValueError``), so every manual value must reach
:func:`shard_to_full_shape` before it is read. Not differentiable: tensors
that require grad are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import torch

from spmdtorch import _checks
from spmdtorch.lazy import manual
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.ops.manual import ManualOpsError, local_shape
from spmdtorch.sharding._inspect import _effective_sharding
from spmdtorch.sharding._manual import ManualRegionError
from spmdtorch.sharding._marking import ShardingError, ShardingSpec, ShardingTypeError
from spmdtorch.tensor import storage_of, view_chain
from spmdtorch.tensor.dispatch import read_value
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["ManualShardingError", "full_to_shard_shape", "mark_manual_sharding", "shard_to_full_shape"]


class ManualShardingError(ManualRegionError, ShardingError):
    """A tensor in the wrong state for a manual-sharding op (a ``RuntimeError`` and a ``ValueError``)."""


def _check(t: object, what: str) -> XlaTensor:
    if not isinstance(t, XlaTensor):
        raise ShardingTypeError(
            f"{what}: t must be a tensor on the xla device, got "
            f"{type(t).__name__}{' on ' + str(t.device) if isinstance(t, torch.Tensor) else ''}; move it with t.to('xla')"
        )
    if t.requires_grad and torch.is_grad_enabled():
        raise ManualShardingError(
            f"{what}: t requires grad; manual sharding is not differentiable through torch autograd: "
            "pass t.detach() or run under torch.no_grad()"
        )
    return t


def _local(shape: Sequence[int], sharding: jax.sharding.Sharding, what: str) -> tuple[int, ...]:
    try:
        return local_shape(shape, sharding)
    except ManualOpsError as e:
        raise ManualShardingError(f"{what}: {e}") from None


def full_to_shard_shape(t: torch.Tensor) -> XlaTensor:
    """This device's block of the sharded tensor ``t``, a manually sharded tensor of the block's shape.

    Args:
        t: an xla tensor with a sharding (``mark_sharding``, or sharded data a
            program computed); a replicated annotation gives the whole tensor.

    Returns:
        A new tensor of shape ``t``'s block (e.g. ``(8, 1)`` for ``(8, 8)``
        sharded ``(None, "x")`` over 8 devices). Ops on it run per device;
        end with :func:`shard_to_full_shape`.

    Raises:
        ManualShardingError: ``t`` has no sharding, is already manual, a dim
            is not divisible by its shards, or ``t`` requires grad.

    Example:
        >>> import torch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import ShardingSpec, full_to_shard_shape, mark_sharding, shard_to_full_shape
        >>> mesh = get_1d_mesh("x")
        >>> x = mark_sharding(torch.arange(16.0, device="xla").reshape(2, 8), mesh, (None, "x"))
        >>> block = full_to_shard_shape(x)
        >>> block.shape
        torch.Size([2, 1])
        >>> y = shard_to_full_shape(block * 2, ShardingSpec(mesh, (None, "x")), (2, 8))
        >>> torch.equal(y.cpu(), x.cpu() * 2)
        True
    """
    what = "full_to_shard_shape"
    xt = _check(t, what)
    sharding = _effective_sharding(xt, computed=True)
    if sharding is None:
        raise ManualShardingError(
            f"{what}: t (shape {tuple(xt.shape)}) has no sharding, so it has no per-device block: "
            "annotate it first with mark_sharding(t, mesh, partition_spec)"
        )
    value = read_value(xt)
    if manual.is_manual(value):
        raise ManualShardingError(
            f"{what}: t (shape {tuple(xt.shape)}) is already manually sharded (it is each device's block); "
            "leave manual sharding with shard_to_full_shape first"
        )
    local = _local(xt.shape, sharding, what)
    return new_base(manual.record_full_to_shard(value, sharding, local), xt.dtype)


def _target(sharding: object, what: str) -> jax.sharding.Sharding:
    if isinstance(sharding, ShardingSpec):
        return sharding.mesh.named_sharding(sharding.partition_spec)
    if isinstance(sharding, jax.sharding.NamedSharding):
        if any(t == jax.sharding.AxisType.Manual for t in sharding.mesh.axis_types):
            raise ManualShardingError(f"{what}: the target sharding must not be manual, got {sharding}")
        return sharding
    _checks.fail(
        ShardingTypeError, what, "sharding", "a ShardingSpec(mesh, partition_spec) or a jax NamedSharding", sharding
    )


def shard_to_full_shape(t: torch.Tensor, sharding: Any, full_shape: Sequence[int]) -> XlaTensor:
    """The global tensor of ``full_shape``, sharded as ``sharding``, whose blocks are each device's ``t``.

    Args:
        t: a manually sharded xla tensor (from :func:`full_to_shard_shape`,
            ops on one, or :func:`mark_manual_sharding`).
        sharding: the result's sharding: a :class:`ShardingSpec` or a
            ``jax.sharding.NamedSharding``; its block of ``full_shape`` must be
            ``t``'s shape.
        full_shape: the result's shape.

    Returns:
        A new tensor annotated with ``sharding``.

    Raises:
        ManualShardingError: ``t`` is not manually sharded, its shape is not
            ``sharding``'s block of ``full_shape``, or it requires grad.
        ShardingTypeError: ``sharding`` is not a sharding.
    """
    what = "shard_to_full_shape"
    xt = _check(t, what)
    target = _target(sharding, what)
    full = _checks.check_int_sequence(full_shape, what, "full_shape", ShardingError, minimum=0)
    value = read_value(xt)
    if not manual.is_manual(value):
        raise ManualShardingError(
            f"{what}: t (shape {tuple(xt.shape)}) is not manually sharded; start with full_to_shard_shape(t) "
            "or mark_manual_sharding(t)"
        )
    block = _local(full, target, what)
    if block != tuple(xt.shape):
        raise ManualShardingError(
            f"{what}: t has shape {tuple(xt.shape)} but each device's block of full_shape {tuple(full)} "
            f"sharded as {target} is {block}; pass the full_shape and sharding t's blocks come from"
        )
    out = new_base(manual.record_shard_to_full(value, target, full), xt.dtype, sharding=target)
    storage_of(out).annotated = True  # reported as annotated (PyTorch/XLA gives the result this sharding spec)
    return out


def mark_manual_sharding(t: torch.Tensor) -> torch.Tensor:
    """Make the pending value of ``t`` manually sharded, in place (PyTorch/XLA's ``_mark_manual_sharding``).

    Each device's value of ``t`` is from then on taken as its own block; pair
    it with :func:`shard_to_full_shape`. Its annotation, if any, is dropped.

    Raises:
        ManualShardingError: ``t`` holds data (not a pending value; as in
            PyTorch/XLA, data cannot be marked manual), is a view, or requires grad.
    """
    what = "mark_manual_sharding"
    xt = _check(t, what)
    if view_chain(xt):
        raise ManualShardingError(
            f"{what}: t (shape {tuple(xt.shape)}) is a view; mark a tensor that owns its value (t.clone())"
        )
    st = storage_of(xt)
    value = st.value
    if not isinstance(value, LazyRef):
        raise ManualShardingError(
            f"{what}: t (shape {tuple(xt.shape)}) holds data, which cannot be marked manual (as in PyTorch/XLA); "
            "mark a value computed from it (e.g. t + 0), or use full_to_shard_shape(t) for a sharded tensor"
        )
    st.set(manual.record_mark_manual(value))
    st.sharding = None
    st.annotated = False
    return t
