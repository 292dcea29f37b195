"""Turning pending lazy values into one compiled program, and running it.

``sync()`` gathers every live storage with a pending value, walks the graph
behind them once (post-order), builds a structural key — op names, static
arguments, input wiring, and the shape/dtype/sharding of each input — and
looks it up in the compile cache. A training loop therefore compiles once per
distinct step structure. Inputs whose storage was overwritten in this step are
donated so that parameters are not held twice. Executions are asynchronous;
at most ``SPMDTORCH_MAX_IN_FLIGHT`` are queued so that XLA's CPU client cannot
deadlock on collectives (docs/design.md, hazard "CPU collective deadlock").

The state this module keeps between steps (compile cache, in-flight queue,
owed calls, scalar arrays) lives on ``lazy._engine.ENGINE``; the knobs come
from ``spmdtorch.config``.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import re
import struct
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spmdtorch import config
from spmdtorch._jax_private import convert_element_type as _convert_element_type  # weak-typed scalars
from spmdtorch.lazy import _precision, _profiling, _storage, caches, contract, keys, manual, metrics, padding, rng
from spmdtorch.lazy._engine import ENGINE, SCALAR_CACHE_MAX
from spmdtorch.lazy._placement import replicated_sharding
from spmdtorch.lazy._record import record
from spmdtorch.lazy.constraint import CONSTRAINT
from spmdtorch.lazy.graph import LazyRef, Node, Scalar, Slot, fill

__all__ = ["sync", "evaluate", "lower", "lower_program", "LoweredProgram", "LoweringError"]

log = logging.getLogger("spmdtorch.compile")

# Blocking on the oldest result once ENGINE.max_in_flight executions are queued
# keeps the CPU client's thread pool from filling with executions waiting on
# collectives.
#
# ENGINE.inflight, per queued execution: (its sentinel, its donated inputs). The sentinel is a
# tiny extra output of every program, ready when the execution is done and
# never handed to a user, so it is never donated. Holding real outputs instead
# would keep the values later steps replaced (last steps' gradients) alive
# until their entry leaves. The donated inputs ride along because dropping
# the last reference to an array while the execution that took its buffer
# still runs costs the host more than dropping it once that execution is done
# (their buffers are gone: they pin no memory).

# XLA says so when a donated input has no output of its shape to reuse; that
# is harmless, and a per-call catch_warnings would cost more than the call.
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class LoweringError(RuntimeError):
    """A lowering returned a value whose shape disagrees with torch's meta kernel."""


# A node input in a plan: ``(node index, output index)`` of an earlier node, or
# ``-1 - leaf index`` for a program input (see ``PlanKey``).
InputCode = tuple[int, int] | int


class PlanKey(NamedTuple):
    """A plan's structure: what its program computes, independent of input values.

    Flat tuples of ints, so hashing and comparing the key of a whole training
    step is done in C without descending into nested tuples (a deep
    decoder's step has ~9,000 nodes: a tuple of nested ``(sig, draw, codes)``
    entries cost ~12 ms per step to hash and compare, the flat tuple well
    under a millisecond).

    Attributes:
        entries: per node, in plan order, ``sig, n, code_1 ... code_n``
            flattened into one tuple: the signature is an int standing for
            its name and static arguments (``lazy.keys``); an input code is a
            negative int ``-1 - leaf index`` for a program input, or two
            non-negative ints ``node index, output index`` for an earlier
            node's output (so the flat form reads back unambiguously).
        random_order: the indices of the random nodes, in draw order (their
            draw ranks; see ``graph.Node.draw``).
        outputs: ``(node index, output index)`` per program output.
    """

    entries: tuple[int, ...]
    random_order: tuple[int, ...]
    outputs: tuple[tuple[int, int], ...]


def _node_starts(entries: tuple[int, ...]) -> list[int]:
    """Where each node's record starts in ``PlanKey.entries`` (for messages)."""
    starts = []
    pos = 0
    while pos < len(entries):
        starts.append(pos)
        n = entries[pos + 1]
        pos += 2
        for _ in range(n):
            pos += 1 if entries[pos] < 0 else 2
    return starts


class ProgramKey(NamedTuple):
    """The compile cache's key: a plan's structure plus what its inputs and outputs look like.

    Attributes:
        plan: the :class:`PlanKey`.
        leaves: per leaf ``(shape, dtype, sharding)``, or ``("S", type)`` for a Python scalar.
        donate: per leaf, whether its buffer is donated.
        out_shardings: per output, its sharding (None: XLA's choice).
        matmul_precision: the float32 matmul precision the program is built with (``_precision``).
        recycle: positions of the outputs that take a buffer to reuse (see :class:`_Program`).
        baked: ``(leaf index, kind, bytes)`` of each Python number compiled
            into the program as a constant (``bake=True``, see :class:`_Layout`).
        placement_mode: the input placement policy's mode the program was
            compiled under (:class:`InputPlacement`; None: no policy applied).
    """

    plan: PlanKey
    leaves: tuple[tuple[Any, ...], ...]
    donate: tuple[bool, ...]
    out_shardings: tuple[jax.sharding.Sharding | None, ...]
    matmul_precision: str
    recycle: tuple[int, ...] = ()
    baked: tuple[tuple[int, str, bytes], ...] = ()
    placement_mode: Hashable = None


