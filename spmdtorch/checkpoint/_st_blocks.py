"""Positioned reads of tensor blocks from a safetensors file, without memory-mapping it.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``name -> {"dtype", "shape", "data_offsets": [begin, end]}``, offsets
relative to the end of the header) and the tensors' bytes, each one
row-major blob. A block (a box of index ranges, one per dim) of such a blob
is a set of equally long contiguous byte runs; :meth:`ShardFile.read_block`
reads exactly those runs with ``preadv`` straight into the block's own
buffer (runs separated by less than a page are read together through a
small scratch buffer: one read call costs more than the gap's bytes).

Why not ``safetensors.safe_open(...).get_slice``: it reads from a memory
map of the whole file, and every page it touches stays in the process's
resident set (counted by the kernel, by RSS limits and by the OOM killer)
until the file is unmapped. Loading a shard file tensor by tensor that way
holds the whole shard file resident on top of the model. Positioned reads go
through the page cache, which is not the process's memory: what a load
holds is the block buffers themselves. A file truncated while it is read is
a short read (an error naming the file), where a memory map would kill the
process with SIGBUS.

The header is parsed here again (``safe_open`` has already validated it when
the load checked names and shapes): every offset used is checked against
the file's size and the tensor's dtype and shape, so a file that changed
since is an error, never a read outside the tensor.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
import sys
import threading
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["ST_DTYPES", "ShardFile", "ShardReadError", "TensorEntry"]

ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}

# safetensors refuses headers above 100 MB; so does this reader.
_MAX_HEADER = 100_000_000
# Runs closer than this are read in one call: below about a page, reading the
# gap costs less than another system call.
_GAP = 4096
# ...as long as one such combined read stays this small (the scratch buffer).
_SPAN = 1 << 20
# Linux returns at most this many bytes from one read call.
_MAX_READ = 0x7FFFF000


class ShardReadError(ValueError):
    """A safetensors file whose header or data cannot be read as its header says (the caller names the file)."""


class TensorEntry(NamedTuple):
    """Where one tensor lies in a safetensors file.

    Attributes:
        key: its name in the file.
        dtype: its torch dtype.
        shape: its shape.
        start: the absolute byte offset of its first element.
    """

    key: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int


class ShardFile:
    """One safetensors file open for positioned reads of tensor blocks (a context manager that closes it).

    Raises:
        ShardReadError: the file is not a regular file, or its header is not
            a safetensors header that fits the file.
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        # O_NONBLOCK: a FIFO put where the shard was must not block the open (it is refused below).
        flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        self._fd = os.open(path, flags)
        self._lock = threading.Lock()  # only where os.preadv is missing (seek + read)
        try:
            info = os.fstat(self._fd)
            if not stat.S_ISREG(info.st_mode):
                raise ShardReadError("it is not a regular file")
            self._size = info.st_size
            self._header, self._data_start = self._read_header()
        except BaseException:
            os.close(self._fd)
            raise

    def __enter__(self) -> ShardFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _read_header(self) -> tuple[dict[str, Any], int]:
        if self._size < 8:
            raise ShardReadError(f"the file has {self._size} bytes, fewer than the 8 of a header length")
        (length,) = struct.unpack("<Q", self._pread(8, 0))
        if length > _MAX_HEADER or 8 + length > self._size:
            raise ShardReadError(f"header length {length} does not fit the file ({self._size} bytes)")
        try:
            header = json.loads(self._pread(length, 8))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ShardReadError(f"the header is not JSON ({type(e).__name__}: {e})") from e
        if not isinstance(header, dict):
            raise ShardReadError(f"the header is a JSON {type(header).__name__}, not an object")
        return header, 8 + length

    def entry(self, key: str) -> TensorEntry:
        """Where tensor ``key`` lies, checked against the file's size.

        Raises:
            ShardReadError: ``key`` is missing or its header entry is
                malformed or points outside the file's data.
        """
        info = self._header.get(key) if key != "__metadata__" else None
        if not isinstance(info, dict):
            raise ShardReadError(f"the header has no entry for tensor {key!r}")
        dtype = ST_DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if (
            dtype is None
            or not isinstance(shape, list)
            or not all(type(n) is int and n >= 0 for n in shape)
            or not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(n) is int for n in offsets)
        ):
            raise ShardReadError(f"the header entry of {key!r} is malformed: {str(info)[:200]}")
        begin, end = offsets
        nbytes = math.prod(shape) * dtype.itemsize
        if not 0 <= begin <= end <= self._size - self._data_start or end - begin != nbytes:
            raise ShardReadError(
                f"the header places {key!r} ({info['dtype']} {shape}: {nbytes} bytes) at data bytes "
                f"[{begin}, {end}), which does not fit its size or the file's {self._size - self._data_start} "
                "data bytes"
            )
        return TensorEntry(key, dtype, tuple(shape), self._data_start + begin)

    def read_block(self, entry: TensorEntry, bounds: tuple[tuple[int, int], ...]) -> torch.Tensor:
        """The block ``bounds`` (``(start, stop)`` per dim, within the shape) of ``entry``, in a new CPU tensor.

        Raises:
            ShardReadError: the file ends before the block's bytes (it was
                truncated since the header was read).
        """
        out = torch.empty([b - a for a, b in bounds], dtype=entry.dtype)
        if out.numel() == 0:
            return out
        buf = out.reshape(-1).view(torch.uint8).numpy().data  # the tensor's own bytes, writable
        offsets, length = block_runs(entry.shape, bounds, entry.dtype.itemsize)
        self._read_runs(entry.start, offsets.tolist(), length, buf)
        if sys.byteorder == "big" and entry.dtype.itemsize > 1:  # safetensors stores little-endian
            np.frombuffer(buf, dtype=f"u{entry.dtype.itemsize}").byteswap(inplace=True)
        return out

    def _read_runs(self, start: int, offsets: list[int], length: int, out: memoryview) -> None:
        """Read the runs ``[start + o, start + o + length)`` one after another into ``out``."""
        scratch: memoryview | None = None
        pos, i, n = 0, 0, len(offsets)
        while i < n:
            first, k = offsets[i], i + 1
            while k < n and offsets[k] - offsets[k - 1] - length <= _GAP and offsets[k] + length - first <= _SPAN:
                k += 1
            if k == i + 1:
                self._pread_into(out[pos : pos + length], start + first)
                pos += length
            else:  # close runs: one read of their span, then each run copied out of it
                if scratch is None:
                    scratch = memoryview(bytearray(_SPAN))
                span = scratch[: offsets[k - 1] + length - first]
                self._pread_into(span, start + first)
                for o in offsets[i:k]:
                    out[pos : pos + length] = span[o - first : o - first + length]
                    pos += length
            i = k

    def _pread(self, n: int, offset: int) -> bytes:
        buf = bytearray(n)
        self._pread_into(memoryview(buf), offset)
        return bytes(buf)

    def _pread_into(self, buf: memoryview, offset: int) -> None:
        got = 0
        while got < len(buf):
            part = buf[got : got + _MAX_READ]
            try:
                if hasattr(os, "preadv"):
                    n = os.preadv(self._fd, [part], offset + got)
                else:  # no positioned read (Windows): seek and read under the lock
                    with self._lock:
                        os.lseek(self._fd, offset + got, os.SEEK_SET)
                        data = os.read(self._fd, len(part))
                        part[: len(data)] = data
                        n = len(data)
            except OSError as e:  # EIO from a failing disk or network file system
                raise ShardReadError(f"reading {len(part)} bytes at byte {offset + got} failed: {e}") from e
            if n == 0:
                raise ShardReadError(
                    f"the file ends at byte {self._size_now()}, before byte {offset + len(buf)} that the header "
                    "promised (it was truncated while being read)"
                )
            got += n

    def _size_now(self) -> int:
        return os.fstat(self._fd).st_size


