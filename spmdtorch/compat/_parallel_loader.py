"""``torch_xla.distributed.parallel_loader`` (``pl``): :mod:`spmdtorch.data`'s loaders, with PyTorch/XLA's contract.

``MpDeviceLoader`` differs from :class:`spmdtorch.data.MpDeviceLoader` where
PyTorch/XLA's SPMD loader behaves otherwise, so programs and tests written
against it see what they expect:

* ``input_sharding=None``: every tensor of the batch arrives *annotated* as
  replicated (``_get_xla_sharding_spec`` reports ``{replicated}``), as
  PyTorch/XLA's transfer to the SPMD virtual device annotates it;
* a dict ``input_sharding`` must name every key of every dict batch: a batch
  key without a spec raises :class:`InputShardingKeyError` (a ``KeyError``,
  PyTorch/XLA's type); spmdtorch alone replicates such keys;
* a batch that does not fit ``input_sharding`` raises the ``ValueError``
  (:class:`spmdtorch.data.InputShardingError`) from ``next()`` itself, as
  PyTorch/XLA does, instead of the ``LoaderWorkerError`` that wraps it; a
  ``minibatch=True`` part that does not split over this process's devices
  raises :class:`MinibatchBatchSizeError`, a ``RuntimeError`` with
  PyTorch/XLA's message too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from spmdtorch import data, mesh, runtime, sharding
from spmdtorch.compat.errors import CompatError
from spmdtorch.data import ParallelLoader, PerDeviceLoader
from spmdtorch.data.errors import InputShardingError, LoaderWorkerError

__all__ = ["InputShardingKeyError", "MinibatchBatchSizeError", "MpDeviceLoader", "ParallelLoader", "PerDeviceLoader"]


class InputShardingKeyError(KeyError):
    """A dict batch has a key that the dict ``input_sharding`` gives no spec (PyTorch/XLA raises ``KeyError``)."""


class MinibatchBatchSizeError(InputShardingError, CompatError):
    """A process's part of a ``minibatch=True`` batch does not split over its devices.

    A ``RuntimeError`` with PyTorch/XLA's message (``When minibatch is
    configured, the per-host batch size must be divisible by local runtime
    device count...``) and spmdtorch's ``InputShardingError`` (a ``ValueError``).
    """


def _has_minibatch(spec: Any) -> bool:
    specs = spec.values() if isinstance(spec, dict) else [spec]
    return any(getattr(s, "minibatch", False) is True for s in specs)


class _Batches:
    """The batches of one epoch, checked and annotated as PyTorch/XLA's loader gives them."""

    def __init__(self, inner: PerDeviceLoader, input_sharding: Any) -> None:
        self._inner = inner
        self._input_sharding = input_sharding
        self._replicated: mesh.Mesh | None = None

    def __iter__(self) -> _Batches:
        return self

    def __len__(self) -> int:
        return len(self._inner)

    def __getattr__(self, name: str) -> Any:  # the rest of PerDeviceLoader's interface
        return getattr(self._inner, name)

    def __next__(self) -> Any:
        try:
            batch = next(self._inner)
        except LoaderWorkerError as e:
            # PyTorch/XLA raises a batch's sharding error from next() as it is.
            cause = e.__cause__
            if isinstance(cause, InputShardingError):
                if _has_minibatch(self._input_sharding) and isinstance(cause.__cause__, ValueError):
                    # A process's part of a minibatch that does not split over its devices:
                    # PyTorch/XLA's RuntimeError and wording, then what spmdtorch found.
                    raise MinibatchBatchSizeError(
                        "When minibatch is configured, the per-host batch size must be divisible by local "
                        "runtime device count. Per host input data shape (and its sharding): "
                        f"{cause}; local_runtime_device_count = {runtime.addressable_runtime_device_count()}"
                    ) from cause
                raise cause from e
            raise
        spec = self._input_sharding
        if isinstance(spec, dict) and isinstance(batch, dict):
            unnamed = sorted(str(k) for k in batch if k not in spec)
            if unnamed:
                raise InputShardingKeyError(
                    f"MpDeviceLoader: batch keys {unnamed} have no entry in input_sharding (keys "
                    f"{sorted(str(k) for k in spec)}); PyTorch/XLA requires one ShardingSpec per batch key: add "
                    "them (a spec with all-None partition_spec replicates)"
                )
        if spec is None:
            for leaf in pytree.tree_leaves(batch):
                if isinstance(leaf, torch.Tensor) and leaf.device.type == "xla":
                    if self._replicated is None:
                        self._replicated = mesh.get_1d_mesh("data")
                    sharding.mark_sharding(leaf, self._replicated, (None,) * leaf.dim())
        return batch

    def next(self) -> Any:
        """PyTorch/XLA's name for ``__next__``."""
        return self.__next__()


class MpDeviceLoader(data.MpDeviceLoader):
    """:class:`spmdtorch.data.MpDeviceLoader` with PyTorch/XLA's ``input_sharding`` contract (module docstring)."""

    @property
    def dataset(self) -> Any:
        """The wrapped loader's dataset.

        PyTorch/XLA's loader has none, and accelerate's ``save_state`` reads
        ``dataloader.dataset`` of its XLA loader (``MpDeviceLoaderWrapper``,
        a subclass of this one): with PyTorch/XLA it raises AttributeError there.
        """
        loader: Any = self._loader  # any iterable; an AttributeError when it has no dataset, as for PyTorch/XLA's
        return loader.dataset

    def __iter__(self) -> _Batches:  # type: ignore[override]  # the same iterator interface, wrapped
        # Read at each epoch, not kept from __init__: transformers' Trainer sets
        # `_parallel_loader_kwargs["input_sharding"]` on a built loader (FSDPv2).
        return _Batches(super().__iter__(), self._parallel_loader_kwargs.get("input_sharding"))