class _Plan:
    """The graph behind a set of roots, in post-order, with its cache key (:class:`PlanKey`).

    Built in one place (``__init__``, one walk); ``pair_outputs`` reorders the
    outputs once before compilation.

    Attributes:
        nodes: the graph's nodes, post-order, common subexpressions merged.
        codes: per node, its input codes (see :class:`PlanKey`).
        leaves: the program's inputs: ``jax.Array`` or ``Scalar``.
        outputs: ``(node index, output index)`` per output.
        key: the :class:`PlanKey`.
        has_random: some node draws random numbers (the program takes a key).
        draws: per node, its rank among the random nodes (-1: not random).
        donatable: leaf positions that may be donated (None: every unheld array).
    """

    __slots__ = ("nodes", "codes", "leaves", "outputs", "key", "has_random", "draws", "donatable")

    nodes: list[Node]
    codes: list[tuple[InputCode, ...]]
    # jax.Array | Scalar (tensor.subgraph puts its own placeholders here while it builds a body).
    leaves: list[Any]
    outputs: tuple[tuple[int, int], ...]
    key: PlanKey
    has_random: bool
    draws: list[int]
    donatable: frozenset[int] | None

    def __init__(self, refs: Sequence[LazyRef]) -> None:  # noqa: PLR0915  (why: the plan's graph walk runs per sync on the hot path, one loop over locals; helpers would add a call per node)
        # Post-order, depth first, each node's inputs scanned once (an
        # iterator per open node). Inputs are visited last to first, the order
        # this walk has always had: the program's op order follows it, and
        # XLA's CPU scheduler keeps less alive with it than with creation
        # order (a test's FSDP step peaked at 1.19x vs 1.46x the parameters).
        # A node is coded as it is finished (its inputs are all coded by then),
        # in one pass: this runs once per step over the whole graph.
        #
        # Common subexpressions: a node with the same signature reading the
        # same inputs as an earlier one computes the same values (nodes are
        # pure; random nodes, which are not, are never merged), so it becomes
        # that node. XLA would merge them inside the program anyway; merging
        # here also makes the program's *outputs* equal, and equal outputs
        # share one buffer (``run_plan``). That is what lets AdamW's
        # per-parameter step counters (created equal, updated alike) stay one
        # array, so the bias corrections are computed once, not per parameter.
        node_ids: dict[int, int] = {}  # id(node) -> its index in ``kept`` (a merged node: the one it became)
        leaf_codes: dict[int, int] = {}
        leaves: list[jax.Array | Scalar] = []  # see the leaves attribute
        codes: list[tuple[InputCode, ...]] = []
        flat: list[int] = []  # PlanKey.entries
        kept: list[Node] = []
        seen: dict[
            tuple[int, tuple[InputCode, ...]], int
        ] = {}  # (sig, codes) -> index in ``kept`` (common subexpressions)
        has_random = False
        for ref in refs:
            root = ref.node
            if id(root) in node_ids:
                continue
            # Two parallel stacks (open nodes, their input iterators): no tuple per node.
            stack = [root]
            its = [reversed(root.inputs)]
            while stack:
                for i in its[-1]:
                    if type(i) is LazyRef:
                        m = i.node
                        if id(m) not in node_ids:
                            stack.append(m)
                            its.append(reversed(m.inputs))
                            break
                else:
                    its.pop()
                    n = stack.pop()
                    sig = n.sig
                    if sig is None:
                        sig = n.sig = keys.node_sig(n.name, n.static_key)
                    # The node's flat record is written as its codes are made,
                    # and taken back if the node merges into an earlier one.
                    mark = len(flat)
                    flat.append(sig)
                    flat.append(len(n.inputs))
                    cl: list[InputCode] = []
                    for i in n.inputs:
                        if type(i) is LazyRef:
                            j = node_ids[id(i.node)]
                            k = i.index
                            cl.append((j, k))
                            flat.append(j)
                            flat.append(k)
                        else:
                            code = leaf_codes.get(id(i))
                            if code is None:
                                code = leaf_codes[id(i)] = -1 - len(leaves)
                                leaves.append(i)
                            cl.append(code)
                            flat.append(code)
                    c = tuple(cl)
                    if n.random:
                        has_random = True
                    else:
                        same = seen.get((sig, c))
                        if same is not None:
                            node_ids[id(n)] = same
                            del flat[mark:]
                            continue
                        seen[(sig, c)] = len(kept)
                    node_ids[id(n)] = len(kept)
                    kept.append(n)
                    codes.append(c)
        nodes = kept
        # A random node's key is folded from its rank in recording order (see
        # graph.Node.draw), not from its position in the graph, so that the
        # values do not depend on sharding constraints or output order.
        draws = [-1] * len(nodes)
        random_order: tuple[int, ...] = ()
        if has_random:
            order = sorted((n.draw, i) for i, n in enumerate(nodes) if n.random)
            for rank, (_, i) in enumerate(order):
                draws[i] = rank
            random_order = tuple(i for _, i in order)
        self.draws = draws
        self.nodes = nodes
        self.codes = codes
        self.leaves = leaves
        self.outputs = tuple((node_ids[id(r.node)], r.index) for r in refs)
        self.has_random = has_random
        self.donatable = None  # leaf positions that may be donated (None: every unheld array)
        self.key = PlanKey(tuple(flat), random_order, self.outputs)

    def pair_outputs(self, storages: list[_storage.Storage]) -> list[_storage.Storage]:
        """Order the outputs so that each donated input's buffer goes to its own storage's new value.

        JAX pairs donated inputs with outputs greedily, in argument order, by
        shape and dtype. A training step has many same-shaped arrays
        (parameters, gradients, two Adam moments...); unless outputs come in
        the order of the inputs they replace, a parameter's buffer is handed
        to, say, its first moment, and XLA must copy every parameter (a tiny
        decoder's step made 70 such copies). Outputs whose storage replaced
        an input leaf come first, in leaf order; only those leaves are donated.
        Returns ``storages`` in the new output order.
        """
        leaf_pos = {id(leaf): i for i, leaf in enumerate(self.leaves) if type(leaf) is not Scalar}
        pairs = []
        for k, st in enumerate(storages):
            i = leaf_pos.get(st.prev) if st is not None and st.prev is not None else None
            if i is not None and _storage.holder_of(self.leaves[i]) is None:
                pairs.append((i, k))
        pairs.sort()
        taken = {k for _, k in pairs}
        order = [k for _, k in pairs] + [k for k in range(len(storages)) if k not in taken]
        self.outputs = tuple(self.outputs[k] for k in order)
        self.donatable = frozenset(i for i, _ in pairs)
        self.key = self.key._replace(outputs=self.outputs)
        return [storages[k] for k in order]


class InputPlacement(NamedTuple):
    """An input placement policy's decision for one program (:class:`InputPlacementPolicy`).

    Attributes:
        mode: what the policy is set to (hashable): part of the program's
            cache key, so a program compiled under one mode is not reused
            under another.
        counter: the metric counted once per compilation under this mode.
        targets: ``{candidate index: sharding}``: the candidates (the list the
            policy was given) to re-place, each onto its sharding.
    """

    mode: Any
    counter: str
    targets: dict[int, jax.sharding.Sharding]


class InputPlacementPolicy(NamedTuple):
    """A rule for placing a program's default-placed inputs (see :data:`INPUT_PLACEMENT_POLICIES`).

    Attributes:
        enabled: whether the rule is switched on now (called for every
            program run: must be cheap).
        place: ``place(candidates, mesh)`` -> :class:`InputPlacement`, or
            None when it turned out to be off after all.
    """

    enabled: Callable[[], bool]
    place: Callable[[list[jax.Array], Any], InputPlacement | None]


#: Rules for placing a program's default-placed inputs, registered by higher
#: layers (``spmdtorch.plan`` registers spmdtorch's auto-sharding). The first
#: enabled one's ``place(candidates, mesh)`` is called before a program is
#: chosen, with the program's input arrays that are replicated on the default
#: placement, held (or replaced in place) by a tensor, and not annotated by
#: the user, and the user's mesh the program already uses (None: none; when
#: given, targets must be on it, as one program has one mesh). The executor
#: re-places each target once, for every storage holding it (:func:`rehome`),
#: so the placement decision stays above this layer.
INPUT_PLACEMENT_POLICIES: list[InputPlacementPolicy] = []


def _placement_candidates(
    plan: _Plan, storages: Sequence[_storage.Storage | None]
) -> tuple[list[int], dict[int, _storage.Storage]]:
    """Leaf positions a placement policy may re-place, and ``{id(array): storage it is replaced into}``.

    A candidate is an array replicated on the default placement that a
    tensor holds, or that a pending in-place update replaces (a parameter in
    an optimizer step: its storage already holds the pending value), and that
    no user annotation covers. An array no tensor holds or replaces is a
    temporary: re-placing it would not last.
    """
    default_mesh = replicated_sharding().mesh
    successors = {st.prev: st for st in storages if st is not None and st.prev is not None}
    found: list[int] = []
    for i, leaf in enumerate(plan.leaves):
        if type(leaf) is Scalar:
            continue
        sh = leaf.sharding
        if not (isinstance(sh, jax.sharding.NamedSharding) and sh.mesh == default_mesh and sh.is_fully_replicated):
            continue
        owners = _storage.holders_of(leaf)
        nxt = successors.get(id(leaf))
        if nxt is not None:
            owners.append(nxt)
        if owners and not any(h.annotated for h in owners):
            found.append(i)
    return found, successors


