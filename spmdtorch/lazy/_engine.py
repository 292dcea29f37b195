"""The lazy engine's process state, in one object: :data:`ENGINE`.

Everything the engine keeps between ops and steps hangs off this one
:class:`Engine`: the pending set and the holder registry (the data model that
``lazy._storage`` keeps current), ``spmdtorch.compile``'s trace hook, the
compile cache (bounded, least recently used evicted), the queue of executions
in flight, the calls owed before the next execution, the device-array caches
of Python scalars, and a registry of every other
per-process cache in the library (node signatures, interned scalars, the
dispatcher's meta cache and op facts, helper programs...), so that
:meth:`Engine.clear_caches` (``spmdtorch.debug.clear_caches()``) resets them all
and :meth:`Engine.cache_sizes` reports them.

Invariants:
    * Caches are cleared *in place* (``dict.clear``), never rebound: hot paths
      hold a module-level alias of a registered cache (one global lookup per
      op instead of an attribute chain), and the alias must stay the cache.
    * Clearing a cache never changes a result, only costs a miss: every
      registered cache maps a full key to a value recomputable from it
      (``lazy.keys`` explains why a cleared signature table cannot alias).
    * The pending set, the holder registry, the in-flight queue and the owed
      calls are *not* caches: clearing leaves them alone (dropping a pending
      storage would lose a value; dropping an execution's entry would lift the
      in-flight bound).
    * Its objects are mutated in place, never rebound, for the same reason:
      ``lazy._storage`` names ``pending``, ``holders``, ``co_holders``,
      ``trace_hook`` and ``seq`` at module level for the per-write path.

This module imports only ``spmdtorch.config`` and ``lazy.metrics``: every layer
above may register with it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from spmdtorch import config
from spmdtorch.lazy import metrics

if TYPE_CHECKING:
    import jax
    import numpy as np

# The engine's tables hold storages (lazy._storage.Storage), program keys
# (lazy.executor.ProgramKey) and lazy references (lazy.graph.LazyRef). Those
# modules are built on this one, so importing their classes here, even for
# typing only, would make an import cycle (tools/import_cycles.py counts
# typing-only imports): the tables name them through these aliases instead.
Storage = Any
ProgramKey = Any
LazyRef = Any

__all__ = ["ENGINE", "CompileCache", "Engine", "RegisteredCache"]

#: Counter incremented for each program the compile cache evicts.
EVICTION_COUNTER = "CompileCacheEvictions"


class _Entry:
    """One compile-cache entry: the program and when it was last used (a tick)."""

    __slots__ = ("prog", "tick")

    def __init__(self, prog: Any, tick: int) -> None:
        self.prog = prog
        self.tick = tick


class CompileCache:
    """Compiled programs by key, least recently used evicted beyond ``maxsize``.

    The engine's cache (programs by graph key) is one; each
    ``spmdtorch.compile`` function keeps its input signatures' histories in
    another (its own ``counter``).

    Recency is a tick counter stored in the entry: a hit is one dict lookup
    and two attribute writes. (An ``OrderedDict.move_to_end`` hashed the key
    a second time; a step's key holds a tuple per program input and output.)
    Eviction scans for the oldest tick, which happens only when a new
    program is compiled into a full cache. ``maxsize`` is read from
    ``config.settings()`` at each insertion, so ``config.reload()`` resizes
    it at the next compilation.

    Example:
        >>> c = CompileCache(maxsize=2)
        >>> for k in "abc":
        ...     c.put(k, k.upper())
        >>> c.get("a"), c.get("c"), len(c), c.evictions, list(c)
        (None, 'C', 2, 1, ['b', 'c'])
    """

    __slots__ = ("_data", "_maxsize", "_tick", "evictions", "_counter")

    def __init__(self, maxsize: int | None = None, counter: str = EVICTION_COUNTER) -> None:
        self._data: dict[Hashable, _Entry] = {}
        self._maxsize = maxsize  # None: config's SPMDTORCH_COMPILE_CACHE_SIZE
        self._tick = 0
        self.evictions = 0
        self._counter = counter  # the metrics counter each eviction increments

    @property
    def maxsize(self) -> int:
        """The bound in force (``SPMDTORCH_COMPILE_CACHE_SIZE`` unless given)."""
        return config.settings().compile_cache_size if self._maxsize is None else self._maxsize

    def get(self, key: Hashable) -> Any:
        entry = self._data.get(key)
        if entry is None:
            return None
        self._tick += 1
        entry.tick = self._tick
        return entry.prog

    def peek(self, key: Hashable) -> Any:
        """Like :meth:`get`, without making the entry recent (debug readers)."""
        entry = self._data.get(key)
        return None if entry is None else entry.prog

    def put(self, key: Hashable, prog: Any) -> None:
        data = self._data
        self._tick += 1
        data[key] = _Entry(prog, self._tick)
        bound = self.maxsize
        while len(data) > bound:
            # The program stays alive while someone holds it (a compiled
            # function's record, a running execution); the cache just forgets it.
            del data[min(data, key=lambda k: data[k].tick)]
            self.evictions += 1
            metrics.inc(self._counter)

    def clear(self) -> None:
        self._data.clear()

    def values(self) -> list[Any]:
        """The cached values, oldest insertion first, without making any recent."""
        return [entry.prog for entry in self._data.values()]

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._data)


# Per device-scalar cache (Engine.scalar_arrays, .packed_arrays), least recently
# used evicted. Small on purpose: values that change every step (a scheduled
# learning rate, Adam's bias corrections) make a new entry per step, each a
# buffer on every device, which a large bound would keep alive by the
# thousand; the constants a loop reuses stay at the recent end.
SCALAR_CACHE_MAX = 256


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredCache:
    """A per-process cache some module owns, as the engine sees it.

    Attributes:
        name: ``"module.what"``, e.g. ``"lazy.keys.signatures"``.
        clear: empties it, in place.
        size: its number of entries.
        maxsize: its bound now, or None where its owner bounds it (see ``bound``).
        bound: for ``maxsize`` None, why it cannot grow without bound.
        counts: ``(evictions, bypasses)`` so far, or None where it counts neither.
    """

    name: str
    clear: Callable[[], None]
    size: Callable[[], int]
    maxsize: Callable[[], int | None]
    bound: str = ""
    counts: Callable[[], tuple[int, int]] | None = None


class PendingSet:
    """The storages whose value is pending: a weak set, in insertion order.

    The recording path adds a storage on every write (hundreds per step).
    ``weakref.WeakSet.add`` is Python code and every dying member runs a
    Python callback; here an add is a flag test plus a plain weakref, and dead
    members are simply skipped. A storage's ``queued`` field holds the
    generation it was added in, so ``clear()`` is O(1) and an add is a no-op
    while the storage is already a member.
    """

    __slots__ = ("_compact_at", "_gen", "_refs")
    _COMPACT_MIN = 4096  # references kept before dead ones are dropped

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Storage]] = []
        self._gen = 1
        self._compact_at = self._COMPACT_MIN

    def add(self, st: Storage) -> None:
        if st.queued != self._gen:
            st.queued = self._gen
            self._refs.append(weakref.ref(st))
            if len(self._refs) >= self._compact_at:
                self._compact()

    def discard(self, st: Storage) -> None:
        if st.queued == self._gen:
            st.queued = 0

    def clear(self) -> None:
        self._refs = []
        self._gen += 1

    def _compact(self) -> None:
        # Storages recorded and dropped without a barrier (a long loop that
        # never syncs) leave dead references: drop them, keep the order.
        self._refs = [ref for ref in self._refs if (st := ref()) is not None and st.queued == self._gen]
        self._compact_at = max(self._COMPACT_MIN, 2 * len(self._refs))

    def __iter__(self) -> Iterator[Storage]:
        gen = self._gen
        seen = set()
        for ref in list(self._refs):
            st = ref()
            if st is not None and st.queued == gen and id(st) not in seen:
                seen.add(id(st))
                yield st

    def __len__(self) -> int:
        return sum(1 for _ in self)


class Engine:
    """The lazy engine's per-process state (one instance, :data:`ENGINE`).

    Attributes:
        compile_cache: graph key -> compiled program (``executor._Program``).
        last_key: the key of the last program compiled (``debug.last_executable``).
        inflight: per queued execution ``(sentinel, donated inputs)`` (``executor``).
        before_next: calls owed before the next execution; guarded by ``before_next_lock``.
        scalar_arrays: ``(type, value, mesh)`` -> replicated device scalar.
        packed_arrays: ``(kind, values, mesh)`` -> replicated device vector of scalars.
        pending: the storages whose value is pending (``lazy._storage``); the
            next barrier computes them.
        holders: ``id(jax.Array)`` -> weak reference to the storage holding it
            (buffer donation rests on it: an array no storage holds can be donated).
        co_holders: ``id(jax.Array)`` -> ``{id(storage): weak reference}`` for
            arrays that several storages hold (equal results share one buffer).
        trace_hook: one slot: ``spmdtorch.compile``'s callback while it traces,
            called on every storage write (None otherwise).
        seq: the counter that orders pending values (program output order).
        on_host: the storages whose value is still on the host (deferred
            upload, ``lazy._storage``); the next barrier uploads them.
    """

    __slots__ = (
        "compile_cache",
        "last_key",
        "inflight",
        "before_next",
        "before_next_lock",
        "scalar_arrays",
        "packed_arrays",
        "pending",
        "holders",
        "co_holders",
        "trace_hook",
        "seq",
        "on_host",
        "_caches",
    )

    def __init__(self) -> None:
        self.compile_cache = CompileCache()
        self.last_key: ProgramKey | None = None
        self.inflight: collections.deque[tuple[jax.Array, list[jax.Array]]] = collections.deque()
        self.before_next: list[Callable[[], None]] = []
        self.before_next_lock = threading.Lock()
        # Least recently used first (executor.scalar_array / packed_array).
        self.scalar_arrays: collections.OrderedDict[Hashable, jax.Array] = collections.OrderedDict()
        # A numpy vector: a set seen once, for a call (executor._packed_array).
        self.packed_arrays: collections.OrderedDict[Hashable, jax.Array | np.ndarray] = collections.OrderedDict()
        # Not caches (clear_caches leaves them alone): the engine's live data model.
        self.pending = PendingSet()
        self.holders: dict[int, weakref.ref[Storage]] = {}
        self.co_holders: dict[int, dict[int, weakref.ref[Storage]]] = {}
        # Called with the storage written and the value it held (None: a new storage).
        self.trace_hook: list[Callable[[Storage, jax.Array | LazyRef | None], None] | None] = [None]
        self.seq = itertools.count()
        self.on_host: weakref.WeakSet[Storage] = weakref.WeakSet()
        self._caches: dict[str, RegisteredCache] = {}
        cc = self.compile_cache
        self.register_cache(
            "lazy.executor.compile_cache", cc, maxsize=lambda: cc.maxsize, counts=lambda: (cc.evictions, 0)
        )
        # The executor evicts the least recently used beyond SCALAR_CACHE_MAX where it inserts.
        self.register_cache("lazy.executor.scalar_arrays", self.scalar_arrays, maxsize=SCALAR_CACHE_MAX)
        self.register_cache("lazy.executor.packed_arrays", self.packed_arrays, maxsize=SCALAR_CACHE_MAX)

    @property
    def max_in_flight(self) -> int:
        """``SPMDTORCH_MAX_IN_FLIGHT``: executions queued before the host waits."""
        return config.settings().max_in_flight

    def register_cache(
        self,
        name: str,
        cache: Any,
        size: Callable[[], int] | None = None,
        *,
        maxsize: int | Callable[[], int] | None = None,
        bound: str = "",
        counts: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        """Adds a per-process cache to those :meth:`clear_caches` resets.

        Modules make their caches with ``spmdtorch.lazy.caches`` (``bounded``,
        ``memoize``), which call this; the engine's own caches register here.

        Args:
            name: unique ``"module.what"``; registering a name again replaces it
                (a reloaded module).
            cache: anything with ``clear()`` and ``len()`` (a dict), or a
                zero-argument reset function (then give ``size``).
            size: its number of entries (default ``len(cache)``).
            maxsize: its bound (a number, or a function reading it from config).
            bound: where there is no ``maxsize``, what bounds it (its owner's
                lifetime, a finite key space); one of the two is required.
            counts: ``(evictions, bypasses)`` so far, for ``cache_stats()``.

        Raises:
            TypeError: ``cache`` cannot be cleared, or a reset function came
                without ``size``.
            ValueError: neither ``maxsize`` nor ``bound`` says how it is bounded.
        """
        if maxsize is None and not bound:
            raise ValueError(
                f"register_cache({name!r}): give maxsize=, or bound= saying what keeps it from growing "
                "without bound (design decision 10); spmdtorch.lazy.caches.bounded makes a bounded one"
            )
        if hasattr(cache, "clear"):
            clear = cache.clear
            size = size or (lambda: len(cache))
        elif callable(cache):
            if size is None:
                raise TypeError(f"register_cache({name!r}): a reset function needs size=")
            clear = cache
        else:
            raise TypeError(
                f"register_cache({name!r}): expected a dict-like cache or a reset function, got {type(cache).__name__}"
            )
        limit = maxsize if callable(maxsize) else (lambda: maxsize)
        self._caches[name] = RegisteredCache(name, clear, size, limit, bound, counts)

    def caches(self) -> tuple[RegisteredCache, ...]:
        """Every registered cache, in registration order."""
        return tuple(self._caches.values())

    def cache_sizes(self) -> dict[str, int]:
        """Entries per registered cache."""
        return {c.name: c.size() for c in self._caches.values()}

    def clear_caches(self) -> None:
        """Empties every registered cache (results unchanged; the next step re-compiles).

        Programs that a live ``spmdtorch.compile`` function holds stay with it;
        JAX's own caches (its jit and persistent compilation caches) are JAX's.
        """
        for c in self._caches.values():
            c.clear()
        self.last_key = None


#: The process's engine.
ENGINE = Engine()
