"""Manual-sharding nodes in the lazy graph, and the rule that keeps their values out of program outputs.

PyTorch/XLA's ``_spmd_full_to_shard_shape`` / ``_spmd_shard_to_full_shape`` /
``_mark_manual_sharding`` are recorded here as ordinary nodes lowering to the
JAX primitives of :mod:`spmdtorch.ops.manual`. Between an entry
(``full_to_shard`` or ``mark_manual``) and the ``shard_to_full`` that leaves,
every value is *manual*: each device holds its own block. XLA has no way to
return such a value from a program (it needs ``SPMDShardToFullShape`` to
become an array again), so:

* a barrier (``sync``) leaves pending manual values out of its program; they
  stay pending, and a later ``shard_to_full`` computes from them;
* reading one on its own (``evaluate``) raises :class:`ManualValueError`
  instead of the assertion failure XLA gives.

Which values are manual is found by walking the graph back to the nearest
entry or exit; the walk runs only while some entry node is alive (a weak set),
so programs without manual sharding pay one ``len()`` per barrier.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import jax

from spmdtorch.lazy._placement import replicated_sharding
from spmdtorch.lazy._record import record
from spmdtorch.lazy.graph import LazyRef, Node, Slot
from spmdtorch.ops import manual as _ops

__all__ = [
    "FULL_TO_SHARD",
    "MARK_MANUAL",
    "SHARD_TO_FULL",
    "ManualValueError",
    "check_not_manual",
    "is_manual",
    "manual_sharding",
    "record_full_to_shard",
    "record_mark_manual",
    "record_shard_to_full",
    "split_manual",
]

#: Node names (graph keys hold them with the node's sharding and shapes).
FULL_TO_SHARD = "spmd_full_to_shard"
SHARD_TO_FULL = "spmd_shard_to_full"
MARK_MANUAL = "spmd_mark_manual"
#: Names of nodes that carry a ``sharding`` keyword of the user's mesh (the executor picks the program's mesh).
WITH_SHARDING = (FULL_TO_SHARD, SHARD_TO_FULL)

# Entry nodes alive now: while empty no value can be manual and no walk runs.
_ENTRIES: weakref.WeakSet[Node] = weakref.WeakSet()


class ManualValueError(RuntimeError):
    """A manually sharded value was asked for as a program output (read, or computed on its own)."""


def record_full_to_shard(value: Any, sharding: jax.sharding.Sharding, local: Sequence[int]) -> LazyRef:
    """Record ``ops.manual.full_to_shard(value)``: this device's ``local``-shaped block of ``value``."""
    local = tuple(int(d) for d in local)
    ref: LazyRef = record(
        _ops.full_to_shard,
        FULL_TO_SHARD,
        ((Slot(0),), (("sharding", sharding), ("local", local))),
        [value],
        ((local, value.dtype),),
    )
    _ENTRIES.add(ref.node)
    return ref


def record_mark_manual(value: Any) -> LazyRef:
    """Record ``ops.manual.mark_manual(value)``: the same value, sharded ``{manual}``."""
    ref: LazyRef = record(
        _ops.mark_manual, MARK_MANUAL, ((Slot(0),), ()), [value], ((tuple(value.shape), value.dtype),)
    )
    _ENTRIES.add(ref.node)
    return ref


def record_shard_to_full(value: Any, sharding: jax.sharding.Sharding, full: Sequence[int]) -> LazyRef:
    """Record ``ops.manual.shard_to_full(value)``: the ``full``-shaped value whose blocks are each device's ``value``."""
    full = tuple(int(d) for d in full)
    ref: LazyRef = record(
        _ops.shard_to_full,
        SHARD_TO_FULL,
        ((Slot(0),), (("sharding", sharding), ("full", full))),
        [value],
        ((full, value.dtype),),
    )
    return ref


def _entries(refs: Iterable[Any]) -> list[Node | None]:
    """Per value: the entry node that makes it manual, else None (concrete data is never manual)."""
    refs = list(refs)
    if not _ENTRIES:
        return [None] * len(refs)
    memo: dict[int, Node | None] = {}
    out: list[Node | None] = []
    for r in refs:
        if type(r) is not LazyRef:
            out.append(None)
            continue
        # Iterative post-order (graphs are deep): a node's entry is decided once its inputs' are.
        stack = [r.node]
        while stack:
            n = stack[-1]
            if id(n) in memo:
                stack.pop()
                continue
            if n.name == SHARD_TO_FULL:
                memo[id(n)] = None
                stack.pop()
                continue
            if n.name == FULL_TO_SHARD:
                memo[id(n)] = n
                stack.pop()
                continue
            todo = [i.node for i in n.inputs if type(i) is LazyRef and id(i.node) not in memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            found = next((memo[id(i.node)] for i in n.inputs if type(i) is LazyRef and memo[id(i.node)]), None)
            # mark_manual of an already-manual value keeps that value's entry (and its mesh).
            memo[id(n)] = found if found is not None or n.name != MARK_MANUAL else n
        out.append(memo[id(r.node)])
    return out


def is_manual(value: Any) -> bool:
    """Whether ``value`` (a ``LazyRef`` or concrete array) is a manually sharded pending value."""
    return _entries([value])[0] is not None


def manual_sharding(value: Any) -> jax.sharding.NamedSharding | None:
    """The ``{manual}`` sharding of a manual ``value``, else None.

    On the mesh of the ``full_to_shard`` that made it manual (every axis
    ``Manual``), or on the default placement's devices for a value only
    ``mark_manual`` made manual.
    """
    entry = _entries([value])[0]
    if entry is None:
        return None
    sharding = dict(entry.template[1]).get("sharding") if entry.name == FULL_TO_SHARD else None
    mesh = sharding.mesh if isinstance(sharding, jax.sharding.NamedSharding) else replicated_sharding().mesh
    manual_mesh = jax.sharding.Mesh(
        mesh.devices, mesh.axis_names, axis_types=(jax.sharding.AxisType.Manual,) * len(mesh.axis_names)
    )
    return jax.sharding.NamedSharding(manual_mesh, jax.sharding.PartitionSpec())


def split_manual(storages: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Pending ``storages`` split by whether their values are manual: ``(not manual, manual)``, order kept."""
    if not _ENTRIES:
        return list(storages), []
    keep: list[Any] = []
    manual: list[Any] = []
    for st, entry in zip(storages, _entries([st.value for st in storages])):
        (manual if entry is not None else keep).append(st)
    return keep, manual


def check_not_manual(refs: Sequence[Any], what: str) -> None:
    """Raise :class:`ManualValueError` if any of ``refs`` is manual (XLA cannot return it from a program).

    Args:
        refs: the program's outputs.
        what: what was asked for, for the message.
    """
    for k, entry in enumerate(_entries(refs)):
        if entry is not None:
            shape = tuple(refs[k].shape)
            raise ManualValueError(
                f"{what}: output {k} (shape {shape}) is manually sharded (each device holds its own block, since "
                f"{entry.name}); XLA cannot return such a value from a program. Leave manual sharding first: "
                "spmdtorch.sharding.shard_to_full_shape(t, sharding, full_shape) "
                "(torch_xla: xs.disable_manual_sharding / _XLAC._spmd_shard_to_full_shape)"
            )