def _place_inputs(
    plan: _Plan,
    mesh: jax.sharding.Mesh | None,
    storages: Sequence[_storage.Storage | None] = (),
    *,
    inspect_only: bool = False,
) -> InputPlacement | None:
    """Apply the first switched-on input placement policy to ``plan``'s leaves (None: none is on).

    ``mesh``: the user's mesh the program already uses (None: none); one
    program has one mesh, so a policy must place onto it when given.
    ``storages``: the storages the program writes; one that replaces a
    re-placed array keeps the new placement for its new value.
    ``inspect_only``: as in :func:`_rehome` (only this plan sees the new
    arrays; no storage changes).
    """
    policy = next((p for p in INPUT_PLACEMENT_POLICIES if p.enabled()), None)
    if policy is None:
        return None
    positions, successors = _placement_candidates(plan, storages)
    decision = policy.place([plan.leaves[i] for i in positions], mesh)
    if decision is None:
        return None
    for k, target in decision.targets.items():
        i = positions[k]
        leaf = plan.leaves[i]
        if inspect_only:
            plan.leaves[i] = jax.device_put(leaf, target)
            continue
        nxt = successors.get(id(leaf))
        plan.leaves[i] = rehome(leaf, target)
        if nxt is not None:
            nxt.sharding = target  # its new value keeps the placement (not an annotation)
    return decision


def _user_mesh(plan: _Plan, out_shardings: Sequence[jax.sharding.Sharding | None]) -> jax.sharding.Mesh | None:
    """The first mesh other than the default placement's that the program uses."""
    default_mesh = replicated_sharding().mesh
    candidates: list[Any] = [getattr(leaf, "sharding", None) for leaf in plan.leaves if type(leaf) is not Scalar]
    candidates += list(out_shardings)
    candidates += [
        dict(n.template[1]).get("sharding")
        for n in plan.nodes
        if n.name == CONSTRAINT or n.name in manual.WITH_SHARDING
    ]
    for sh in candidates:
        if isinstance(sh, jax.sharding.NamedSharding) and sh.mesh != default_mesh:
            # jax types NamedSharding.mesh Mesh | AbstractMesh; an array's or a
            # constraint's sharding holds a concrete Mesh.
            return sh.mesh  # type: ignore[return-value]
    return None


def _rehome(plan: _Plan, mesh: jax.sharding.Mesh, *, inspect_only: bool = False) -> None:
    """Move default-placed (replicated) leaves onto the user's ``mesh``.

    JAX carries an array's mesh into the avals of everything computed from it
    and names propagated output shardings after it; the default placement's
    1-D mesh cannot express a tiling over the user's mesh (IndivisibleError).
    A replicated array has the same data on every device, so re-homing it is
    a relabelling, done once per tensor (its storage keeps the new array).

    ``inspect_only`` (lowering a graph to look at it, not to run it): only
    this plan gets the re-homed arrays; storages keep theirs. Re-homing for
    real would leave the still-pending graph holding the old array while the
    storage holds the new one, which shares its buffers: the step that runs
    next would then pass one buffer twice and donate it (XLA refuses, and
    the process crashed).
    """
    default_mesh = replicated_sharding().mesh
    target = _replicated_on(mesh)
    for i, leaf in enumerate(plan.leaves):
        if type(leaf) is Scalar:
            continue
        sh = leaf.sharding
        if isinstance(sh, jax.sharding.NamedSharding) and sh.mesh == default_mesh:
            plan.leaves[i] = jax.device_put(leaf, target) if inspect_only else rehome(leaf, target)


#: Called as ``hook(old, new)`` when :func:`rehome` moves an array, so facts kept
#: about the old array by higher layers follow it (registration, not a back-import:
#: ``tensor.multihost`` keeps its "placed from host data" mark this way).
REHOME_HOOKS: list[Callable[[jax.Array, jax.Array], None]] = []


def rehome(array: jax.Array, target: jax.sharding.Sharding) -> jax.Array:
    """Move a replicated ``array`` to ``target`` for every storage that holds it.

    ``target`` is a replicated placement on another mesh (``_rehome``), or a
    sharding an input placement policy chose (:data:`INPUT_PLACEMENT_POLICIES`).
    ``spmdtorch.compile`` does the same on a replay for an argument its traced
    program re-homed (see ``_rehome``).
    """
    new: jax.Array = jax.device_put(array, target)
    for hook in REHOME_HOOKS:
        hook(array, new)
    for holder in _storage.holders_of(array):
        if holder.sharding is not None and not holder.annotated:
            holder.sharding = None  # inherited placement: let the new one apply
        holder.set(new)
    return new


# type -> ("S", type): one key object per Python number type (int, float, bool, complex).
_SCALAR_SIGS: caches.BoundedCache[type, tuple[str, type]] = caches.bounded(
    "lazy.executor.scalar_signatures", maxsize=16
)


def _leaf_sig(leaf: jax.Array | Scalar) -> tuple[Any, ...]:
    if type(leaf) is Scalar:
        t = type(leaf.value)
        sig = _SCALAR_SIGS.get(t)
        if sig is None:
            sig = ("S", t)
            _SCALAR_SIGS.put(t, sig)
        return sig
    return (leaf.shape, leaf.dtype, leaf.sharding)


# Python-number inputs (Scalar leaves) are packed into one vector per kind:
# an optimizer step has ~10 scalars per parameter (learning rate, betas, bias
# corrections...), and passing each as its own replicated argument costs the
# runtime one buffer per device per scalar on every call (a tiny decoder's
# AdamW step passed ~7,600 buffers). Inside the program each element becomes
# the scalar ``jnp.asarray(value)`` would have been (weak-typed float32/int32,
# or bool), so type promotion is unchanged.
_SCALAR_KINDS = (
    ("b", np.bool_, np.dtype(np.bool_), False),
    ("i", np.int32, np.dtype(np.int32), True),
    ("f", np.float32, np.dtype(np.float32), True),
)


def _scalar_kind(value: object) -> str | None:
    t = type(value)
    if t is bool:
        return "b"
    if t is int:
        return "i"
    if t is float:
        return "f"
    return None  # anything else stays its own argument


class _Layout:
    """Where each leaf of a plan goes in the program's argument list.

    A Python-number leaf (bool, int, float) is packed into one vector per kind
    (``pack``), or, with ``bake``, is no argument at all: the program holds
    its value as a constant, as ``jax.jit`` holds a Python number it closes
    over. ``spmdtorch.compile`` bakes (its traced recipe freezes numbers
    anyway), so XLA folds the optimizer's scalar arithmetic instead of every
    update kernel slicing its numbers out of the vector; lazy mode packs, so
    a scheduled learning rate does not recompile. Other scalars (a numpy int:
    a layer index read by ``dynamic_slice``) stay arguments either way, so
    that layers share one kernel.
    """

    __slots__ = ("n_leaves", "array_pos", "groups", "constants")

    n_leaves: int
    array_pos: tuple[int, ...]
    groups: tuple[tuple[str, tuple[int, ...]], ...]
    constants: tuple[tuple[int, np.ndarray, np.dtype[Any], bool], ...]

    def __init__(self, plan: _Plan, pack: bool = True, bake: bool = False) -> None:
        kinds: dict[str, list[int]] = {}
        array_pos: list[int] = []
        constants: list[tuple[int, np.ndarray, np.dtype[Any], bool]] = []
        for i, leaf in enumerate(plan.leaves):
            kind = _scalar_kind(leaf.value) if pack and type(leaf) is Scalar else None
            if kind is None:
                array_pos.append(i)
            elif bake:
                constants.append((i, *_baked(kind, leaf.value)))
            else:
                kinds.setdefault(kind, []).append(i)
        self.n_leaves = len(plan.leaves)
        self.array_pos = tuple(array_pos)
        self.groups = tuple((k, tuple(kinds[k])) for k, *_ in _SCALAR_KINDS if k in kinds)
        # (leaf index, numpy value, dtype, weak) per baked number.
        self.constants = tuple(constants)

    def unpack(self, args: Sequence[jax.Array]) -> list[jax.Array]:
        """Program side: the per-leaf values from ``(*arrays, *vectors)``."""
        vals: list[Any] = [None] * self.n_leaves  # every entry is set below
        n = len(self.array_pos)
        for p, a in zip(self.array_pos, args[:n]):
            vals[p] = a
        for (kind, positions), vec in zip(self.groups, args[n:]):
            _, _, dtype, weak = next(k for k in _SCALAR_KINDS if k[0] == kind)
            for j, p in enumerate(positions):
                vals[p] = _convert_element_type(vec[j], dtype, weak_type=weak)
        for p, value, dtype, weak in self.constants:
            # The same value, dtype and weak type as the packed element.
            vals[p] = _convert_element_type(value, dtype, weak_type=weak)
        return vals

    def pack(
        self, leaf_args: Sequence[Any], mesh: jax.sharding.Mesh | None, for_call: bool = False
    ) -> list[jax.Array | np.ndarray]:
        """Caller side: per-leaf arguments (Python numbers for scalars) to program arguments.

        ``for_call``: the arguments of an execution (not of a lowering, which
        needs device arrays for their placement): a set of numbers seen for
        the first time may stay a numpy vector (see ``_packed_array``).
        """
        out: list[jax.Array | np.ndarray] = [
            leaf_args[p] if type(leaf_args[p]) is not Scalar else scalar_array(leaf_args[p].value, mesh)
            for p in self.array_pos
        ]
        for kind, positions in self.groups:
            out.append(_packed_array(kind, tuple(leaf_args[p].value for p in positions), mesh, for_call))
        return out


