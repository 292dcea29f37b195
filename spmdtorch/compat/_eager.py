"""``torch_xla.experimental``'s own names: ``eager_mode``, ``is_eager_mode``, ``eager_mode_context``.

PyTorch/XLA's eager mode runs each op as it is called instead of tracing
until the next ``mark_step``; functions wrapped in ``torch_xla.compile`` are
traced and compiled either way. spmdtorch has one execution model, lazy: an
op's value is computed when it is read (``.cpu()``, ``.item()``, printing) or
at the next step boundary, in one program with the ops pending before it.
The values are the same as eager execution's, so ``eager_mode(True)`` is
accepted and remembered (``is_eager_mode()`` answers it) and programs written
for eager mode (PyTorch/XLA's examples/eager) run and give the same numbers;
what differs is only when the device work happens. To see an op's cost on its
own, read its result or call ``torch_xla.sync()`` after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from spmdtorch.compat.errors import CompatError

__all__ = ["eager_mode", "eager_mode_context", "is_eager_mode"]

_EAGER = [False]


class EagerModeTypeError(CompatError, TypeError):
    """``eager_mode`` was given something other than a bool."""


def eager_mode(enable: bool) -> None:
    """Remember whether the program asked for eager mode (execution stays lazy; values are the same).

    Args:
        enable: PyTorch/XLA's switch.

    Raises:
        EagerModeTypeError: ``enable`` is not a bool.
    """
    if not isinstance(enable, bool):
        raise EagerModeTypeError(f"eager_mode(enable): enable must be a bool, got {type(enable).__name__}")
    _EAGER[0] = enable


def is_eager_mode() -> bool:
    """What the last :func:`eager_mode` call asked for (False at start)."""
    return _EAGER[0]


@contextlib.contextmanager
def eager_mode_context(enable: bool) -> Iterator[bool]:
    """``eager_mode(enable)`` for the block, restored after; yields the previous setting."""
    saved = is_eager_mode()
    eager_mode(enable)
    try:
        yield saved
    finally:
        _EAGER[0] = saved
