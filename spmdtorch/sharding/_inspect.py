"""Inspecting a tensor's sharding: PyTorch/XLA's strings, types and pictures."""

from __future__ import annotations

from typing import Any

import jax
import torch

from spmdtorch.sharding._hlo_sharding import hlo_sharding_string
from spmdtorch.sharding._marking import _check_tensor, view_constraint
from spmdtorch.sharding._sharding_type import ShardingType, sharding_type_of
from spmdtorch.sharding._visualize import visualize_sharding
from spmdtorch.tensor.dispatch import concrete_value
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["get_sharding_spec", "sharding_type", "visualize_tensor_sharding"]


def _effective_sharding(t: torch.Tensor) -> jax.sharding.Sharding | None:
    """The annotation, else the placement of concrete non-replicated data, else None.

    Matches PyTorch/XLA: an unannotated tensor that was never sharded reports
    no sharding, while the output of a sharded program reports the sharding
    XLA gave it; after ``clear_sharding`` a tensor reports none.
    """
    if isinstance(t, XlaTensor) and t._chain:
        step = view_constraint(t)
        if step is not None:  # an annotated view (or one clear_sharding left replicated)
            return step.sharding if step.annotated else None
        # Another view (gradients often are: mm's backward returns .t() of a result):
        # report the placement its computed value gets.
        computed = concrete_value(t)
        if computed.is_fully_replicated:
            return None
        view_sharding: jax.sharding.Sharding = computed.sharding
        return view_sharding
    st = _check_tensor(t, "get_sharding_spec")._st
    if st.annotated:
        annotation: jax.sharding.Sharding | None = st.sharding
        return annotation
    value: Any = st.value  # a jax.Array or a LazyRef (which has no sharding)
    sharding: jax.sharding.Sharding | None = getattr(value, "sharding", None)
    if sharding is None or value.is_fully_replicated:
        return None
    return sharding


def get_sharding_spec(t: torch.Tensor) -> str:
    """PyTorch/XLA's HLO sharding string for ``t`` (``""`` when it has none).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding, get_sharding_spec
        >>> t = mark_sharding(torch.zeros(8, 2, device="xla"), get_1d_mesh("d"), ("d", None))
        >>> get_sharding_spec(t)
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
    """
    sharding = _effective_sharding(t)
    if sharding is None:
        return ""
    return hlo_sharding_string(sharding, t.dim())


def sharding_type(t: torch.Tensor) -> ShardingType:
    """``ShardingType`` of ``t`` (REPLICATED when it has no sharding)."""
    sharding = _effective_sharding(t)
    if sharding is None:
        return ShardingType.REPLICATED
    return sharding_type_of(sharding, t.dim())


def visualize_tensor_sharding(t: torch.Tensor, **kwargs: Any) -> Any:
    """Draw which device holds which block of ``t`` (a rich table; see ``visualize_sharding``)."""
    return visualize_sharding(get_sharding_spec(t), shape=tuple(t.shape), **kwargs)