def _baked(kind: str, value: Any) -> tuple[np.ndarray, np.dtype[Any], bool]:
    # value: a bool, int or float, as ``kind`` says (a tag mypy cannot follow).
    """``(numpy value, dtype, weak)`` of a Python number as the program holds it (see :class:`_Layout`)."""
    _, np_type, dtype, weak = next(k for k in _SCALAR_KINDS if k[0] == kind)
    if kind == "i":
        _check_int32(value)
    return np.array(value, dtype=np_type), dtype, weak


def _check_int32(value: int) -> None:
    """Python ints become int32 in the program (x64 is off): one too large is an error, not a wrap."""
    if not -(2**31) <= value < 2**31:
        raise OverflowError(f"Python int {value} too large to convert to int32")


def _baked_key(plan: _Plan) -> tuple[tuple[int, str, bytes], ...]:
    """``ProgramKey.baked`` of ``plan`` compiled with ``bake=True``: which numbers, bit for bit."""
    key: list[tuple[int, str, bytes]] = []
    for i, leaf in enumerate(plan.leaves):
        if type(leaf) is Scalar:
            kind = _scalar_kind(leaf.value)
            if kind is not None:
                key.append((i, kind, _baked(kind, leaf.value)[0].tobytes()))
    return tuple(key)


def _packed_array(
    kind: str, values: tuple[Any, ...], mesh: jax.sharding.Mesh | None, for_call: bool = False
) -> jax.Array | np.ndarray:
    """A replicated device vector of ``values``; repeated value sets reuse one array.

    ``for_call`` (an execution's argument): a value set seen for the first
    time is returned as a numpy vector, which the executable copies to its
    input placement during the call; only a set seen again is put on the
    devices and kept. A set that changes every step (AdamW's bias
    corrections, Python floats of the step count) then costs no
    ``jax.device_put``: on a tiny decoder's 8-device step that took ~0.55 ms
    of host CPU, the copy inside the call ~0.2 ms.
    """
    # Floats by bit pattern (0.0 and -0.0 differ; one struct.pack for all).
    key = (kind, struct.pack(f"{len(values)}d", *values) if kind == "f" else values, mesh)
    cache = ENGINE.packed_arrays
    arr = cache.get(key)
    if arr is not None:
        cache.move_to_end(key)
        if type(arr) is np.ndarray:  # seen before, once: a repeated set, on the devices from now on
            arr = cache[key] = jax.device_put(arr, _replicated_on(mesh))
        return arr
    if len(cache) >= SCALAR_CACHE_MAX:
        cache.popitem(last=False)
    np_dtype = next(k[1] for k in _SCALAR_KINDS if k[0] == kind)
    if kind == "i":
        for v in values:
            _check_int32(v)
    vec = np.array(values, dtype=np_dtype)
    # Not with several processes (replicated inputs stay global arrays) nor under a
    # jax.transfer_guard that refuses or logs implicit copies (the call's copy is one).
    first_for_call = (
        for_call
        and jax.process_count() == 1
        and getattr(jax.config, "jax_transfer_guard_host_to_device", None) in (None, "allow")
    )
    arr = cache[key] = vec if first_for_call else jax.device_put(vec, _replicated_on(mesh))
    return arr


def _make_fn(
    plan: _Plan,
    layout: _Layout | None = None,
    outputs: tuple[tuple[int, int], ...] | None = None,
    sentinel: bool = False,
) -> Callable[..., list[jax.Array]]:
    """The program as a function of its arguments (``layout``: how leaves are passed;
    None passes one argument per leaf, as a nested body such as a shard_map region wants).
    ``outputs``: the ``(node, index)`` pairs it returns (default: the plan's).
    ``sentinel``: also return a 0-d bool last (see ``ENGINE.inflight``)."""
    if layout is None:
        layout = _Layout(plan, pack=False)
    nodes = [(n.fn, n.template, d, n.out_avals, n.name) for n, d in zip(plan.nodes, plan.draws)]
    # InputCode, read by ``type(c) is tuple``, which mypy does not narrow to int in the else branch.
    codes: Sequence[tuple[Any, ...]] = plan.codes
    outputs = plan.outputs if outputs is None else outputs
    n_args = len(layout.array_pos) + len(layout.groups)

    def run(*args: jax.Array) -> list[jax.Array]:
        leaf_vals = layout.unpack(args[:n_args])
        key: Any = None  # a jax key; set whenever a node draws (draw >= 0 only in random plans)
        if plan_has_random:
            kd = args[n_args]
            key = jax.random.fold_in(jax.random.fold_in(jax.random.key(kd[0]), kd[1]), kd[2])
        env: list[list[Any]] = []  # per node, its outputs
        for (fn, template, draw, avals, name), code in zip(nodes, codes):
            vals = [env[c[0]][c[1]] if type(c) is tuple else leaf_vals[-1 - c] for c in code]
            a_t, kw_t = template
            call_args = fill(a_t, vals)
            call_kwargs = {k: fill(v, vals) for k, v in kw_t}
            if draw >= 0:
                call_kwargs["key"] = jax.random.fold_in(key, draw)
            out = fn(*call_args, **call_kwargs)
            outs = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            if len(outs) != len(avals):
                # Masked outputs (convolution_backward's output_mask...): the
                # lowering returns None where torch returns no tensor, and
                # the node's avals list only the tensors.
                outs = tuple(o for o in outs if o is not None)
                if len(outs) != len(avals):
                    raise LoweringError(f"lowering of {name} returned {len(outs)} tensors, torch expects {len(avals)}")
            fixed: list[jax.Array] = []
            for o, (shape, dtype) in zip(outs, avals):
                o = jnp.asarray(o)
                if o.dtype != dtype:
                    o = o.astype(dtype)
                if tuple(o.shape) != tuple(shape):
                    raise LoweringError(
                        f"lowering of {name} returned shape {tuple(o.shape)}, torch expects {tuple(shape)}"
                    )
                fixed.append(o)
            env.append(fixed)
        res = [env[n][i] for n, i in outputs]
        if sentinel:
            res.append(jnp.zeros((), jnp.bool_))
        return res

    plan_has_random = plan.has_random
    # The XLA module's name on profiles ("jit_spmdtorch_program"); constant, so that
    # the persistent compilation cache's keys (module name + content hash) stay stable.
    run.__name__ = run.__qualname__ = "spmdtorch_program"
    return run


