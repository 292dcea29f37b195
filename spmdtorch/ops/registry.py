"""The ATen → JAX lowering table.

Each lowering is a plain function over JAX arrays with the ATen op's calling
convention (see ``register``). Lazy mode and ``spmdtorch.compile`` share this
one table. Ops without a lowering fall back to torch's decomposition tables in
``spmdtorch.tensor.dispatch``, which keeps the table near the core ATen opset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable
from typing import Any, TypeVar

import torch

__all__ = ["Lowering", "register", "register_meta", "get_lowering", "get_branch", "resolve_ops", "LOWERINGS"]

# A lowering, meta kernel or branch function: ATen calling conventions vary per op
# (tensors arrive as JAX arrays, scalars as numbers or 0-d arrays), so the table
# types them as callables of any arguments; each lowering annotates its own.
AnyFn = Callable[..., Any]
_F = TypeVar("_F", bound=AnyFn)


@dataclasses.dataclass(frozen=True)
class Lowering:
    """One registered lowering.

    Attributes:
        fn: ``fn(*args, **kwargs)`` with tensors replaced by JAX arrays.
        random: ``fn`` takes a ``key=`` keyword (a JAX PRNG key) for its draws.
        lift_scalars: ``Scalar``/``float`` arguments may be passed as 0-d JAX
            arrays (so a changing learning rate does not recompile); ops whose
            scalars decide output *shapes* (``arange``) set this to False.
        static_scalars: numbers that reach ``fn`` as Python numbers even where
            scalars are lifted, because the lowering takes a cheaper or more
            exact path for them (``x.pow(2)`` as ``x * x``, as torch does;
            a lifted exponent leaves XLA a general ``pow``). Each such value
            compiles its own program, so keep the set to a few common values.
        meta: ``meta(*args, **kwargs)`` on meta tensors, returning the
            outputs' metadata, used instead of torch's meta kernel where that
            kernel rejects calls the lowering supports (``_grouped_mm``'s
            enforces CUDA's bfloat16-only rule, while the CPU kernel and
            ``jax.lax.ragged_dot`` take every float type). None: torch's.
        branch: ``branch(*args, **kwargs)`` on the op's arguments as the
            caller passed them (numbers not yet lifted), returning a hashable
            value that reaches ``fn`` as the keyword ``branch`` (None: not
            passed). For a lowering whose *formula* depends on a number whose
            *value* stays a runtime input: ``lerp`` switches formula at
            ``|weight| < 0.5``, and deciding that on the host spares the
            program a per-element select between both formulas. Each branch
            value compiles its own program; the number itself does not.
    """

    fn: AnyFn
    random: bool = False
    lift_scalars: bool = True
    static_scalars: frozenset[int | float] = frozenset()
    meta: AnyFn | None = None
    branch: Callable[..., Hashable] | None = None


LOWERINGS: dict[torch._ops.OpOverload, Lowering] = {}

# Lowering.branch of each op and of its in-place variant (``lerp_.Scalar``
# has no lowering of its own: it runs ``lerp.Scalar``'s on the same arguments).
_BRANCHES: dict[torch._ops.OpOverload, Callable[..., Hashable]] = {}


def resolve_ops(name: str) -> list[torch._ops.OpOverload]:
    """Resolve ``"add.Tensor"`` (one overload) or ``"relu"`` (all overloads).

    Missing names resolve to ``[]`` rather than raising: ATen overloads come and
    go between torch releases, and a removed one must not break ``import``.
    """
    packet_name, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None:
        return []
    if overload:
        op = getattr(packet, overload, None)
        return [op] if op is not None else []
    ops: list[torch._ops.OpOverload] = []
    for ov in packet.overloads():
        op = getattr(packet, ov, None)
        if op is not None:
            ops.append(op)
    return ops


def register(
    *names: str,
    random: bool = False,
    lift_scalars: bool = True,
    static_scalars: Iterable[int | float] = (),
    meta: AnyFn | None = None,
    branch: Callable[..., Hashable] | None = None,
) -> Callable[[_F], _F]:
    """Register the decorated function as the lowering of ATen ops ``names``.

    Args:
        *names: ``"packet.overload"`` or ``"packet"`` (every overload).
        random: the lowering draws random numbers and takes ``key=``.
        lift_scalars: see ``Lowering.lift_scalars``.
        static_scalars: see ``Lowering.static_scalars``.
        meta: see ``Lowering.meta``.
        branch: see ``Lowering.branch``; it applies to the in-place variants
            of ``names`` (``lerp_.Scalar`` for ``lerp.Scalar``) too.

    Example:
        >>> import jax.numpy as jnp
        >>> library_relu = get_lowering(torch.ops.aten.relu.default)
        >>> @register("relu.default")
        ... def _relu(x):
        ...     return jnp.maximum(x, 0)
        >>> get_lowering(torch.ops.aten.relu.default).fn is _relu
        True
        >>> LOWERINGS[torch.ops.aten.relu.default] = library_relu  # put the library's back
    """

    def deco(fn: _F) -> _F:
        low = Lowering(
            fn,
            random=random,
            lift_scalars=lift_scalars,
            static_scalars=frozenset(static_scalars),
            meta=meta,
            branch=branch,
        )
        for name in names:
            ops = resolve_ops(name)
            for op in ops:
                LOWERINGS[op] = low
            # A lowering registered again without a branch must not be passed one.
            packet, _, overload = name.partition(".")
            for op in ops + resolve_ops(f"{packet}_.{overload}" if overload else f"{packet}_"):
                if branch is None:
                    _BRANCHES.pop(op, None)
                else:
                    _BRANCHES[op] = branch
        return fn

    return deco


_META_LIB: torch.library.Library | None = None


def register_meta(name: str) -> Callable[[_F], _F]:
    """Register the decorated function as the ``Meta`` kernel of ATen op ``name``.

    spmdtorch takes output shapes from torch's meta kernels; a few backward
    ops (``multi_margin_loss_backward``...) have none, so a lowering alone
    cannot be recorded. The kernel is only added where torch has none, so a
    later torch release that ships one keeps its own.

    Args:
        name: ``"packet"`` or ``"packet.overload"`` of an ``aten`` op.
    """

    def deco(fn: _F) -> _F:
        global _META_LIB
        for op in resolve_ops(name):
            qual = op._schema.name
            if torch._C._dispatch_has_kernel_for_dispatch_key(qual, "Meta"):
                continue
            if _META_LIB is None:
                _META_LIB = torch.library.Library("aten", "IMPL", "Meta")
            short = qual.split("::")[-1]
            _META_LIB.impl(short if op._overloadname == "default" else f"{short}.{op._overloadname}", fn)
        return fn

    return deco


def get_lowering(op: torch._ops.OpOverload) -> Lowering | None:
    """Return the lowering registered for ``op``, or None."""
    return LOWERINGS.get(op)


def get_branch(op: torch._ops.OpOverload) -> Callable[..., Hashable] | None:
    """``Lowering.branch`` of ``op``'s lowering, or of the lowering its in-place variant runs; else None."""
    return _BRANCHES.get(op)
