"""``ParallelLoader`` / ``MpDeviceLoader``: background host-to-device input loading.

PyTorch/XLA's loaders on spmdtorch. A loader thread pulls batches from the
wrapped iterable (``torch.utils.data.DataLoader`` or any iterable) into a
queue of ``loader_prefetch_size``; ``host_to_device_transfer_threads``
threads copy them to the devices (sharded by ``input_sharding``) and keep up
to ``device_prefetch_size`` transferred batches ready, in loader order. The
consumer wraps them as xla tensors and calls ``spmdtorch.sync()`` (mark_step)
every ``batches_per_execution`` batches, before taking the next one, and at
the end, as PyTorch/XLA does.

In a multi-process job, with ``ShardingSpec(..., minibatch=True)`` each
process's loader yields only its part of the global batch (e.g. a
``DistributedSampler`` slice); the batches come out as global tensors
sharded over every process's devices.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.partition import ShardingSpec
    >>> from spmdtorch.data import MpDeviceLoader
    >>> mesh = Mesh(np.arange(8), (8,), ("data",))
    >>> batches = [torch.arange(16.0).reshape(8, 2) + i for i in range(3)]
    >>> loader = MpDeviceLoader(batches, spmdtorch.device(), input_sharding=ShardingSpec(mesh, ("data", None)))
    >>> [float(b.sum()) for b in loader]
    [120.0, 136.0, 152.0]
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence, Sized
from typing import Any

import torch

from spmdtorch.data import _resume, transfer
from spmdtorch.data.errors import InputShardingError, LoaderArgumentError, LoaderArgumentTypeError, LoaderWorkerError
from spmdtorch.programs import mark_step
from spmdtorch.sharding import ShardingSpec

__all__ = ["MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]

_POLL_S = 0.05  # how often blocked threads look at the stop flag


class _End:
    """End of the wrapped loader after ``count`` batches."""

    def __init__(self, count: int) -> None:
        self.count = count


class _Failed:
    """The batch at this index could not be loaded or transferred."""

    def __init__(self, error: BaseException, stage: str) -> None:
        self.error = error
        self.stage = stage


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoaderArgumentError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _check_loader(loader: object, owner: str) -> None:
    if not hasattr(loader, "__iter__") or isinstance(loader, (str, bytes)):
        raise LoaderArgumentTypeError(
            f"{owner}: loader must be an iterable of batches (e.g. a torch.utils.data.DataLoader), got "
            f"{type(loader).__name__} {loader!r}"
        )


#: ParallelLoader's options besides loader/devices (MpDeviceLoader passes them through).
_OPTIONS = (
    "batchdim",
    "batches_per_execution",
    "loader_prefetch_size",
    "device_prefetch_size",
    "host_to_device_transfer_threads",
    "input_sharding",
)


def _loader_len(loader: Iterable[Any]) -> int:
    # TypeError, as len() itself raises: list(loader) then falls back to no length hint.
    if not isinstance(loader, Sized):
        raise TypeError(
            f"the wrapped loader, a {type(loader).__name__}, has no len(); wrap a loader with a length "
            "(e.g. a DataLoader over a map-style dataset) to take len() of this one"
        )
    return len(loader)


class ParallelLoader:
    """Wraps a loader with background loading and host-to-device transfer.

    Args:
        loader: An iterable of batches (tensors, or dicts/tuples/lists of
            them), e.g. a ``torch.utils.data.DataLoader``.
        devices: The xla devices to load for: one per process in SPMD
            (``[spmdtorch.device()]``).
        batchdim: The batch dimension, kept for PyTorch/XLA compatibility
            (``minibatch=True`` always splits dim 0, as in PyTorch/XLA).
        batches_per_execution: Call ``spmdtorch.sync()`` every this many
            batches.
        loader_prefetch_size: Batches read ahead from ``loader``.
        device_prefetch_size: Batches already on the devices, waiting.
        host_to_device_transfer_threads: Threads doing the transfers.
        input_sharding: None (tensors are replicated), a
            ``spmdtorch.partition.ShardingSpec`` (applied to every tensor
            with one partition_spec entry per dim; others are replicated), or
            a dict from batch key to ``ShardingSpec`` for dict batches.

    Raises:
        LoaderArgumentError: a size is not a positive int (a ``ValueError``;
            ``LoaderArgumentTypeError``, also a ``TypeError``, for a wrong type).
        InputShardingError: ``devices`` is not one xla device, or
            ``input_sharding`` is malformed (see :class:`MpDeviceLoader`).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        devices: torch.device | str | Sequence[torch.device | str],
        batchdim: int = 0,
        batches_per_execution: int = 1,
        loader_prefetch_size: int = 8,
        device_prefetch_size: int = 4,
        host_to_device_transfer_threads: int = 1,
        input_sharding: ShardingSpec | dict[Any, ShardingSpec] | None = None,
        *,
        _batches: Iterator[Any] | None = None,
    ) -> None:
        _check_loader(loader, "ParallelLoader")
        if not isinstance(devices, (str, torch.device, Sequence)):
            raise LoaderArgumentTypeError(
                f"ParallelLoader: devices must be an xla device or a list of one, got {type(devices).__name__} "
                f"{devices!r}; pass [spmdtorch.device()]"
            )
        devices = [devices] if isinstance(devices, (str, torch.device)) else list(devices)
        if len(devices) != 1:
            raise InputShardingError(
                f"ParallelLoader got {len(devices)} devices; spmdtorch runs SPMD with one virtual xla device "
                "per process: pass [spmdtorch.device()] and shard batches with input_sharding"
            )
        transfer._check_device(devices[0])
        if isinstance(batchdim, bool) or not isinstance(batchdim, int):
            raise LoaderArgumentTypeError(f"batchdim must be an int, got {batchdim!r}")
        self._devices = [torch.device(devices[0])]
        self._batchdim = batchdim
        self._batches_per_execution = _positive_int("batches_per_execution", batches_per_execution)
        self._device_prefetch = _positive_int("device_prefetch_size", device_prefetch_size)
        n_threads = _positive_int("host_to_device_transfer_threads", host_to_device_transfer_threads)
        self._shardings = transfer.InputShardings(input_sharding)
        self._loader = loader
        # What the loading thread iterates: MpDeviceLoader starts the epoch's
        # iterator itself (data/_resume.py), otherwise the loader.
        self._batches: Iterable[Any] = loader if _batches is None else _batches
        # (batch index, batch or _Failed), then (batch count, _End) once per transfer thread.
        self._loader_queue: queue.Queue[tuple[int, Any]] = queue.Queue(
            maxsize=_positive_int("loader_prefetch_size", loader_prefetch_size)
        )
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._ready: dict[int, Any] = {}  # batch index -> transferred batch (or _Failed)
        self._next = 0  # index of the batch the consumer takes next
        self._total: int | None = None  # number of batches, once the loader is exhausted
        self._ended = False  # the consumer was told that there are no more batches
        self._threads = [threading.Thread(target=self._load, name="spmdtorch-loader", daemon=True)]
        self._threads += [
            threading.Thread(target=self._transfer, name=f"spmdtorch-h2d-{i}", daemon=True) for i in range(n_threads)
        ]
        for t in self._threads:
            t.start()

    # -- background threads -------------------------------------------------
    def _put(self, item: tuple[int, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._loader_queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _load(self) -> None:
        index = 0
        try:
            for batch in self._batches:
                if not self._put((index, batch)):
                    return
                index += 1
        # BaseException too: a dataset raising SystemExit or CancelledError must
        # not end this thread silently, or the consumer would wait forever.
        except BaseException as e:  # noqa: BLE001 - the dataset failed: the consumer re-raises it
            self._put((index, _Failed(e, "loading")))
            index += 1
        with self._cond:
            self._total = index
            self._cond.notify_all()
        for _ in range(len(self._threads) - 1):
            self._put((index, _End(index)))

    def _transfer(self) -> None:
        while not self._stop.is_set():
            try:
                index, batch = self._loader_queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if isinstance(batch, _End):
                return
            with self._cond:  # keep at most device_prefetch_size batches on the devices ahead
                while index - self._next >= self._device_prefetch and not self._stop.is_set():
                    self._cond.wait(_POLL_S)
            if self._stop.is_set():
                return
            if not isinstance(batch, _Failed):
                try:
                    batch = transfer.place(batch, self._shardings, index)
                except BaseException as e:  # noqa: BLE001 - the consumer re-raises it with the index
                    batch = _Failed(e, "transferring")
            with self._cond:
                self._ready[index] = batch
                self._cond.notify_all()

    # -- consumer side ------------------------------------------------------
    def per_device_loader(self, device: torch.device | str) -> PerDeviceLoader:
        """The iterator over this loader's batches, for ``device`` (the xla device).

        Example:
            >>> import torch, spmdtorch
            >>> pl = ParallelLoader([torch.ones(2)], [spmdtorch.device()])
            >>> [b.device.type for b in pl.per_device_loader(spmdtorch.device())]
            ['xla']
        """
        transfer._check_device(device)
        return PerDeviceLoader(self, torch.device(device))

    def per_device_samples(self) -> int:
        """Batches per device: ``len(loader)`` (one virtual device per process)."""
        return _loader_len(self._loader) // len(self._devices)

    def next_item(self, device: torch.device | str | None = None) -> Any:
        """The next batch on the devices, or None at the end.

        Raises:
            LoaderWorkerError: loading or transferring this batch failed (the
                original exception is chained).
        """
        with self._cond:
            while self._next not in self._ready:
                if self._total is not None and self._next >= self._total:
                    self._ended = True
                    return None
                if self._stop.is_set():
                    return None
                self._cond.wait(_POLL_S)
            item = self._ready.pop(self._next)
            index = self._next
            self._next += 1
            self._cond.notify_all()
        if isinstance(item, _Failed):
            self.close()
            error = item.error
            if not isinstance(error, Exception):
                # SystemExit, KeyboardInterrupt, CancelledError...: not a data error
                # to wrap but a request to stop, carried out on the consumer's thread.
                error.add_note(
                    f"raised by the wrapped loader while {item.stage} batch {index} (spmdtorch loader thread)"
                )
                raise error
            raise LoaderWorkerError(
                f"batch {index} failed while {item.stage}: {type(error).__name__}: {error}", index
            ) from error
        return transfer.wrap(*item)

    def close(self) -> None:
        """Stops the background threads (they exit within ~50 ms, or after the
        wrapped loader returns its current batch)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        current = threading.current_thread()
        for t in self._threads:
            if t is not current:
                t.join(timeout=1.0)

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)  # absent when __init__ raised
        if stop is not None:
            stop.set()


class PerDeviceLoader:
    """Iterates a :class:`ParallelLoader`'s batches, syncing as PyTorch/XLA does."""

    def __init__(self, loader: ParallelLoader, device: torch.device) -> None:
        self._loader = loader
        self._device = device
        self._mark_step_batch_count = loader._batches_per_execution - 1
        self._batches_yielded = 0

    def __iter__(self) -> PerDeviceLoader:
        return self

    def __next__(self) -> Any:
        return self.next()

    def __len__(self) -> int:
        return self._loader.per_device_samples()

    def next(self) -> Any:
        if self._mark_step_batch_count <= self._batches_yielded:
            self._batches_yielded = 0
            mark_step()
        else:
            self._batches_yielded += 1
        item = self._loader.next_item(self._device)
        if item is None:
            self._loader.close()
            mark_step()
            raise StopIteration
        return item

    def close(self) -> None:
        """Stops the loader's background threads."""
        self._loader.close()

    def __del__(self) -> None:
        self._loader._stop.set()


class MpDeviceLoader:
    """Wraps ``loader`` so that its batches arrive on the devices, prefetched.

    Each ``iter()`` starts a :class:`ParallelLoader` over ``loader``; keyword
    arguments go to it (``input_sharding``, ``batches_per_execution``,
    ``loader_prefetch_size``, ``device_prefetch_size``,
    ``host_to_device_transfer_threads``).

    ``input_sharding``:

    * a ``ShardingSpec``: every tensor with one partition_spec entry per dim
      gets that sharding (others are replicated, as in PyTorch/XLA);
    * a dict ``{batch key: ShardingSpec}`` for dict batches: each named key
      gets its spec (every named key must be in every batch), other keys are
      replicated;
    * ``minibatch=True`` in a spec: the loader of each process yields only
      that process's part of dim 0; dim 0 must be sharded and every tensor
      needs such a spec (a tensor that differs between processes cannot be
      replicated).

    Args:
        loader: An iterable of batches, e.g. a ``torch.utils.data.DataLoader``.
        device: The xla device (``spmdtorch.device()`` or ``"xla"``).
        **kwargs: :class:`ParallelLoader` options.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.data import MpDeviceLoader
        >>> loader = MpDeviceLoader([{"x": torch.ones(2, 3)}], "xla")
        >>> len(loader), [b["x"].shape for b in loader]
        (1, [torch.Size([2, 3])])
    """

    def __init__(self, loader: Iterable[Any], device: torch.device | str, **kwargs: Any) -> None:
        _check_loader(loader, "MpDeviceLoader")
        if device is None:
            raise InputShardingError(
                "MpDeviceLoader: device must be an xla device such as spmdtorch.device(), got None"
            )
        transfer._check_device(device)
        unknown = sorted(set(kwargs) - set(_OPTIONS))
        if unknown:
            raise LoaderArgumentTypeError(
                f"MpDeviceLoader got unexpected keyword arguments {unknown}; ParallelLoader's options are {_OPTIONS}"
            )
        for name in _OPTIONS[1:-1]:
            if name in kwargs:
                _positive_int(name, kwargs[name])
        transfer.InputShardings(kwargs.get("input_sharding"))  # fail at construction, not at iter()
        self._loader = loader
        self._device = device
        self._parallel_loader_kwargs = kwargs
        self._generators = _resume.order_generators(loader)
        self._epochs = 0
        self._start: _resume.EpochStart | None = None
        self._skipped = 0  # batches of this epoch skipped when it resumed
        self._current: ParallelLoader | None = None
        self._resume: _resume.LoaderState | None = None

    def __iter__(self) -> PerDeviceLoader:
        resume, self._resume = self._resume, None
        if resume is not None:
            self._epochs = resume.epochs - (0 if resume.finished else 1)
        batches, self._start, self._skipped = _resume.start_epoch(self._loader, self._generators, resume)
        self._epochs += 1
        self._current = ParallelLoader(self._loader, [self._device], **self._parallel_loader_kwargs, _batches=batches)
        return self._current.per_device_loader(self._device)

    def __len__(self) -> int:
        return _loader_len(self._loader)

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands in the input: save it with the model, restore with ``load_state_dict``.

        The state is the random generators' states at the start of the current
        epoch and the number of batches the loop has taken from it (batches
        prefetched but not taken do not count); ints and CPU tensors, so any
        checkpoint holds it. A job restarted from it yields the same batches
        in the same order as one that never stopped, for a deterministic
        dataset (see ``spmdtorch/data/_resume.py``).

        Example:
            >>> import torch
            >>> from spmdtorch.data import MpDeviceLoader
            >>> data = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=2, shuffle=True)
            >>> loader = MpDeviceLoader(data, "xla")
            >>> it = iter(loader)
            >>> first = [next(it).tolist() for _ in range(2)]
            >>> state = loader.state_dict()
            >>> rest = [b.tolist() for b in it]
            >>> again = MpDeviceLoader(data, "xla")
            >>> again.load_state_dict(state)
            >>> [b.tolist() for b in again] == rest
            True
        """
        sizes = _resume.InputSizes.of(self._loader)
        if self._current is None:
            return _resume.LoaderState(self._epochs, 0, True, None, sizes).to_dict()
        # "finished" only once the loop saw the end: a state saved after the
        # last batch but inside the loop resumes into the same (ended) epoch.
        current = self._current
        taken = current._next + self._skipped
        return _resume.LoaderState(self._epochs, taken, current._ended, self._start, sizes).to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s result: the next ``iter()`` continues that epoch.

        Raises:
            LoaderStateError: ``state`` is not such a dict, or was saved from a
                loader whose order depends on a different number of generators,
                or whose dataset or batches per epoch had another size (resuming
                would repeat some samples and skip others).
        """
        resume = _resume.LoaderState.from_dict(state, len(self._generators))
        resume.sizes.check_same(_resume.InputSizes.of(self._loader))
        self._resume = resume