def _program_args(
    layout: _Layout, n_leaves: int, mesh: jax.sharding.Mesh | None, leaf_args: Sequence[Any], for_call: bool = False
) -> list[Any]:
    """Program arguments from per-leaf arguments (+ the random key, when it draws)."""
    return layout.pack(leaf_args[:n_leaves], mesh, for_call) + list(leaf_args[n_leaves:])


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)  # weakly held by tests of eviction
class _Program:
    """One compiled program and how to call it (made once, by ``_program_for``).

    Attributes:
        compiled: the executable (``jax.stages.Compiled``).
        lowered: its ``jax.stages.Lowered`` (HLO for debugging).
        name: ``spmdtorch.program_N``, the N-th program this process compiled
            (its name on profiles, see ``lazy._profiling``).
        n_leaves: leaves of the plan it was compiled from (the random key follows them).
        has_random: it takes a random key after the leaves.
        mesh: the user mesh its replicated scalars live on (None: the default placement).
        layout: where each leaf goes in its argument list.
        out_map: per storage, which program output it receives (None: one each, in order).
        donated: argument positions whose buffers it takes (recycled buffers included).
        aliases: how many outputs XLA writes into a donated input's buffer
            (the executable's ``input_output_alias`` entries; donated inputs
            with no output of their shape are freed, not aliased).
        recycle: one :class:`Recycled` per output that takes a buffer to
            reuse. Such an output overwrites a value that nothing reads (a
            gradient that ``zero_grad()`` dropped inside a compiled step):
            the caller passes the old buffer, donated and unused, after the
            other arguments, so XLA writes the new value into it instead of
            allocating a new one every step (design decision 23).
    """

    compiled: jax.stages.Compiled
    lowered: jax.stages.Lowered
    name: str
    n_leaves: int
    has_random: bool
    mesh: jax.sharding.Mesh | None
    layout: _Layout
    out_map: tuple[int, ...] | None
    donated: tuple[int, ...]
    recycle: tuple[Recycled, ...] = ()
    aliases: int = 0

    def call_args(self, leaf_args: Sequence[Any]) -> list[Any]:
        """Program arguments from per-leaf arguments (+ the random key, when it draws)."""
        return _program_args(self.layout, self.n_leaves, self.mesh, leaf_args, for_call=True)


def _program_for(
    plan: _Plan,
    donate: tuple[bool, ...],
    out_shardings: tuple[jax.sharding.Sharding | None, ...],
    mesh: jax.sharding.Mesh | None = None,
    recycle: tuple[int, ...] = (),
    bake: bool = False,
    placement: InputPlacement | None = None,
) -> tuple[_Program, ProgramKey]:
    leaf_sigs = tuple([_leaf_sig(leaf) for leaf in plan.leaves])
    baked = _baked_key(plan) if bake else ()
    mode = None if placement is None else placement.mode
    key = ProgramKey(plan.key, leaf_sigs, donate, out_shardings, _precision.current(), recycle, baked, mode)
    cache = ENGINE.compile_cache
    prog: _Program | None = cache.get(key)
    if prog is not None:
        metrics.inc("CachedCompile")
        return prog, key
    metrics.inc("UncachedCompile")
    if placement is not None:
        metrics.inc(placement.counter)
    if log.isEnabledFor(logging.INFO) or config.settings().log_recompiles:
        _log_recompile(ENGINE.last_key, key, plan)
    ENGINE.last_key = key
    name = f"spmdtorch.program_{next(_PROGRAM_NUMBERS)}"
    with _profiling.annotate("spmdtorch.compile", program=name, nodes=len(plan.nodes)):
        prog = _compile_program(plan, donate, out_shardings, mesh, name, key.matmul_precision, recycle, bake)
    cache.put(key, prog)
    return prog, key


#: Numbers the programs a process compiles (their names on profiles).
_PROGRAM_NUMBERS = itertools.count()


def _compile_program(
    plan: _Plan,
    donate: tuple[bool, ...],
    out_shardings: tuple[jax.sharding.Sharding | None, ...],
    mesh: jax.sharding.Mesh | None,
    name: str,
    matmul_precision: str = "highest",
    recycle: tuple[int, ...] = (),
    bake: bool = False,
) -> _Program:
    start = time.perf_counter()
    layout = _Layout(plan, bake=bake)
    # Storages whose values are the same output with the same placement get
    # one buffer (the program returns it once; execute() hands it to each).
    unique: dict[tuple[tuple[int, int], jax.sharding.Sharding | None], int] = {}
    out_map = tuple(unique.setdefault((o, sh), len(unique)) for o, sh in zip(plan.outputs, out_shardings))
    fn = _make_fn(plan, layout, tuple(o for o, _ in unique), sentinel=True)
    donate_idx = tuple(j for j, i in enumerate(layout.array_pos) if donate[i])
    n_args = len(layout.array_pos) + len(layout.groups) + plan.has_random
    recycled = tuple(_recycled(plan, k, out_shardings[k]) for k in recycle)
    if recycled:
        # The recycled buffers come last and are never read: JAX pairs each
        # donated argument with an output of its shape, dtype and sharding
        # (the leaves first, so they keep the pairing pair_outputs chose).
        inner = fn

        def fn(*args: jax.Array) -> list[jax.Array]:
            return inner(*args[:n_args])

        donate_idx += tuple(range(n_args, n_args + len(recycled)))
    # keep_unused: an output computed from no input's data (zeros_like(w)) must
    # still live on the inputs' devices; without the input JAX uses one device.
    # The sentinel is replicated: it is ready only once every device is done.
    out_sh = [sh for _, sh in unique] + [_replicated_on(mesh)]
    jitted = jax.jit(fn, donate_argnums=donate_idx, out_shardings=out_sh, keep_unused=True)
    # Lowering needs only the key's type: drawing here would consume a key
    # that no execution uses (a first run would then differ from a cached one).
    n_leaves = len(plan.leaves)
    # Products whose precision is None (ops.linalg, ops.conv) take the
    # context's: torch's float32 matmul precision at the time of the build.
    with jax.default_matmul_precision(matmul_precision):
        lowered = jitted.lower(
            *_program_args(layout, n_leaves, mesh, _call_args(plan, mesh, draw_key=False)),
            *(jax.ShapeDtypeStruct(r.shape, r.dtype, sharding=r.sharding) for r in recycled),
        )
    compiled = lowered.compile()
    prog = _Program(
        compiled=compiled,
        lowered=lowered,
        name=name,
        n_leaves=n_leaves,
        has_random=plan.has_random,
        mesh=mesh,
        layout=layout,
        out_map=out_map if len(unique) < len(out_map) else None,
        donated=donate_idx,
        recycle=recycled,
        aliases=_alias_count(compiled) if donate_idx else 0,
    )
    metrics.add_time("CompileTime", time.perf_counter() - start)
    return prog


def _alias_count(compiled: jax.stages.Compiled) -> int:
    """The input/output alias pairs of a compiled program, read off its HLO module's header.

    XLA, not JAX, decides which donated buffers an output reuses; the module's
    ``input_output_alias={ {out}: (param, {}, may-alias), ... }`` lists them.
    The text is printed once per compilation (large constants elided).
    """
    # jax types runtime_executable() Optional; a compiled program always has one.
    modules = compiled.runtime_executable().hlo_modules()  # type: ignore[union-attr]
    header = modules[0].to_string().split("\n", 1)[0] if modules else ""
    return len(_ALIAS_ENTRY.findall(header))


