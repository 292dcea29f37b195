"""Errors raised by the data loaders."""

from __future__ import annotations

from spmdtorch._checks import ArgumentError, ArgumentTypeError

__all__ = [
    "InputShardingError",
    "LoaderArgumentError",
    "LoaderArgumentTypeError",
    "LoaderStateError",
    "LoaderWorkerError",
]


class InputShardingError(ValueError):
    """``input_sharding`` does not fit the loader or one of its batches."""


class LoaderArgumentError(ArgumentError):
    """A loader option with a wrong value (a size < 1...); the message names it."""


class LoaderArgumentTypeError(LoaderArgumentError, ArgumentTypeError):
    """A loader argument of the wrong type (a ``TypeError`` too, as before it was named)."""


class LoaderStateError(LoaderArgumentError):
    """``MpDeviceLoader.load_state_dict`` got a state that does not fit this loader."""


class LoaderWorkerError(RuntimeError):
    """Loading or transferring a batch failed on a background thread.

    The original exception is chained (``__cause__``); ``batch_index`` is the
    0-based index of the batch that failed.
    """

    def __init__(self, message: str, batch_index: int):
        super().__init__(message)
        self.batch_index = batch_index
