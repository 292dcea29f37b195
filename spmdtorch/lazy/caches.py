"""Per-process caches: the one helper that bounds each cache and registers it with the engine.

Design decision 10: every per-process cache is bounded, listed by
``spmdtorch.debug.cache_sizes()`` / ``cache_stats()`` and emptied by
``clear_caches()``. A module makes a cache with :func:`bounded` (a dict) or
:func:`memoize` (a function), never with ``functools.cache`` or a bare
module-level dict; ``tests/lazy/test_caches.py`` scans the package for both.

One policy: :class:`BoundedCache`, insertion order, the oldest quarter
forgotten when a new key arrives at a full cache. Lookups stay plain
``dict.get`` (no recency bookkeeping on the hot path); a workload whose keys
never repeat cannot grow a cache, and a steady one is never evicted. Only two
caches keep least-recently-used order, because a miss there costs a compile or
a transfer (``CompileCache`` and the device-scalar caches, on the engine).

A call that cannot use its cache (an unhashable argument) is a *bypass*: it
runs uncached and is counted, so a cache that silently stopped working shows
up in ``cache_stats()``.

Example:
    >>> from spmdtorch.lazy import caches
    >>> squares = caches.bounded("doc.squares", maxsize=2)
    >>> for i in range(3):
    ...     squares.put(i, i * i)
    >>> sorted(squares), squares.evictions
    ([1, 2], 1)
    >>> @caches.memoize("doc.double", maxsize=8)
    ... def double(x):
    ...     return 2 * x
    >>> double(3), double([1]), double.cache.bypasses
    (6, [1, 1], 1)
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, ParamSpec, TypeVar

from spmdtorch import ops
from spmdtorch.lazy._engine import ENGINE

__all__ = ["BoundedCache", "CacheStats", "Memoized", "bounded", "memoize", "register", "stats"]

P = ParamSpec("P")
R = TypeVar("R")
K = TypeVar("K")
V = TypeVar("V")
_MISS = object()


class CacheStats(NamedTuple):
    """One registered cache, as ``spmdtorch.debug.cache_stats()`` reports it.

    Attributes:
        size: entries now.
        maxsize: its bound, or None for a cache whose owner bounds it (then
            ``bound`` says how).
        evictions: entries forgotten because the cache was full.
        bypasses: calls that could not use the cache (unhashable arguments).
        bound: for ``maxsize=None``, why it cannot grow without bound.
    """

    size: int
    maxsize: int | None
    evictions: int
    bypasses: int
    bound: str


class BoundedCache(dict[K, V]):
    """A dict that forgets its oldest entries beyond ``maxsize`` (insertion order).

    Make one with :func:`bounded`, which also registers it. Reads are plain
    ``dict`` reads; write through :meth:`put`, which enforces the bound.

    Example:
        >>> c = BoundedCache(4)
        >>> for i in range(6):
        ...     c.put(i, str(i))
        >>> len(c) <= 4, c.get(5), c.evictions
        (True, '5', 2)
    """

    __slots__ = ("maxsize", "evictions", "bypasses")

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        if type(maxsize) is not int or maxsize < 1:
            raise ValueError(f"BoundedCache maxsize must be a positive int, got {maxsize!r}")
        self.maxsize = maxsize
        self.evictions = 0  # entries forgotten because the cache was full
        self.bypasses = 0  # calls that could not use the cache

    def put(self, key: K, value: V) -> None:
        """Stores ``value``; a new key at a full cache first forgets the oldest quarter."""
        if len(self) >= self.maxsize and key not in self:
            drop = max(1, self.maxsize // 4)
            for old in list(itertools.islice(iter(self), drop)):
                del self[old]
            self.evictions += drop
        self[key] = value


def bounded(name: str, maxsize: int) -> BoundedCache[Any, Any]:
    """A new :class:`BoundedCache` registered with the engine as ``name`` (``"module.what"``).

    Example:
        >>> from spmdtorch import debug
        >>> c = bounded("doc.bounded", maxsize=16)
        >>> c.put("k", 1)
        >>> debug.cache_sizes()["doc.bounded"]
        1
    """
    cache: BoundedCache[Any, Any] = BoundedCache(maxsize)
    ENGINE.register_cache(name, cache, maxsize=maxsize, counts=lambda: (cache.evictions, cache.bypasses))
    return cache


def register(
    name: str,
    cache: Any,
    size: Callable[[], int] | None = None,
    *,
    maxsize: int | None = None,
    bound: str = "",
) -> None:
    """Registers a cache this module did not make (one whose policy its owner needs), for the layers above.

    Prefer :func:`bounded` / :func:`memoize`. Arguments as
    ``Engine.register_cache``: a dict-like ``cache`` or a reset function with
    ``size``; ``maxsize``, or ``bound`` saying what keeps it from growing.

    Example:
        >>> from spmdtorch import debug
        >>> table = {}
        >>> register("doc.table", table, bound="one entry per live documentation example")
        >>> debug.cache_stats()["doc.table"].bound
        'one entry per live documentation example'
    """
    ENGINE.register_cache(name, cache, size, maxsize=maxsize, bound=bound)


class Memoized(Generic[P, R]):
    """A function whose results :func:`memoize` keeps in ``cache`` (a registered :class:`BoundedCache`)."""

    __slots__ = ("__dict__", "_fn", "cache")

    def __init__(self, fn: Callable[P, R], cache: BoundedCache[tuple[Any, ...], Any]) -> None:
        self._fn: Callable[..., R] = fn  # called with the positional key alone
        self.cache = cache
        functools.update_wrapper(self, fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        if kwargs:  # keys are positional only: a keyword call is computed, uncached, counted
            self.cache.bypasses += 1
            return self._fn(*args, **kwargs)
        try:
            hit: R = self.cache.get(args, _MISS)  # an R, or _MISS

        except TypeError:  # an unhashable argument: run it uncached, counted
            self.cache.bypasses += 1
            return self._fn(*args)
        if hit is _MISS:
            hit = self._fn(*args)
            self.cache.put(args, hit)
        return hit


def memoize(name: str, maxsize: int) -> Callable[[Callable[P, R]], Memoized[P, R]]:
    """Caches a function of positional, hashable arguments in a registered :class:`BoundedCache`.

    The replacement for ``functools.cache`` / ``lru_cache`` in this package:
    bounded, emptied by ``clear_caches()``, listed as ``name``. A call with an
    unhashable argument (or keyword arguments) runs uncached and counts a
    bypass. The cache is the wrapper's ``cache`` attribute.

    Example:
        >>> @memoize("doc.memoize", maxsize=4)
        ... def square(n):
        ...     return n * n
        >>> square(5), len(square.cache)
        (25, 1)
    """

    def decorate(fn: Callable[P, R]) -> Memoized[P, R]:
        return Memoized(fn, bounded(name, maxsize))

    return decorate


def _register_ops_memos() -> None:
    """The ``ops`` layer sits below the engine: its ``lru_cache`` tables (``ops.MEMOS``) are registered here."""
    for fn in ops.MEMOS:
        module = fn.__module__.rsplit(".", 1)[-1].lstrip("_")
        ENGINE.register_cache(
            f"ops.{module}.{fn.__name__.lstrip('_')}",
            fn.cache_clear,
            size=_lru_size(fn),
            maxsize=fn.cache_info().maxsize,
        )


def _lru_size(fn: Any) -> Callable[[], int]:
    def size() -> int:
        return int(fn.cache_info().currsize)

    return size


_register_ops_memos()


def stats() -> dict[str, CacheStats]:
    """Every registered cache's :class:`CacheStats`, by name (``spmdtorch.debug.cache_stats``)."""
    out = {}
    for c in ENGINE.caches():
        evictions, bypasses = c.counts() if c.counts is not None else (0, 0)
        out[c.name] = CacheStats(c.size(), c.maxsize(), evictions, bypasses, c.bound)
    return out