_ALIAS_ENTRY = re.compile(r"\(\d+, \{[\d,]*\}, (?:may|must)-alias\)")


class Recycled(NamedTuple):
    """An output of a program that writes into a buffer its caller passes (see :class:`_Program`).

    Attributes:
        output: its position among the storages the program writes (``run_plan``'s order).
        shape: the buffer's shape.
        dtype: its dtype.
        sharding: its sharding.
    """

    output: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    sharding: jax.sharding.Sharding

    def fits(self, array: jax.Array) -> bool:
        """Whether ``array`` can be this buffer (same shape, dtype and sharding, not deleted)."""
        sharding = array.sharding  # usually the very object the last replay's output had
        return (
            array.shape == self.shape
            and array.dtype == self.dtype
            and (sharding is self.sharding or sharding == self.sharding)
            and not array.is_deleted()
        )

    def blank(self) -> jax.Array:
        """A new buffer, for when the old one cannot be given (its content is never read).

        Put from the host shard by shard: no program to compile for each new
        shape (traces make these), and no host array of the whole shape.
        """
        zero = np.broadcast_to(np.zeros((), self.dtype), self.shape)
        return jax.make_array_from_callback(self.shape, self.sharding, lambda index: zero[index])


def recycled_buffers(
    prog: _Program, targets: Sequence[_storage.Storage | None], args: Sequence[Any]
) -> list[jax.Array]:
    """The buffers a replayed program's recycled outputs write into (``spmdtorch.compile``).

    Args:
        prog: the program.
        targets: per output, the storage it goes to (None: a fresh tensor).
        args: the per-leaf arguments of this call.

    Returns:
        Per ``prog.recycle`` entry, the old value of the storage its output
        goes to when that storage alone holds it, it is no argument of this
        call and it fits; else a blank buffer (the user replaced or shared
        the tensor between calls). Donating the old value is safe because
        the storage receives the output right after the call and nothing
        reads the old value first: pending values were computed before the
        call, and other holders rule the array out.
    """
    out: list[jax.Array] = []
    arg_ids: set[int] | None = None
    for r in prog.recycle:
        st = targets[r.output]
        value = None if st is None else st.value
        if (
            st is not None  # (implied by value; said again for mypy)
            and value is not None
            and type(value) is not LazyRef
            and _storage.sole_holder(value, st)
            and r.fits(value)
        ):
            if arg_ids is None:
                arg_ids = {id(a) for a in args}
            if id(value) not in arg_ids:
                out.append(value)
                continue
        out.append(r.blank())
    return out


def _recycled(plan: _Plan, k: int, sharding: jax.sharding.Sharding | None) -> Recycled:
    assert sharding is not None  # _recycle_slots takes only outputs whose sharding is known
    node, index = plan.outputs[k]
    shape, dtype = plan.nodes[node].out_avals[index]
    return Recycled(k, tuple(shape), jnp.dtype(dtype), sharding)


def _log_recompile(old: ProgramKey | None, new: ProgramKey, plan: _Plan | None = None) -> None:
    """Say which input made this graph miss the cache (opt-in)."""
    if old is None:
        msg = "first compilation"
    elif old.plan.entries == new.plan.entries and old.plan.random_order != new.plan.random_order:
        msg = "the random ops' draw order changed"
    elif old.plan != new.plan:
        o, n = old.plan.entries, new.plan.entries
        at = next((i for i, (a, b) in enumerate(zip(o, n)) if a != b), min(len(o), len(n)))
        starts = _node_starts(n)
        first = bisect.bisect_right(starts, at) - 1 if at < len(n) else len(starts)
        what = plan.nodes[first].name if plan is not None and first < len(plan.nodes) else "(end)"
        msg = (
            f"graph structure changed: {len(_node_starts(o))} -> {len(starts)} ops, "
            f"first difference at op {first} ({what})"
        )
    elif old.leaves != new.leaves:
        diffs = []
        for i, (a, b) in enumerate(zip(old.leaves, new.leaves)):
            if a != b:
                names = ("shape", "dtype", "sharding")
                for k, (x, y) in enumerate(zip(a, b)):
                    if x != y and k < 3:
                        diffs.append(f"input {i} {names[k] if a[0] != 'S' else 'scalar type'}: {x} -> {y}")
        if len(old.leaves) != len(new.leaves):
            diffs.append(f"number of inputs: {len(old.leaves)} -> {len(new.leaves)}")
        msg = "; ".join(diffs[:5]) or "inputs changed"
    elif old.matmul_precision != new.matmul_precision:
        msg = f"float32 matmul precision changed: {old.matmul_precision} -> {new.matmul_precision}"
    elif old.placement_mode != new.placement_mode:
        msg = f"input placement mode changed: {old.placement_mode} -> {new.placement_mode}"
    else:
        msg = "donation or output shardings changed"
    line = f"spmdtorch: recompiling ({msg})"
    log.warning(line)


def scalar_array(value: Any, mesh: jax.sharding.Mesh | None = None) -> jax.Array:
    """A replicated, weakly typed device array holding Python number ``value``.

    Passing a Python number to an executable copies it to every device on
    every call; optimizer steps pass hundreds (learning rate, betas, eps), so
    the arrays are made once and reused. Floats are keyed by their bit
    pattern so that 0.0 and -0.0 stay distinct.
    """
    key = (type(value), value.hex() if type(value) is float else value, mesh)
    cache = ENGINE.scalar_arrays
    arr = cache.get(key)
    if arr is not None:
        cache.move_to_end(key)
    else:
        if len(cache) >= SCALAR_CACHE_MAX:
            cache.popitem(last=False)

        sharding = (
            replicated_sharding() if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
        )
        arr = cache[key] = jax.device_put(jnp.asarray(value), sharding)
    return arr


def _call_args(plan: _Plan, mesh: jax.sharding.Mesh | None = None, draw_key: bool = True) -> list[Any]:
    """Per-leaf arguments: arrays, and the ``Scalar`` leaves themselves (packed by ``_Program.call_args``)."""
    args: list[Any] = list(plan.leaves)  # + the key's data (numpy)
    if plan.has_random:
        args.append(rng.next_key_data() if draw_key else rng.placeholder_key_data())
    return args


def _run(refs: Sequence[LazyRef], storages: Sequence[_storage.Storage | None]) -> list[jax.Array]:
    """Compile (or reuse) and run the program computing ``refs``.

    Raises:
        manual.ManualValueError: one of ``refs`` is manually sharded (XLA
            cannot return it; ``shard_to_full`` must come first).
    """
    manual.check_not_manual(refs, "computing a tensor")
    return run_plan(_Plan(refs), storages)[0]


