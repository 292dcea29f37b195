"""The lazy engine's process state, in one object: :data:`ENGINE`.

Everything the engine keeps between ops and steps hangs off this one
:class:`Engine`: the compile cache (bounded, least recently used evicted), the
queue of executions in flight, the calls owed before the next execution, the
device-array caches of Python scalars, and a registry of every other
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
    * The in-flight queue and the owed calls are *not* caches: clearing leaves
      them alone (dropping an execution's entry would lift the in-flight bound).

This module imports only ``spmdtorch.config`` and ``lazy.metrics``: every layer
above may register with it.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Hashable
from typing import Any

from spmdtorch import config
from spmdtorch.lazy import metrics

__all__ = ["ENGINE", "CompileCache", "Engine", "RegisteredCache"]

#: Counter incremented for each program the compile cache evicts.
EVICTION_COUNTER = "CompileCacheEvictions"


class CompileCache:
    """Compiled programs by graph key, least recently used evicted beyond ``maxsize``.

    A hit moves the entry to the back (one C call; a lookup happens once per
    step, not per op). ``maxsize`` is read from ``config.settings()`` at each
    insertion, so ``config.reload()`` resizes it at the next compilation.

    Example:
        >>> c = CompileCache(maxsize=2)
        >>> for k in "abc":
        ...     c.put(k, k.upper())
        >>> c.get("a"), c.get("c"), len(c), c.evictions
        (None, 'C', 2, 1)
    """

    __slots__ = ("_data", "_maxsize", "evictions")

    def __init__(self, maxsize: int | None = None):
        self._data: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._maxsize = maxsize  # None: config's SPMDTORCH_COMPILE_CACHE_SIZE
        self.evictions = 0

    @property
    def maxsize(self) -> int:
        """The bound in force (``SPMDTORCH_COMPILE_CACHE_SIZE`` unless given)."""
        return config.settings().compile_cache_size if self._maxsize is None else self._maxsize

    def get(self, key: Hashable) -> Any:
        prog = self._data.get(key)
        if prog is not None:
            self._data.move_to_end(key)
        return prog

    def peek(self, key: Hashable) -> Any:
        """Like :meth:`get`, without making the entry recent (debug readers)."""
        return self._data.get(key)

    def put(self, key: Hashable, prog: Any) -> None:
        data = self._data
        data[key] = prog
        data.move_to_end(key)
        bound = self.maxsize
        while len(data) > bound:
            # The program stays alive while someone holds it (a compiled
            # function's record, a running execution); the cache just forgets it.
            data.popitem(last=False)
            self.evictions += 1
            metrics.inc(EVICTION_COUNTER)

    def clear(self) -> None:
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data


@dataclasses.dataclass(frozen=True, slots=True)
class RegisteredCache:
    """A per-process cache some module owns, as the engine sees it.

    Attributes:
        name: ``"module.what"``, e.g. ``"lazy.keys.signatures"``.
        clear: empties it, in place.
        size: its number of entries.
    """

    name: str
    clear: Callable[[], None]
    size: Callable[[], int]


class Engine:
    """The lazy engine's per-process state (one instance, :data:`ENGINE`).

    Attributes:
        compile_cache: graph key -> compiled program (``executor._Program``).
        last_key: the key of the last program compiled (``debug.last_executable``).
        inflight: per queued execution ``(sentinel, donated inputs)`` (``executor``).
        before_next: calls owed before the next execution; guarded by ``before_next_lock``.
        scalar_arrays: ``(type, value, mesh)`` -> replicated device scalar.
        packed_arrays: ``(kind, values, mesh)`` -> replicated device vector of scalars.
        pending: the set of storages with a pending value. Today this is
            ``tensor.xla_tensor._PENDING``; it moves below ``tensor/`` (issue 16,
            item 1) and is wired here when it does. None until then.
        holders: ``id(jax.Array)`` -> the storage(s) holding it; same story
            (today ``tensor.xla_tensor._HOLDERS``). None until wired.
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
        "_caches",
    )

    def __init__(self) -> None:
        self.compile_cache = CompileCache()
        self.last_key: Hashable | None = None
        self.inflight: collections.deque = collections.deque()
        self.before_next: list[Callable[[], None]] = []
        self.before_next_lock = threading.Lock()
        self.scalar_arrays: dict = {}
        self.packed_arrays: dict = {}
        self.pending = None  # wired by the lead when Storage's pending set moves to lazy/
        self.holders = None  # wired by the lead when the holder registry moves to lazy/
        self._caches: dict[str, RegisteredCache] = {}
        self.register_cache("lazy.executor.compile_cache", self.compile_cache)
        self.register_cache("lazy.executor.scalar_arrays", self.scalar_arrays)
        self.register_cache("lazy.executor.packed_arrays", self.packed_arrays)

    @property
    def max_in_flight(self) -> int:
        """``SPMDTORCH_MAX_IN_FLIGHT``: executions queued before the host waits."""
        return config.settings().max_in_flight

    def register_cache(self, name: str, cache: Any, size: Callable[[], int] | None = None) -> None:
        """Adds a per-process cache to those :meth:`clear_caches` resets.

        Args:
            name: unique ``"module.what"``; registering a name again replaces it
                (a reloaded module).
            cache: anything with ``clear()`` and ``len()`` (a dict), a
                ``functools.lru_cache`` function, or a zero-argument reset function
                (then give ``size``).
            size: its number of entries (default ``len(cache)``, or
                ``cache_info().currsize`` for an ``lru_cache``).
        """
        if hasattr(cache, "cache_clear"):
            clear = cache.cache_clear
            size = size or (lambda: cache.cache_info().currsize)
        elif hasattr(cache, "clear"):
            clear = cache.clear
            size = size or (lambda: len(cache))
        elif callable(cache):
            if size is None:
                raise TypeError(f"register_cache({name!r}): a reset function needs size=")
            clear = cache
        else:
            raise TypeError(
                f"register_cache({name!r}): expected a dict-like cache, an lru_cache function or a reset "
                f"function, got {type(cache).__name__}"
            )
        self._caches[name] = RegisteredCache(name, clear, size)

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
