"""Manual sharding outside a ``shard_map`` region: XLA's ``SPMDFullToShardShape`` / ``SPMDShardToFullShape``.

A ``jax.shard_map`` body is one region: its values are per-device blocks
(XLA's *manual* sharding) and the partitioner leaves the ops inside alone.
PyTorch/XLA also exposes the two ends of such a region as single ops
(``_XLAC._spmd_full_to_shard_shape`` / ``_spmd_shard_to_full_shape``), with
ordinary ops between them running on the local blocks. This module gives JAX
three primitives with exactly that HLO, so that the lazy engine can record
them as ordinary nodes:

* :func:`full_to_shard`: a global value sharded as ``sharding`` becomes this
  device's block (a ``Sharding`` custom call with the full sharding, then
  ``SPMDFullToShardShape`` with ``{manual}``; the result has the local shape);
* :func:`shard_to_full`: each device's block becomes one global value of
  ``full_shape`` sharded as ``sharding`` (``Sharding`` with ``{manual}``,
  then ``SPMDShardToFullShape`` with the full sharding);
* :func:`mark_manual`: a value's sharding becomes ``{manual}`` (a ``Sharding``
  custom call), PyTorch/XLA's ``_mark_manual_sharding``.

Ops between the two ends are plain JAX ops on the local shapes; XLA's GSPMD
partitioner propagates ``{manual}`` through them, as for PyTorch/XLA. A
program holding these custom calls is partitioned by GSPMD even when JAX
enables Shardy (XLA says so in a warning: "Module has GSPMD attrs or ops, but
Shardy is enabled"); Shardy's own form (``sdy.manual_computation``) needs the
whole region as one op, which is what ``spmdtorch.sharding.shard_map`` records.

A manual value is never a program output on its own: XLA cannot turn a
``{manual}`` result into an array without ``SPMDShardToFullShape`` (the lazy
engine keeps such values out of its programs, ``spmdtorch.lazy.manual``).

The custom calls are built here with JAX's public MLIR bindings
(``jax.extend.mlir``), as JAX's own GSPMD lowering built them before JAX
0.12 removed it (JAX 0.12 lowers only to Shardy; XLA still partitions a
module holding these calls with GSPMD, and says so in the warning above).
One private JAX name remains, ``NamedSharding._to_xla_hlo_sharding`` (a
sharding's ``HloSharding``), reached through ``spmdtorch._jax_private``;
``tests/test_jax_private.py`` fails loudly if JAX moves it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo
from jax.interpreters import mlir as _public_mlir

from spmdtorch import _jax_private

__all__ = [
    "ManualOpsError",
    "full_to_shard",
    "local_shape",
    "mark_manual",
    "shard_to_full",
    "full_to_shard_p",
    "shard_to_full_p",
    "mark_manual_p",
]


class ManualOpsError(ValueError):
    """A shape or sharding the manual-sharding ops cannot take."""


def check_private_jax() -> None:
    """Raise ``ImportError`` naming what changed if JAX no longer has the private name used here.

    Called before the first lowering (so a JAX upgrade that moves it fails
    with its name, not deep inside XLA) and by the tests.
    """
    _jax_private.resolve("jax.sharding", "NamedSharding._to_xla_hlo_sharding")


_CHECKED: list[bool] = []


def _hlo_sharding(sharding: jax.sharding.Sharding, ndim: int) -> Any:
    if not _CHECKED:
        check_private_jax()
        _CHECKED.append(True)
    return sharding._to_xla_hlo_sharding(ndim)


def _manual_sharding() -> Any:
    return jax.extend.sharding.xla_client.HloSharding.manual()  # type: ignore[attr-defined]


def _custom_call(target: str, ctx: Any, x: Any, aval_out: Any, hlo_sharding: Any) -> Any:
    """XLA's ``target`` custom call on ``x`` carrying ``hlo_sharding`` (an ``mhlo.sharding`` attribute).

    What JAX's GSPMD lowering emitted for ``Sharding`` / ``SPMDFullToShardShape``
    / ``SPMDShardToFullShape``: api_version 1, no backend config, the sharding
    in HloSharding's text form (Shardy's constraint op cannot carry ``{manual}``).
    """
    op = stablehlo.CustomCallOp(
        [_public_mlir.aval_to_ir_type(ctx.module_context, aval_out)],
        [x],
        call_target_name=ir.StringAttr.get(target),
        has_side_effect=ir.BoolAttr.get(False),
        backend_config=ir.StringAttr.get(""),
        api_version=ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1),
    )
    op.attributes["mhlo.sharding"] = ir.StringAttr.get(repr(hlo_sharding))
    return op.result


def local_shape(shape: Sequence[int], sharding: jax.sharding.Sharding) -> tuple[int, ...]:
    """The block each device holds of a ``shape`` array sharded as ``sharding``.

    Raises:
        ManualOpsError: a dim the sharding does not divide evenly (a manual
            block has one shape on every device).
    """
    shape = tuple(int(d) for d in shape)
    if isinstance(sharding, jax.sharding.NamedSharding):
        mesh_shape = dict(sharding.mesh.shape)
        for dim, entry in enumerate(tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))):
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            parts = 1
            for a in axes:
                parts *= int(mesh_shape[a])
            if shape[dim] % parts:
                raise ManualOpsError(
                    f"dim {dim} of size {shape[dim]} is split {parts} ways (spec {tuple(sharding.spec)}), which "
                    "does not divide it: manual blocks must be equal on every device; pad the dim to a multiple "
                    f"of {parts} or shard another dim"
                )
    return tuple(int(d) for d in sharding.shard_shape(shape))


# --- the primitives ---------------------------------------------------------------------------------------------

full_to_shard_p = Primitive("full_to_shard")
shard_to_full_p = Primitive("shard_to_full")
mark_manual_p = Primitive("mark_manual")


def _full_to_shard_abstract(x: Any, *, sharding: jax.sharding.Sharding, local: tuple[int, ...]) -> Any:
    return jax.core.ShapedArray(local, x.dtype)


def _shard_to_full_abstract(x: Any, *, sharding: jax.sharding.Sharding, full: tuple[int, ...]) -> Any:
    return jax.core.ShapedArray(full, x.dtype)


def _mark_manual_abstract(x: Any) -> Any:
    return jax.core.ShapedArray(x.shape, x.dtype)


def _full_to_shard_lowering(ctx: Any, x: Any, *, sharding: jax.sharding.Sharding, local: tuple[int, ...]) -> Any:
    (aval_in,) = ctx.avals_in
    (aval_out,) = ctx.avals_out
    full = _custom_call("Sharding", ctx, x, aval_in, _hlo_sharding(sharding, aval_in.ndim))
    return [_custom_call("SPMDFullToShardShape", ctx, full, aval_out, _manual_sharding())]


def _shard_to_full_lowering(ctx: Any, x: Any, *, sharding: jax.sharding.Sharding, full: tuple[int, ...]) -> Any:
    (aval_in,) = ctx.avals_in
    (aval_out,) = ctx.avals_out
    manual = _custom_call("Sharding", ctx, x, aval_in, _manual_sharding())
    return [_custom_call("SPMDShardToFullShape", ctx, manual, aval_out, _hlo_sharding(sharding, aval_out.ndim))]


def _mark_manual_lowering(ctx: Any, x: Any) -> Any:
    (aval_in,) = ctx.avals_in
    return [_custom_call("Sharding", ctx, x, aval_in, _manual_sharding())]


full_to_shard_p.def_abstract_eval(_full_to_shard_abstract)
shard_to_full_p.def_abstract_eval(_shard_to_full_abstract)
mark_manual_p.def_abstract_eval(_mark_manual_abstract)
_public_mlir.register_lowering(full_to_shard_p, _full_to_shard_lowering)
_public_mlir.register_lowering(shard_to_full_p, _shard_to_full_lowering)
_public_mlir.register_lowering(mark_manual_p, _mark_manual_lowering)


def _check_sharding(sharding: object, what: str) -> jax.sharding.Sharding:
    if not isinstance(sharding, jax.sharding.Sharding):
        raise ManualOpsError(f"{what}: sharding must be a jax.sharding.Sharding, got {type(sharding).__name__}")
    return sharding


def full_to_shard(x: Any, *, sharding: jax.sharding.Sharding, local: Sequence[int]) -> Any:
    """This device's block of ``x`` (sharded as ``sharding``), of shape ``local`` (see :func:`local_shape`).

    Only inside a jitted program (the result is a manual value, which needs
    :func:`shard_to_full` before it can leave the program).
    """
    return full_to_shard_p.bind(x, sharding=_check_sharding(sharding, "full_to_shard"), local=tuple(local))


def shard_to_full(x: Any, *, sharding: jax.sharding.Sharding, full: Sequence[int]) -> Any:
    """The global value of shape ``full``, sharded as ``sharding``, whose blocks are each device's ``x``."""
    return shard_to_full_p.bind(x, sharding=_check_sharding(sharding, "shard_to_full"), full=tuple(full))


def mark_manual(x: Any) -> Any:
    """``x`` with the ``{manual}`` sharding: from here on each device's value is its own block."""
    return mark_manual_p.bind(x)
