"""Counters and timers behind ``spmdtorch.debug`` (PyTorch/XLA's metric names).

Kept dependency-free and cheap: the hot path only increments ints.
"""

from __future__ import annotations

import collections
import contextlib
import time
from collections.abc import Iterator

__all__ = ["counters", "timers", "samples", "inc", "timed", "reset", "reset_counters", "reset_timers"]

#: Samples kept per timer (a circular buffer, as PyTorch/XLA's metrics keep).
MAX_SAMPLES = 1024

counters: collections.Counter[str] = collections.Counter()
# name -> [count, total seconds, max seconds]
timers: dict[str, list[float]] = {}
# name -> the last MAX_SAMPLES (wall-clock time, seconds) pairs, for PyTorch/XLA's metric_data
samples: dict[str, collections.deque[tuple[float, float]]] = {}


def inc(name: str, n: int = 1) -> None:
    counters[name] += n


def add_time(name: str, seconds: float) -> None:
    entry = timers.get(name)
    if entry is None:
        timers[name] = [1, seconds, seconds]
        samples[name] = collections.deque(maxlen=MAX_SAMPLES)
    else:
        entry[0] += 1
        entry[1] += seconds
        entry[2] = max(entry[2], seconds)
    samples[name].append((time.time(), seconds))


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:

    start = time.perf_counter()
    try:
        yield
    finally:
        add_time(name, time.perf_counter() - start)


def reset() -> None:
    counters.clear()
    reset_timers()


def reset_counters() -> None:
    counters.clear()


def reset_timers() -> None:
    timers.clear()
    samples.clear()
