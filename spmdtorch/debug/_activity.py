"""How busy the devices were over a captured trace, and how long they waited (``device_activity``).

A step is host-bound when the device finishes its work before the host has
launched the next: the device then sits idle between programs. The trace
``spmdtorch.debug.profile`` (or any ``jax.profiler`` capture) writes holds
what each device ran and when, so the idle time is read off it rather than
inferred from timings:

* a GPU (``/device:GPU:N`` plane): the kernels and copies on its streams
  (the lines CUPTI names ``Stream #...``);
* a TPU (``/device:TPU:N``): its ``XLA Ops`` line;
* simulated CPU devices run on host threads, so there is one entry, ``"cpu"``,
  for XLA's CPU client as a whole: the events of its execution threads
  (``XLAPjRtCpuClient``) and intra-op pool (``XLAEigen``), less the thread
  pool's own bookkeeping marks. It is busy while any simulated device runs
  program work (a thunk, a collective, a wait inside a program) and idle
  while all of them wait for the host.

Busy time is the union of those intervals (overlapping kernels count once);
idle time is what the window from the first device work to the last leaves
uncovered, so the wait before the first launch of a capture is not counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["DeviceActivity", "activity_of", "newest_xspace", "summarize"]

_ACCELERATOR_PLANES = ("/device:GPU:", "/device:TPU:")
_HOST_PLANE = "/host:CPU"
# Thread names of XLA's CPU client on the host plane ("tf_" + the pool's name + "/" + id).
_CPU_CLIENT_THREADS = ("XLAPjRtCpuClient", "XLAEigen")
# Instant marks of the thread pool's listener (start/stop of a region, a task recorded): not work.
_CPU_BOOKKEEPING = "ThreadpoolListener::"


class DeviceActivity(NamedTuple):
    """Busy and idle time of one device over a trace (see :func:`device_activity`).

    Attributes:
        device: the trace's plane name (``"/device:GPU:0"``), or ``"cpu"`` for
            XLA's CPU client (every simulated CPU device together).
        start_ns: when its first work began (the trace's clock).
        end_ns: when its last work ended.
        busy_ns: time covered by its work (overlaps counted once).
        gaps: number of idle intervals between its work.
        longest_gap_ns: the longest of them (0 without gaps).
    """

    device: str
    start_ns: int
    end_ns: int
    busy_ns: int
    gaps: int
    longest_gap_ns: int

    @property
    def window_ns(self) -> int:
        """From its first work to its last."""
        return self.end_ns - self.start_ns

    @property
    def idle_ns(self) -> int:
        """Time in the window with no work: what it waited for the host (and for transfers)."""
        return self.window_ns - self.busy_ns

    @property
    def idle_fraction(self) -> float:
        """``idle_ns`` over the window (0.0 for an empty window)."""
        return self.idle_ns / self.window_ns if self.window_ns > 0 else 0.0


def summarize(device: str, intervals: Iterable[tuple[int, int]]) -> DeviceActivity | None:
    """The activity of ``device`` from its work's ``(start_ns, end_ns)`` intervals, in any order.

    Returns None when there are none.

    Example:
        >>> a = summarize("/device:GPU:0", [(0, 10), (5, 12), (20, 30)])
        >>> a.busy_ns, a.idle_ns, a.gaps, a.longest_gap_ns
        (22, 8, 1, 8)
    """
    ordered = sorted(intervals)
    if not ordered:
        return None
    start, end = ordered[0]
    busy = gaps = longest = 0
    for s, e in ordered[1:]:
        if s > end:  # a gap: close the merged interval
            busy += end - start
            gaps += 1
            longest = max(longest, s - end)
            start, end = s, e
        elif e > end:
            end = e
    busy += end - start
    return DeviceActivity(device, ordered[0][0], end, busy, gaps, longest)


def _events(lines, skip: str | None = None) -> list[tuple[int, int]]:
    """``(start_ns, end_ns)`` of the events on ``lines``, less those whose name starts with ``skip``."""
    return [
        (int(e.start_ns), int(e.end_ns))
        for line in lines
        for e in line.events
        if skip is None or not e.name.startswith(skip)
    ]


def _accelerator_work(plane) -> list[tuple[int, int]]:
    lines = list(plane.lines)
    streams = [line for line in lines if line.name.startswith("Stream #")]
    if streams:
        return _events(streams)
    return _events(line for line in lines if line.name == "XLA Ops")


def _cpu_client_work(plane) -> list[tuple[int, int]]:
    threads = [line for line in plane.lines if any(name in line.name for name in _CPU_CLIENT_THREADS)]
    return _events(threads, skip=_CPU_BOOKKEEPING)


def activity_of(profile: Any) -> list[DeviceActivity]:
    """:func:`device_activity` of a loaded ``jax.profiler.ProfileData``."""
    out: list[DeviceActivity] = []
    host = None
    accelerators = False
    for plane in profile.planes:
        if plane.name.startswith(_ACCELERATOR_PLANES):
            accelerators = True
            a = summarize(plane.name, _accelerator_work(plane))
            if a is not None:
                out.append(a)
        elif plane.name == _HOST_PLANE:
            host = plane
    # No accelerator in the trace: the devices are CPU devices, on host threads
    # (beside an accelerator, XLA's CPU client runs host work, not the devices').
    if not accelerators and host is not None:
        a = summarize("cpu", _cpu_client_work(host))
        if a is not None:
            out.append(a)
    return out


def newest_xspace(path: str | os.PathLike[str]) -> Path | None:
    """``path`` if it is a file, else the newest ``*.xplane.pb`` under the directory (None: none)."""
    p = Path(path)
    if p.is_file():
        return p
    if not p.is_dir():
        return None
    files = list(p.rglob("*.xplane.pb"))
    return max(files, key=lambda f: f.stat().st_mtime) if files else None
