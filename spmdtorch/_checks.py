"""Argument checks for public entry points: one call per parameter, named errors.

Each public function checks its arguments on entry and raises its package's
named error (``MeshError``, ``ShardingError``, ``CheckpointArgumentError``...)
with a message that names the function, the parameter, what was expected,
what was given and, where there is one, the fix. The checks are plain
``isinstance`` tests: cheap, and never on the per-op recording path.

Every ``check_*`` takes ``error``: the exception class to raise. Packages whose
functions raised a builtin ``TypeError`` for a wrong type before pass a class
that also subclasses ``TypeError`` (e.g. ``MeshTypeError``), so existing
``except TypeError`` clauses keep working.

Example:
    >>> check_int(3, "f", "n", ValueError, minimum=1)
    3
    >>> check_int(0, "f", "n", ValueError, minimum=1)
    Traceback (most recent call last):
    ...
    ValueError: f: n must be an int >= 1, got int 0
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any, NoReturn

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_float",
    "check_instance",
    "check_int",
    "check_int_sequence",
    "check_path",
    "check_str",
    "fail",
    "is_int",
]


class ArgumentError(ValueError):
    """A public function was given a bad argument; the message names the parameter and the fix.

    Each package's argument errors (``CheckpointArgumentError``,
    ``LoaderArgumentError``, ``MeshTypeError``...) subclass it, so
    ``except spmdtorch.ArgumentError`` catches a bad argument anywhere.
    """


class ArgumentTypeError(ArgumentError, TypeError):
    """A bad argument of the wrong type (a ``TypeError`` too)."""


#: An exception class taking one message argument.
ErrorClass = Callable[[str], BaseException]


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def fail(error: ErrorClass, func: str, param: str, expected: str, value: Any, fix: str = "") -> NoReturn:
    """Raises ``error("<func>: <param> must be <expected>, got <type> <value>[; <fix>]")``."""
    message = f"{func}: {param} must be {expected}, got {_shown(value)}"
    raise error(f"{message}; {fix}" if fix else message)


def is_int(value: Any) -> bool:
    """An integer that is not a bool (``True`` as a size or an index is always a bug)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_bool(value: Any, func: str, param: str, error: ErrorClass) -> bool:
    """``value`` if it is a bool (numpy's included), else raises ``error``."""
    if isinstance(value, bool) or type(value).__name__ == "bool_":
        return bool(value)
    fail(error, func, param, "True or False", value)


def check_int(
    value: Any,
    func: str,
    param: str,
    error: ErrorClass,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int:
    """``int(value)`` if it is an int within ``[minimum, maximum]``, else raises ``error``."""
    if minimum is not None and maximum is not None:
        bounds = f" in {minimum}..{maximum}"
    elif minimum is not None:
        bounds = f" >= {minimum}"
    else:
        bounds = "" if maximum is None else f" <= {maximum}"
    if not is_int(value):
        fail(error, func, param, f"an int{bounds}", value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        fail(error, func, param, f"an int{bounds}", value)
    return int(value)


def check_float(value: Any, func: str, param: str, error: ErrorClass, *, minimum: float | None = None) -> float:
    """``float(value)`` if it is a real number (not a bool) ``>= minimum``, else raises ``error``."""
    expected = "a number" + (f" >= {minimum}" if minimum is not None else "")
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or value != value:  # NaN
        fail(error, func, param, expected, value)
    if minimum is not None and value < minimum:
        fail(error, func, param, expected, value)
    return float(value)


def check_str(value: Any, func: str, param: str, error: ErrorClass, *, nonempty: bool = False) -> str:
    """``value`` if it is a str (non-empty when asked), else raises ``error``."""
    if not isinstance(value, str) or (nonempty and not value):
        fail(error, func, param, "a non-empty str" if nonempty else "a str", value)
    return value


def check_choice(value: Any, choices: Collection[str], func: str, param: str, error: ErrorClass) -> str:
    """``value`` if it is one of the str ``choices``, else raises ``error`` listing them."""
    if not isinstance(value, str) or value not in choices:
        fail(error, func, param, "one of " + ", ".join(map(repr, choices)), value)
    return value


def check_instance(
    value: Any, types: type | tuple[type, ...], func: str, param: str, error: ErrorClass, expected: str, fix: str = ""
) -> Any:
    """``value`` if it is an instance of ``types``, else raises ``error`` (``expected`` describes them)."""
    if not isinstance(value, types):
        fail(error, func, param, expected, value, fix)
    return value


def check_callable(value: Any, func: str, param: str, error: ErrorClass) -> Any:
    """``value`` if it is callable, else raises ``error``."""
    if not callable(value):
        fail(error, func, param, "callable", value)
    return value


def check_path(value: Any, func: str, param: str, error: ErrorClass) -> str | os.PathLike[str]:
    """``value`` if it is a str or ``os.PathLike`` (not bytes), else raises ``error``."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        if isinstance(value, str) and not value:
            fail(error, func, param, "a non-empty path", value)
        return value
    fail(error, func, param, "a str or os.PathLike path", value)


def check_int_sequence(
    value: Any, func: str, param: str, error: ErrorClass, *, minimum: int | None = None
) -> tuple[int, ...]:
    """``tuple(value)`` if it is a sequence of ints ``>= minimum`` (not a str), else raises ``error``."""
    bound = f" >= {minimum}" if minimum is not None else ""
    expected = f"a sequence of ints{bound}"
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) and type(value).__name__ != "ndarray":
        fail(error, func, param, expected, value)
    items = tuple(value)
    for i, item in enumerate(items):
        if not is_int(item) or (minimum is not None and item < minimum):
            fail(error, func, f"{param}[{i}]", f"an int{bound}", item)
    return tuple(int(i) for i in items)