def run_plan(
    plan: _Plan,
    storages: Sequence[_storage.Storage | None],
    recycle: dict[int, jax.Array | None] | None = None,
    bake: bool = False,
) -> tuple[list[jax.Array], _Program]:
    """Compile (or reuse) and run ``plan``; ``storages[i]`` receives output i.

    ``recycle``: ``{id(storage): the array it held before (None: none)}`` for
    the storages whose new value may be written into a recycled buffer on
    later calls of the program (see :class:`_Program`; ``spmdtorch.compile``
    passes what a step creates and keeps, such as gradients, and the state
    it overwrote). An output takes one when its storage's old array is not
    read by this program, its sharding is known, and it shares its buffer
    with no other storage; this call donates the old array when nothing else
    holds it and it fits, else a blank one. ``bake``: compile the plan's
    Python numbers into the program as constants (see :class:`_Layout`).

    Returns ``(outputs, program)``; the program can be called again with new
    leaf values (``spmdtorch.compile`` replays it without re-tracing).
    """

    # The arrays the program reads, as they were before re-homing (an old
    # value re-homed for the program is read all the same).
    read_ids = {id(leaf) for leaf in plan.leaves} if recycle else set()
    out_shardings = tuple(st.sharding if st is not None else None for st in storages)
    mesh = _user_mesh(plan, out_shardings)
    placement = _place_inputs(plan, mesh, storages)
    if placement is not None and placement.targets:
        # Re-placing changed storages' placements, and may bring the policy's own mesh.
        out_shardings = tuple(st.sharding if st is not None else None for st in storages)
        if mesh is None:
            mesh = _user_mesh(plan, out_shardings)
    if mesh is not None:
        _rehome(plan, mesh)
        default_mesh = replicated_sharding().mesh
        home = _replicated_on(mesh)
        out_shardings = tuple(
            home if isinstance(sh, jax.sharding.NamedSharding) and sh.mesh == default_mesh else sh
            for sh in out_shardings
        )
    if not any(type(leaf) is not Scalar for leaf in plan.leaves) and not any(n.name == CONSTRAINT for n in plan.nodes):
        # No array inputs: without explicit shardings JAX would use one device. A
        # sharding constraint names the devices itself, and XLA propagates it to
        # the outputs (``zeros(...)`` marked sharded, then ``+ 1``, is sharded alike).
        fallback = _replicated_on(mesh)
        out_shardings = tuple(fallback if sh is None else sh for sh in out_shardings)
    donate = tuple(
        type(leaf) is not Scalar
        and _storage.holder_of(leaf) is None
        and (plan.donatable is None or i in plan.donatable)
        for i, leaf in enumerate(plan.leaves)
    )
    slots = _recycle_slots(plan, storages, out_shardings, recycle, read_ids) if recycle else ()
    prog, _ = _program_for(plan, donate, out_shardings, mesh, slots, bake, placement)
    buffers: list[jax.Array] = []
    given: set[int] = set()
    for r in prog.recycle:  # empty without ``recycle``
        # (Runs only for a program with recycled outputs, made only with ``recycle``.)
        old = recycle[id(storages[r.output])] if recycle is not None else None
        if old is not None and id(old) not in given and _storage.holder_of(old) is None and r.fits(old):
            given.add(id(old))
            buffers.append(old)
        else:
            buffers.append(r.blank())
    return execute(prog, _call_args(plan, mesh), buffers), prog


def _recycle_slots(
    plan: _Plan,
    storages: Sequence[_storage.Storage | None],
    out_shardings: Sequence[jax.sharding.Sharding | None],
    recycle: dict[int, jax.Array | None],
    read_ids: set[int],
) -> tuple[int, ...]:
    """Positions of the outputs that take a recycled buffer (``run_plan``)."""
    counts: dict[tuple[tuple[int, int], jax.sharding.Sharding | None], int] = {}
    for o, sh in zip(plan.outputs, out_shardings):
        counts[(o, sh)] = counts.get((o, sh), 0) + 1
    slots = []
    for k, (st, o, sh) in enumerate(zip(storages, plan.outputs, out_shardings)):
        if st is None or id(st) not in recycle or sh is None or counts[(o, sh)] != 1:
            continue
        old = recycle[id(st)]
        if old is None or id(old) not in read_ids:  # the program does not read the old value
            slots.append(k)
    return tuple(slots)


# ENGINE.before_next: dispatches owed before the next program runs (an async
# checkpoint's fingerprints read arrays that the next step donates); see
# before_next_execution. Guarded by ENGINE.before_next_lock.


def before_next_execution(fn: Callable[[], None]) -> None:
    """Call ``fn()`` right before the next program execution (or at :func:`flush_before_next`).

    For work that reads arrays the next step may donate but should not hold up
    the caller: an async checkpoint dispatches its fingerprint programs here, so
    ``save()`` returns after Orbax's device→host copy and the programs start
    ahead of the next training step. ``fn`` runs exactly once, on whichever
    thread gets there first, always before any later execution.
    """
    with ENGINE.before_next_lock:
        ENGINE.before_next.append(fn)


def flush_before_next() -> None:
    """Run the calls owed by :func:`before_next_execution` now (any thread)."""
    with ENGINE.before_next_lock:
        _run_owed()


def _run_owed() -> None:
    # Under the lock, and each call leaves the list only once it has run:
    # execute() checks the list without the lock, so it must see the call
    # (and wait for the lock) until the call is done.
    owed = ENGINE.before_next
    while owed:
        try:
            owed[0]()
        except Exception:  # the owner reports its own failure (SaveFingerprints.fail)
            log.exception("a dispatch owed before the next execution failed")
        finally:
            owed.pop(0)


def execute(prog: _Program, args: Sequence[Any], recycled: Sequence[jax.Array] = ()) -> list[jax.Array]:
    """Run a compiled program asynchronously, bounding executions in flight.

    ``recycled``: one buffer per ``prog.recycle`` entry, donated (see :class:`_Program`).
    """
    engine = ENGINE
    if engine.before_next:
        with engine.before_next_lock:
            _run_owed()
    metrics.inc("ExecuteCount")
    start = time.perf_counter()
    call = prog.call_args(args)
    if recycled:
        call += recycled
    outs: list[jax.Array]  # jax.stages.Compiled.__call__ is typed Any (a bare annotation: no runtime work)
    if _profiling.STATE.active:
        with jax.profiler.TraceAnnotation(prog.name):
            outs = prog.compiled(*call)
    else:
        outs = prog.compiled(*call)
    metrics.add_time("ExecuteTime", time.perf_counter() - start)
    if prog.aliases:  # PyTorch/XLA's InputOutputAliasCount (torch_xla.debug.metrics) sums these
        metrics.inc("InputOutputAliases", prog.aliases)
    engine.inflight.append((outs.pop(), [call[j] for j in prog.donated]))
    _bound_in_flight(engine.max_in_flight)
    if prog.out_map is not None:  # one buffer for several storages with equal values
        outs = [outs[j] for j in prog.out_map]
    return outs


def _replicated_on(mesh: jax.sharding.Mesh | None) -> jax.sharding.Sharding:
    """Replicated over ``mesh`` (None: the default placement's devices)."""
    if mesh is None:
        return replicated_sharding()
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _bound_in_flight(limit: int) -> None:
    """Block until at most ``limit`` executions are queued."""
    inflight = ENGINE.inflight
    while len(inflight) > limit:
        sentinel, _ = inflight.popleft()
        sentinel.block_until_ready()


def _padded_output(st: _storage.Storage) -> LazyRef:
    """The value a storage receives: padded when its sharding is uneven."""

    ref = st.value
    shape = tuple(ref.shape)
    target = None if st.sharding is None else padding.padded_shape(shape, st.sharding)
    if target is None:
        st.logical_shape = None
        # Not a stub gap: ``st.value`` is a LazyRef here (pending_storages keeps
        # only those), a filter mypy cannot follow into this call; a cast would
        # cost a call per program output.
        return ref  # type: ignore[return-value]
    st.logical_shape = shape
    padded: LazyRef = record(
        padding.pad_to, "pad_to_shards", ((Slot(0),), (("shape", target),)), [ref], ((target, ref.dtype),)
    )
    return padded


def pending_storages() -> list[_storage.Storage]:
    """Live storages whose value is pending (what the next barrier computes)."""
    live = [st for st in list(_storage.PENDING) if isinstance(st.value, LazyRef)]
    live.sort(key=lambda st: st.pseq)
    return live


#: ``sync``'s ``_on_plan(plan, storages, program)``: called with what a sync compiled and ran (``spmdtorch.compile``).
OnPlan = Callable[[_Plan, list[_storage.Storage], _Program], None]


