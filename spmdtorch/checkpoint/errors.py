"""Exceptions raised by :mod:`spmdtorch.checkpoint`.

Every error is a :class:`CheckpointError`. Input errors are also
``ValueError`` (or ``KeyError``/``TypeError``/``FileNotFoundError`` where
that is what callers already catch). Messages name the key path in the state
(``['optimizer']['state'][0]['exp_avg']``), say what was expected and what was
found, and suggest a fix.
"""

from __future__ import annotations

from collections.abc import Iterable

from spmdtorch._checks import ArgumentError, ArgumentTypeError

__all__ = [
    "CheckpointArgumentError",
    "CheckpointArgumentTypeError",
    "CheckpointCorruptionError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointSaveError",
    "CheckpointWriterError",
    "DtypeMismatchError",
    "KeyMismatchError",
    "MissingKeysError",
    "NotACheckpointError",
    "OverwriteRefusedError",
    "ShapeMismatchError",
    "StepNotFoundError",
    "UnexpectedKeysError",
    "UnsafeEntryError",
    "UnsupportedValueError",
    "ValueKindMismatchError",
]


class CheckpointError(Exception):
    """Base class of every error raised by :mod:`spmdtorch.checkpoint`."""


class CheckpointArgumentError(CheckpointError, ArgumentError):
    """An argument with a wrong value (a format name, a size < 1...); the message names it."""


class CheckpointArgumentTypeError(CheckpointArgumentError, ArgumentTypeError):
    """An argument of the wrong type (a ``TypeError`` too)."""


class NotACheckpointError(CheckpointError, FileNotFoundError):
    """A path that does not hold a complete spmdtorch checkpoint."""


class StepNotFoundError(CheckpointError, KeyError):
    """A step that the checkpoint directory does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CheckpointExistsError(CheckpointError, FileExistsError):
    """Saving to a path or step that already holds a checkpoint."""


class OverwriteRefusedError(CheckpointExistsError):
    """``save(path, overwrite=True)`` where ``path`` holds something other than one checkpoint.

    ``overwrite`` replaces a checkpoint; it never deletes a directory of other
    files (a home directory, a dataset, a ``CheckpointManager``'s steps) that a
    mistyped path would point at.
    """


class KeyMismatchError(CheckpointError, KeyError):
    """The state's key paths differ from the checkpoint's.

    Attributes:
        keys: the offending key paths, as strings.
    """

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys = tuple(keys)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class MissingKeysError(KeyMismatchError):
    """The state has entries that the checkpoint does not hold."""


class UnexpectedKeysError(KeyMismatchError):
    """The checkpoint holds entries that the state has no place for."""


class ShapeMismatchError(CheckpointError, ValueError):
    """A saved array's shape differs from the target tensor's."""


class DtypeMismatchError(CheckpointError, TypeError):
    """A saved array's dtype differs from the target's (pass ``cast=True`` to convert)."""


class ValueKindMismatchError(CheckpointError, TypeError):
    """A saved tensor where the state holds a plain value, or the other way round."""


class UnsupportedValueError(CheckpointError, TypeError):
    """A state entry that cannot be checkpointed (an object, a tensor on an unknown device...)."""


class CheckpointCorruptionError(CheckpointError, RuntimeError):
    """Data on disk is damaged: a fingerprint mismatch, a truncated or unreadable file.

    Attributes:
        keys: the key paths of the arrays found damaged (empty when the
            damage could not be attributed to one array).
    """

    def __init__(self, message: str, keys: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.keys = tuple(keys)


class UnsafeEntryError(CheckpointCorruptionError):
    """A pickled checkpoint entry that needs more than ``torch.load(weights_only=True)`` allows.

    ``SPMDLoadPlanner`` unpickles DCP's non-tensor entries with
    ``weights_only=True`` (tensors, containers and plain values only):
    unpickling anything else can run code chosen by whoever wrote the file.
    """


class CheckpointSaveError(CheckpointError, RuntimeError):
    """A save that could not complete; nothing of it was finalised (the previous checkpoints stand)."""


class CheckpointWriterError(CheckpointError, RuntimeError):
    """A second process tried to write checkpoints to a directory another process is writing to.

    One writer per checkpoint directory: the writer removes unfinished saves
    it finds (leftovers of killed writers) and retires old steps, which would
    destroy another writer's saves. Readers never delete and need no lock.
    """
