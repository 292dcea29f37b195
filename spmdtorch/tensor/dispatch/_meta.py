"""Shape inference: torch's meta kernels, cached by argument signature.

Python meta kernels are slow (tens of microseconds), and a training step
records the same few hundred signatures every time: the outputs' metadata is
computed once per ``Args.key`` and kept as a ``MetaSpec``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import torch

from spmdtorch import _dtypes
from spmdtorch.lazy import caches, metrics
from spmdtorch.tensor.xla_tensor import PYTHON_KEY, MetaFlag, MetaKey, XlaTensor, contiguous_strides

if TYPE_CHECKING:
    from spmdtorch.lazy import ViewStep
    from spmdtorch.lazy.graph import Aval
    from spmdtorch.ops.registry import Lowering
    from spmdtorch.tensor._facts import Op, OpFacts

__all__ = ["META_CACHE", "META_CACHE_MAX", "MetaSpec", "TensorSpec", "meta_miss", "meta_outputs"]

# Output specs by argument signature. Bounded: a program whose static
# arguments never repeat (a loop over slice offsets) must not grow it forever.
META_CACHE_MAX = 1 << 14
META_CACHE: caches.BoundedCache[Hashable, MetaSpec] = caches.bounded("tensor.dispatch.meta_cache", META_CACHE_MAX)
_COUNTERS = metrics.counters


class TensorSpec(NamedTuple):
    """One tensor output as torch's meta kernel made it."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    contiguous_stride: tuple[int, ...]  # the strides of a fresh contiguous tensor of this shape


@dataclasses.dataclass(slots=True, eq=False)
class MetaSpec:
    """What torch's meta kernel says about an op's outputs, precomputed once.

    Attributes:
        specs: a ``TensorSpec`` per output (None for a non-tensor output).
        multi: the op returns a tuple/list.
        avals: ``((shape, jax dtype), ...)`` of the tensor outputs.
        dense_mks: each output's ``MetaKey`` as a fresh contiguous tensor (a
            lowered op's result).
        view_mks: each output's ``MetaKey`` as the view the spec describes.
        sig: the node signature of a lowered op (filled by its first caller).
        steps: the ``ViewStep``\\ s of a view op (filled by its first caller).
        twin: of an in-place op, its functional twin's ``(Lowering, MetaSpec)``,
            or False where the in-place fast path does not apply (filled by its
            first caller). The cache key holds the op and its template, so
            what a first caller fills is valid for every hit.
    """

    # Per output a TensorSpec / MetaKey, or None for a non-tensor output;
    # typed Any since the dispatch paths index the outputs they know are tensors.
    specs: tuple[Any, ...]
    multi: bool
    avals: tuple[Aval, ...] = ()
    dense_mks: tuple[Any, ...] = ()
    view_mks: tuple[Any, ...] = ()
    sig: int | None = None
    steps: tuple[ViewStep, ...] | None = None
    twin: tuple[Lowering, MetaSpec] | Literal[False] | None = None

    def __post_init__(self) -> None:
        specs = self.specs
        self.avals = tuple((sp.shape, _dtypes.to_jax_dtype(sp.dtype)) for sp in specs if sp is not None)
        self.dense_mks = tuple(
            None if sp is None else MetaKey(sp.shape, sp.contiguous_stride, 0, sp.dtype) for sp in specs
        )
        self.view_mks = tuple(None if sp is None else MetaKey(sp.shape, sp.stride, sp.offset, sp.dtype) for sp in specs)


def _run_meta(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], facts: OpFacts) -> Any:
    meta_kwargs = kwargs
    if facts.has_device and kwargs.get("device") is not None:
        meta_kwargs = dict(kwargs, device="meta")
    meta_args = [_to_meta(a) for a in args]
    meta_kwargs = {k: _to_meta(v) for k, v in meta_kwargs.items()}
    low = facts.lowering
    if low is not None and low.meta is not None:  # the lowering's own shape rule (Lowering.meta)
        func = low.meta
    MetaFlag.active = True
    try:
        with torch._C._ExcludeDispatchKeyGuard(PYTHON_KEY):
            return func(*meta_args, **meta_kwargs)
    finally:
        MetaFlag.active = False


def _to_meta(a: Any) -> Any:
    if isinstance(a, XlaTensor):
        return a
    if isinstance(a, torch.Tensor):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_to_meta(x) for x in a)
    return a


def _tensor_spec(o: torch.Tensor) -> TensorSpec:
    shape = tuple(o.shape)
    # torch types storage_offset() int | SymInt; a meta kernel's output (no symbolic shapes) has an int.
    return TensorSpec(
        shape,
        tuple(o.stride()),
        o.storage_offset(),  # type: ignore[arg-type]
        o.dtype,
        contiguous_strides(shape),
    )


def _meta_spec(out: object) -> MetaSpec | None:
    if isinstance(out, torch.Tensor):
        return MetaSpec((_tensor_spec(out),), False)
    if isinstance(out, (tuple, list)):
        return MetaSpec(tuple(_tensor_spec(o) if isinstance(o, torch.Tensor) else None for o in out), True)
    return None


def meta_outputs(func: Op, args: Sequence[Any], kwargs: dict[str, Any], facts: OpFacts, key: Hashable) -> MetaSpec:
    """The ``MetaSpec`` of ``func(*args, **kwargs)`` (``key``: its ``Args.key``)."""
    hit = META_CACHE.get(key)
    if hit is not None:
        _COUNTERS["MetaCacheHit"] += 1
        return hit
    return meta_miss(func, args, kwargs, facts, key)


def meta_miss(func: Op, args: Sequence[Any], kwargs: dict[str, Any], facts: OpFacts, key: Hashable) -> MetaSpec:
    """``meta_outputs`` after a cache miss (the hot paths look the cache up inline)."""
    out = _run_meta(func, args, kwargs, facts)
    spec = _meta_spec(out)
    if spec is None:
        raise NotImplementedError(f"{func} returned a non-tensor on meta; spmdtorch cannot record it")
    try:
        META_CACHE.put(key, spec)
    except TypeError:  # an unhashable static argument: not cached, counted
        META_CACHE.bypasses += 1
    return spec
