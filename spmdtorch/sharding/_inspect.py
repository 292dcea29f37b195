"""Inspecting a tensor's sharding: PyTorch/XLA's strings, types and pictures."""

from __future__ import annotations

from typing import Any

import jax
import torch

from spmdtorch import _checks
from spmdtorch.lazy import manual
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.sharding._hlo_sharding import hlo_sharding_string
from spmdtorch.sharding._marking import CLEARED_AT, ShardingTypeError, _check_tensor, view_constraint
from spmdtorch.sharding._sharding_type import ShardingType, sharding_type_of
from spmdtorch.sharding._visualize import visualize_sharding
from spmdtorch.tensor import multihost, storage_of, view_chain
from spmdtorch.tensor.dispatch import concrete_value, read_value
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["get_sharding_spec", "sharding_type", "visualize_tensor_sharding"]


def _effective_sharding(t: torch.Tensor, computed: bool = False) -> jax.sharding.Sharding | None:
    """The annotation, else the placement of concrete non-replicated data, else None.

    Matches PyTorch/XLA: an unannotated tensor that was never sharded reports
    no sharding, while the output of a sharded program reports the sharding
    XLA gave it; after ``clear_sharding`` a tensor reports none. With
    ``computed``, a replicated program result reports its (replicated)
    placement too, as PyTorch/XLA reports every program output's sharding
    (see ``get_sharding_spec``).
    """
    if isinstance(t, XlaTensor) and view_chain(t):
        step = view_constraint(t)
        if step is not None:  # an annotated view (or one clear_sharding left replicated)
            return step.sharding if step.annotated else None
        # A view of a manual value is manual (it cannot be computed on its own).
        view_manual = manual.manual_sharding(read_value(t)) if isinstance(storage_of(t).value, LazyRef) else None
        if view_manual is not None:
            return view_manual
        # Another view (gradients often are: mm's backward returns .t() of a result):
        # report the placement its computed value gets.
        computed_value = concrete_value(t)
        if computed_value.is_fully_replicated:
            return None
        view_sharding: jax.sharding.Sharding = computed_value.sharding
        return view_sharding
    st = storage_of(_check_tensor(t, "get_sharding_spec"))
    if st.host is not None:
        return None  # still on the host (deferred upload): placed nowhere yet, and asking must not upload it
    if isinstance(st.value, LazyRef):
        manual_sharding = manual.manual_sharding(st.value)  # between full_to_shard and shard_to_full
        if manual_sharding is not None:
            return manual_sharding
    if st.annotated:
        annotation: jax.sharding.Sharding | None = st.sharding
        return annotation
    value: Any = st.value  # a jax.Array or a LazyRef (which has no sharding)
    sharding: jax.sharding.Sharding | None = getattr(value, "sharding", None)
    if sharding is None:
        return None
    if value.is_fully_replicated and not (computed and _program_result(st)):
        return None
    return sharding


def _program_result(st: Any) -> bool:
    """Whether the storage's concrete value came out of a program (not host data, not what clear_sharding left)."""
    return not multihost.placed_from_host(st.value) and CLEARED_AT.get(st) != st.version


def get_sharding_spec(t: torch.Tensor, *, computed: bool = False) -> str:
    """PyTorch/XLA's HLO sharding string for ``t`` (``""`` when it has none).

    Args:
        t: an xla tensor.
        computed: also report the placement of a replicated value that a
            program computed (``"{replicated}"``), as
            ``torch_xla._XLAC._get_xla_sharding_spec`` does for every program
            output in SPMD mode. Data transferred from the host, a pending
            value and what ``clear_sharding`` left still report ``""``, as
            there. Off, an unannotated replicated tensor always reports ``""``.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.mesh import get_1d_mesh
        >>> from spmdtorch.sharding import mark_sharding, get_sharding_spec
        >>> t = mark_sharding(torch.zeros(8, 2, device="xla"), get_1d_mesh("d"), ("d", None))
        >>> get_sharding_spec(t)
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
        >>> x = torch.ones(2, 2).to("xla")
        >>> get_sharding_spec(x, computed=True)  # host data
        ''
        >>> y = x @ x
        >>> spmdtorch.sync()
        >>> get_sharding_spec(y, computed=True), get_sharding_spec(y)
        ('{replicated}', '')
    """
    computed = _checks.check_bool(computed, "get_sharding_spec", "computed", ShardingTypeError)
    sharding = _effective_sharding(t, computed)
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
