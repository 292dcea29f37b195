"""Counters and timers behind ``spmdtorch.debug`` (PyTorch/XLA's metric names).

Kept dependency-free and cheap: the hot path only increments ints.
"""

from __future__ import annotations

import collections
import contextlib
import time

__all__ = ["counters", "timers", "inc", "timed", "reset"]

counters: collections.Counter[str] = collections.Counter()
# name -> [count, total seconds, max seconds]
timers: dict[str, list] = {}


def inc(name: str, n: int = 1) -> None:
    counters[name] += n


def add_time(name: str, seconds: float) -> None:
    entry = timers.get(name)
    if entry is None:
        timers[name] = [1, seconds, seconds]
    else:
        entry[0] += 1
        entry[1] += seconds
        entry[2] = max(entry[2], seconds)


@contextlib.contextmanager
def timed(name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        add_time(name, time.perf_counter() - start)


def reset() -> None:
    counters.clear()
    timers.clear()
