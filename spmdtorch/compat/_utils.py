"""``torch_xla.utils.utils`` (``xu``): ``SampleGenerator`` and the small helpers PyTorch/XLA scripts import.

None of these touch a device: synthetic-data iterators (``SampleGenerator``,
``FnDataGenerator``), environment readers (``getenv_as``, ``check_env_flag``),
``get_free_tcp_ports`` and the nested-structure walkers
(``for_each_instance``, ``for_each_instance_rewrite``) PyTorch/XLA's own
helpers use, with PyTorch/XLA 2.9's signatures and results.
"""

from __future__ import annotations

import copy
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, Generic, TypeVar

from spmdtorch.launch import free_port

__all__ = [
    "Cleaner",
    "DataWrapper",
    "FnDataGenerator",
    "LazyProperty",
    "SampleGenerator",
    "TimedScope",
    "TmpFolder",
    "as_list",
    "check_env_flag",
    "eprint",
    "flatten_nested_tuple",
    "for_each_instance",
    "for_each_instance_rewrite",
    "get_free_tcp_ports",
    "get_print_fn",
    "getenv_as",
    "list_copy_append",
    "null_print",
    "parallel_work",
    "shape",
    "timed",
]

T = TypeVar("T")


class SampleGenerator(Generic[T]):
    """An iterable yielding the same ``data`` ``sample_count`` times: synthetic input in place of a DataLoader.

    Each ``iter()`` starts a fresh pass, so it can be iterated once per epoch;
    ``len()`` is ``sample_count``.

    Args:
        data: what every step yields (typically a ``(inputs, labels)`` tuple).
        sample_count: how many steps one pass yields.
    """

    def __init__(self, data: T, sample_count: int) -> None:
        self._data = data
        self._sample_count = sample_count
        self._count = 0

    def __iter__(self) -> SampleGenerator[T]:
        return SampleGenerator(self._data, self._sample_count)

    def __len__(self) -> int:
        return self._sample_count

    def __next__(self) -> T:
        return self.next()

    def next(self) -> T:
        """The next sample; ``StopIteration`` after ``sample_count``."""
        if self._count >= self._sample_count:
            raise StopIteration
        self._count += 1
        return self._data


class FnDataGenerator:
    """An iterable of ``(data, func(data))`` pairs, ``data = gen_tensor(batch_size, *dims)``, ``count`` per pass."""

    def __init__(
        self,
        func: Callable[[Any], Any],
        batch_size: int,
        gen_tensor: Callable[..., Any],
        dims: tuple[int, ...] | list[int] | None = None,
        count: int = 1,
    ) -> None:
        self._func = func
        self._batch_size = batch_size
        self._gen_tensor = gen_tensor
        self._dims = list(dims) if dims else [1]
        self._count = count
        self._emitted = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> FnDataGenerator:
        return FnDataGenerator(self._func, self._batch_size, self._gen_tensor, self._dims, self._count)

    def __next__(self) -> tuple[Any, Any]:
        return self.next()

    def next(self) -> tuple[Any, Any]:
        """A fresh ``(data, target)`` pair; ``StopIteration`` after ``count``."""
        if self._emitted >= self._count:
            raise StopIteration
        self._emitted += 1
        data = self._gen_tensor(self._batch_size, *self._dims)
        return data, self._func(data)


class DataWrapper:
    """Base of user structures whose tensors the walkers below reach through ``get_tensors``/``from_tensors``."""

    def get_tensors(self) -> list[Any]:
        """The tensors this object holds (subclasses implement it)."""
        raise NotImplementedError(f"{type(self).__name__}.get_tensors() is not implemented: override it")

    def from_tensors(self, tensors: list[Any]) -> Any:
        """A copy of this object holding ``tensors`` (same order as :meth:`get_tensors`)."""
        raise NotImplementedError(f"{type(self).__name__}.from_tensors() is not implemented: override it")


class Cleaner:
    """Calls ``func`` when collected."""

    def __init__(self, func: Callable[[], Any]) -> None:
        self.func = func

    def __del__(self) -> None:
        self.func()


class LazyProperty(Generic[T]):
    """``value`` is ``gen_fn()``, computed on first read."""

    def __init__(self, gen_fn: Callable[[], T]) -> None:
        self._gen_fn: Callable[[], T] | None = gen_fn
        self._value: T | None = None

    @property
    def value(self) -> T:
        """``gen_fn()``, computed once."""
        if self._gen_fn is not None:
            self._value, self._gen_fn = self._gen_fn(), None
        return self._value  # type: ignore[return-value]  # set above on first read


class TmpFolder:
    """A temporary directory (``name``) removed when the object is collected."""

    def __init__(self) -> None:
        self.name = tempfile.mkdtemp()
        self.cleaner = Cleaner(lambda: shutil.rmtree(self.name, ignore_errors=True))


def as_list(t: Any) -> Any:
    """``t`` if it is a list or tuple, else ``[t]``."""
    return t if isinstance(t, list | tuple) else [t]


def getenv_as(name: str, type: Callable[[str], T], defval: T | None = None) -> T | None:  # PyTorch/XLA's keyword
    """``os.environ[name]`` converted by ``type``, or ``defval`` when unset (``bool`` reads ``"0"``/``"1"``)."""
    env = os.environ.get(name)
    if env is None:
        return defval
    if type is bool:
        return bool(int(env))  # type: ignore[return-value]  # T is bool here
    return type(env)