def sync(
    wait: bool = False,
    _on_plan: OnPlan | None = None,
    _recycle: dict[int, jax.Array | None] | None = None,
    _bake: bool = False,
) -> None:
    """Compute every pending live tensor in one compiled program.

    Args:
        wait: block until the results are ready (otherwise execution is async).
    """
    contract.wait_turn()  # another thread's trace first ends (its final sync takes every pending value)
    if _on_plan is None:
        contract.check_not_tracing("calls spmdtorch.sync()/mark_step()")
    if _profiling.STATE.active:
        with jax.profiler.TraceAnnotation("spmdtorch.sync"):
            _sync(wait, _on_plan, _recycle, _bake)
    else:
        _sync(wait, _on_plan, _recycle, _bake)


def _sync(
    wait: bool, _on_plan: OnPlan | None, _recycle: dict[int, jax.Array | None] | None = None, _bake: bool = False
) -> None:
    metrics.inc("MarkStep")
    if _storage.ON_HOST:  # a barrier places what is still on the host (deferred upload), as PyTorch/XLA's sync
        _storage.upload_on_host()
    rng.program_boundary()  # an explicit RNG stream ends with its program (tensor/random_state.py)
    storages = pending_storages()
    _storage.PENDING.clear()
    # Manually sharded values cannot be program outputs: they stay pending (a later shard_to_full reads them).
    storages, kept_manual = manual.split_manual(storages)
    for st in kept_manual:
        _storage.PENDING.add(st)
    if storages:
        plan = _Plan([_padded_output(st) for st in storages])
        storages = plan.pair_outputs(storages)
        try:
            outs, prog = run_plan(plan, storages, _recycle, _bake)
        except Exception:
            # The tensors keep their pending values (reading one retries and
            # shows the error again), but they leave the pending set: one
            # failed step must not make every later, unrelated sync fail too.
            raise
        except BaseException:  # KeyboardInterrupt etc.: nothing failed, retry next sync
            for st in storages:
                _storage.PENDING.add(st)
            raise
        if _on_plan is not None:
            _on_plan(plan, storages, prog)
        for st, arr in zip(storages, outs):
            st.set(arr)
    if wait:
        _bound_in_flight(0)


def wait_executions() -> None:
    """Block until every queued execution has finished (pending values stay pending)."""
    _bound_in_flight(0)


def evaluate(ref: LazyRef) -> jax.Array:
    """Compute one pending value that no storage holds (e.g. a view's slice)."""
    return _run([ref], [None])[0]


class LoweredProgram(NamedTuple):
    """A program lowered for inspection, never run (:func:`lower_program`).

    Attributes:
        lowered: the ``jax.stages.Lowered`` program.
        args: the program's arguments in parameter order: per parameter the
            ``jax.Array`` it would be given now (a plan leaf, a root that is
            already computed, a number's 0-d array, or the random key's data).
        roles: per parameter, what it is: ``"data"`` (a tensor's array),
            ``"scalar"`` (a number kept as an input) or ``"rng_key"``.
        devices: the program's device assignment: device numbers in its HLO
            shardings (``{devices=[2,4]<=[8]}``) are positions in this tuple.
    """

    lowered: jax.stages.Lowered
    args: tuple[Any, ...]
    roles: tuple[str, ...]
    devices: tuple[jax.Device, ...]


def lower_program(
    roots: Sequence[LazyRef | jax.Array], *, name: str | None = None, key_data: np.ndarray | None = None
) -> LoweredProgram:
    """Lower the program returning ``roots`` (pending values or computed arrays), in their order; runs nothing.

    Python numbers are constants of the program (as in a compiled step),
    so its parameters are the tensors' arrays (a computed root is a parameter
    returned as it is), numbers that must stay inputs, and the random key's
    data last when the graph draws random numbers. ``key_data``: that key
    (None: a placeholder; torch's generator is never advanced here, so
    inspecting a graph does not change the random numbers its run draws).
    ``name``: the function's name, hence the module's (``jit_<name>``).
    """
    refs = [r for r in roots if type(r) is LazyRef]
    plan, layout, inner, mesh, leaf_args = _prepare_inspection(refs, bake=True)
    n = len(plan.leaves)
    args: list[Any] = layout.pack(leaf_args[:n], mesh)  # + key data (numpy) and computed roots
    roles = ["data" if type(plan.leaves[p]) is not Scalar else "scalar" for p in layout.array_pos]
    if plan.has_random:
        args.append(rng.placeholder_key_data() if key_data is None else np.asarray(key_data, np.uint32))
        roles.append("rng_key")
    n_inner = len(args)
    # A computed root is a parameter of its own unless it is already one (a leaf).
    where: list[int] = []  # per root: >= 0 the inner output's index, < 0 -1 - parameter number
    k = 0
    for r in roots:
        if type(r) is LazyRef:
            where.append(k)
            k += 1
            continue
        same = next((i for i, a in enumerate(args) if a is r), None)
        if same is None:
            same = len(args)
            args.append(r)
            roles.append("data")
        where.append(-1 - same)

    def program(*xs: jax.Array) -> list[jax.Array]:
        outs = inner(*xs[:n_inner]) if refs else []
        return [outs[w] if w >= 0 else xs[-1 - w] for w in where]

    program.__name__ = program.__qualname__ = name or "spmdtorch_program"
    with jax.default_matmul_precision(_precision.current()):
        lowered = jax.jit(program).lower(*args)
    # jit assigns devices in the order of the mesh its shardings name (all one mesh).
    home: jax.sharding.Mesh | jax.sharding.AbstractMesh | None = mesh
    if home is None:
        named = [a.sharding for a in args if isinstance(getattr(a, "sharding", None), jax.sharding.NamedSharding)]
        home = named[0].mesh if named else replicated_sharding().mesh
    return LoweredProgram(lowered, tuple(args), tuple(roles), tuple(home.devices.flat))


def lower(refs: Sequence[LazyRef]) -> jax.stages.Lowered:
    """``jax.stages.Lowered`` for the program computing ``refs`` (for debugging).

    No random key is drawn: the placeholder key lowers the same program, and
    torch's generator stays where it was, so printing a step's HLO (or saving
    it with ``XLA_SAVE_TENSORS_FILE``) does not change the numbers it draws.
    """
    plan, layout, fn, mesh, leaf_args = _prepare_inspection(refs, bake=False)
    n = len(plan.leaves)
    with jax.default_matmul_precision(_precision.current()):
        return jax.jit(fn).lower(*layout.pack(leaf_args[:n], mesh), *leaf_args[n:])


def _prepare_inspection(
    refs: Sequence[LazyRef], *, bake: bool
) -> tuple[_Plan, _Layout, Callable[..., list[jax.Array]], jax.sharding.Mesh | None, list[Any]]:
    """The plan, layout, function, mesh and arguments of the program computing ``refs``, for lowering only.

    Inputs are placed (auto mode) and re-homed for this plan alone
    (``inspect_only``), and no random key is drawn: inspecting a pending step
    changes nothing the step then runs.
    """
    plan = _Plan(refs)
    layout = _Layout(plan, bake=bake)
    fn = _make_fn(plan, layout)
    mesh = _user_mesh(plan, ())
    if _place_inputs(plan, mesh, inspect_only=True) is not None and mesh is None:
        mesh = _user_mesh(plan, ())
    if mesh is not None:
        _rehome(plan, mesh, inspect_only=True)
    return plan, layout, fn, mesh, _call_args(plan, mesh, draw_key=False)


def reset_cache() -> None:
    """Forget every compiled program (``spmdtorch.debug.clear_caches`` clears every cache)."""
    ENGINE.compile_cache.clear()