def block_runs(
    shape: tuple[int, ...], bounds: tuple[tuple[int, int], ...], itemsize: int
) -> tuple[npt.NDArray[np.int64], int]:
    """The contiguous byte runs of a block of a row-major tensor: their offsets (ascending) and common length.

    The runs follow each other in the block's own row-major order, so reading
    them one after another fills a contiguous buffer of the block's shape.

    Example:
        >>> offsets, length = block_runs((4, 6), ((1, 3), (2, 5)), 1)
        >>> offsets.tolist(), length
        ([8, 14], 3)
    """
    j = len(shape) - 1  # the last dim the block does not cover whole: runs span it and every dim after
    while j >= 0 and bounds[j] == (0, shape[j]):
        j -= 1
    if j < 0:
        return np.zeros(1, dtype=np.int64), math.prod(shape) * itemsize
    strides = [math.prod(shape[k + 1 :]) for k in range(len(shape))]
    offsets = np.array([bounds[j][0] * strides[j]], dtype=np.int64)
    for k in range(j - 1, -1, -1):  # outer dims: the earliest varies slowest
        a, b = bounds[k]
        offsets = (np.arange(a, b, dtype=np.int64)[:, None] * strides[k] + offsets[None, :]).reshape(-1)
    return offsets * itemsize, (bounds[j][1] - bounds[j][0]) * strides[j] * itemsize