def check_env_flag(name: str, default: str = "") -> bool:
    """Whether ``os.environ[name]`` (or ``default``) is ``"true"`` or a positive integer."""
    flag = os.getenv(name, default)
    return flag == "true" or (flag.isdigit() and int(flag) > 0)


def get_free_tcp_ports(n: int = 1) -> list[int]:
    """``n`` TCP ports the OS reports free now on every interface (:func:`spmdtorch.launch.free_port`)."""
    return [free_port("0.0.0.0") for _ in range(n)]


def _children(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield v
    elif isinstance(value, list | tuple | set):
        yield from value
    elif isinstance(value, DataWrapper):
        yield from value.get_tensors()
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        yield from vars(value).values()


def for_each_instance(value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]) -> None:
    """Calls ``fn`` on every object in ``value`` (recursively: dicts, lists, tuples, sets, DataWrappers,
    objects' attributes) for which ``select_fn`` is true, each object once."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if select_fn(v):
            fn(v)
        else:
            stack.extend(reversed(list(_children(v))))


def for_each_instance_rewrite(value: Any, select_fn: Callable[[Any], bool], fn: Callable[[Any], Any]) -> Any:
    """A copy of ``value`` with every object ``select_fn`` picks replaced by ``fn(obj)``.

    Dicts stay dicts and sets sets; lists and tuples come back as lists (as in
    PyTorch/XLA); other objects are shallow-copied with their attributes
    rewritten; an object reached twice is rewritten once (shared stays shared).
    """
    done: dict[int, Any] = {}

    def rewrite(v: Any) -> Any:
        if id(v) in done:
            return done[id(v)]
        if select_fn(v):
            out = fn(v)
        elif isinstance(v, dict):
            out = done[id(v)] = {}
            for k, x in v.items():
                out[rewrite(k)] = rewrite(x)
        elif isinstance(v, set):
            out = done[id(v)] = set()
            out.update(rewrite(x) for x in v)
        elif isinstance(v, list | tuple):
            out = done[id(v)] = []
            out.extend(rewrite(x) for x in v)
        elif isinstance(v, DataWrapper):
            out = v.from_tensors([rewrite(x) for x in v.get_tensors()])
        elif hasattr(v, "__dict__") and not isinstance(v, type):
            out = done[id(v)] = copy.copy(v)
            for k, x in vars(out).items():
                vars(out)[k] = rewrite(x)
        else:
            out = v
        done[id(v)] = out
        return out

    return rewrite(value)


def shape(inputs: Any) -> list[int]:
    """The nesting shape of equal-length nested lists/tuples (``[[1, 2], [3, 4]]`` -> ``[2, 2]``).

    Raises:
        ValueError: the nested sequences are ragged.
    """
    if not isinstance(inputs, list | tuple):
        return []
    inner = [shape(x) for x in inputs]
    if any(s != inner[0] for s in inner):
        raise ValueError(f"shape(inputs): nested sequences of different shapes {inner}; expected equal shapes")
    return [len(inputs)] + (inner[0] if inner else [])


def flatten_nested_tuple(inputs: Any) -> tuple[Any, ...]:
    """The leaves of nested lists/tuples, in order, as one tuple."""
    if not isinstance(inputs, list | tuple):
        return (inputs,)
    return tuple(leaf for x in inputs for leaf in flatten_nested_tuple(x))


def list_copy_append(ilist: list[T] | tuple[T, ...], item: T) -> list[T]:
    """A new list: ``ilist``'s items then ``item``."""
    return [*ilist, item]


def null_print(*args: Any, **kwargs: Any) -> None:
    """Prints nothing."""


def eprint(*args: Any, **kwargs: Any) -> None:
    """``print`` to stderr."""
    print(*args, file=sys.stderr, **kwargs)


def get_print_fn(debug: bool | int | None = None) -> Callable[..., None]:
    """:func:`eprint` when ``debug`` (default: the ``DEBUG`` environment variable) is set, else :func:`null_print`."""
    if debug is None:
        debug = int(os.environ.get("DEBUG", "0"))
    return eprint if debug else null_print


def timed(fn: Callable[[], T], msg: str = "", printfn: Callable[..., None] | None = eprint) -> T:
    """``fn()``, printing ``msg`` and the milliseconds it took."""
    printfn = printfn or get_print_fn()
    start = time.time()
    result = fn()
    printfn(f"{msg}{1000.0 * (time.time() - start):.3f}ms")
    return result


def parallel_work(num_workers: int, fn: Callable[..., T], *args: Any) -> list[T]:
    """``[fn(*a) for a in zip(*args)]`` computed by ``num_workers`` threads (a worker's exception is re-raised)."""
    with futures.ThreadPoolExecutor(max_workers=num_workers) as executor:
        return list(executor.map(fn, *args))


class TimedScope:
    """A ``with`` block that prints ``msg`` and its duration in milliseconds on exit (unless an error was set)."""

    def __init__(self, msg: str = "", printfn: Callable[..., None] | None = eprint) -> None:
        self._msg = msg
        self._printfn = printfn or get_print_fn()
        self._error: Any = None
        self._start = 0.0

    def __enter__(self) -> TimedScope:
        self._start = time.time()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._error is None:
            self._printfn(f"{self._msg}{1000.0 * (time.time() - self._start):.3f}ms")

    def set_error(self, error: Any) -> None:
        """Suppresses the timing line (the block failed)."""
        self._error = error
