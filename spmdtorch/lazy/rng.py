"""Random-number state of the xla device: torch's default CPU generator.

A program that draws random numbers takes its key as a runtime input (so the
graph key, and the compiled executable, stay the same from step to step) and
derives one key per random op inside the graph. The program's key is drawn
from torch's default CPU generator, one draw per execution, when the program
runs. So, as on CPU and CUDA:

* ``torch.manual_seed(s)`` (or ``spmdtorch.manual_seed(s)``) makes every
  later xla draw reproducible, reseeding with the same seed replays them;
* ``torch.get_rng_state()`` / ``torch.set_rng_state()`` and
  ``torch.random.fork_rng()`` save, restore and fork the xla stream too;
* every execution (each lazy step, each replay of an ``spmdtorch.compile``
  step) draws fresh numbers.

PyTorch/XLA keeps a separate device seed (``xm.set_rng_state``) that
``torch.manual_seed`` does not touch; spmdtorch follows torch's convention
instead, so code that seeds with ``torch.manual_seed`` is reproducible on xla
without changes. The price: an xla random program consumes one 64-bit draw of
the CPU generator, so CPU random numbers drawn after it differ from a run
without it (as they do on CPU when a dropout layer runs there).

The values are JAX's threefry draws (``jax_threefry_partitionable``, on by
default since JAX 0.5), which do not depend on how the output is sharded: the
same seed gives the same tensor on 1, 4 or 8 devices. They follow torch's
distributions, not its CPU generator's bit stream.

Explicit ``generator=`` arguments on xla ops are rejected (``RandomGeneratorError``):
a per-op generator would have to be an input of every replayed program.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch

__all__ = [
    "RandomGeneratorError",
    "KeyedRegion",
    "active_region",
    "check_generator",
    "keyed_region",
    "manual_seed",
    "next_key_data",
    "placeholder_key_data",
    "program_boundary",
    "set_region",
]

# The region that keys random ops as they are recorded (see keyed_region):
# None uses the program's key. One per process, like torch's generators.
_REGION: list[KeyedRegion | None] = [None]


class KeyedRegion(Protocol):
    """What ``set_region`` takes: hands out a random node's keys (``spmdtorch.tensor.random_state``'s stream)."""

    def keyed(
        self, fn: Callable[..., Any], name: Any, template: Any, inputs: Sequence[Any]
    ) -> tuple[Callable[..., Any], Any, Any, Sequence[Any]]:
        """The node's new ``(fn, name, template, inputs)``, drawing from this region's key."""
        ...


class RandomGeneratorError(ValueError):
    """An xla random op was given an explicit ``torch.Generator``."""


def manual_seed(seed: int) -> torch.Generator:
    """Seed torch's generators, the xla device's draws included.

    Equivalent to ``torch.manual_seed(seed)``; kept so code ported from
    PyTorch/XLA (``torch_xla.manual_seed`` / ``xm.set_rng_state``) has a
    one-line replacement.

    Args:
        seed: an int (as for ``torch.manual_seed``; negative seeds wrap).

    Raises:
        RandomGeneratorError: ``seed`` is not an int (a str, a float or a bool
            would silently become a different seed).

    Returns:
        torch's default CPU generator, like ``torch.manual_seed``.

    Example:
        >>> import torch, spmdtorch
        >>> _ = spmdtorch.manual_seed(0)
        >>> a = torch.rand(3, device="xla").cpu()
        >>> _ = torch.manual_seed(0)
        >>> torch.equal(a, torch.rand(3, device="xla").cpu())
        True
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise RandomGeneratorError(f"manual_seed: seed must be an int, got {type(seed).__name__} {seed!r}")
    return torch.manual_seed(int(seed))


def next_key_data() -> np.ndarray:
    """The key data of the next random program: three uint32 words.

    The first two are 64 fresh bits of torch's default CPU generator (this
    advances it); the third is 0 (kept so that the program signature, a
    ``uint32[3]`` input, does not depend on where the bits come from).
    """
    # An explicit CPU device: torch.set_default_device("xla") must not send
    # the draw to the device it is seeding.
    words = torch.randint(0, 2**32, (2,), dtype=torch.int64, device="cpu", generator=torch.default_generator)
    return np.array([int(words[0]), int(words[1]), 0], dtype=np.uint32)


def placeholder_key_data() -> np.ndarray:
    """Key data of the right type for lowering a program; draws nothing."""
    return np.zeros(3, dtype=np.uint32)


def check_generator(op: object, generator: object) -> None:
    """Raise ``RandomGeneratorError`` if ``generator`` is an explicit generator.

    Args:
        op: the op being recorded (for the message).
        generator: the op's ``generator`` argument.

    Raises:
        RandomGeneratorError: ``generator`` is not None.
    """
    if generator is None:
        return
    raise RandomGeneratorError(
        f"{op}: got generator={generator!r} for an xla tensor; spmdtorch draws xla random numbers from "
        "torch's default generator only. Seed it with torch.manual_seed(...) (or fork it with "
        "torch.random.fork_rng()) and drop generator=, or draw on CPU with the generator and move the "
        "result with .to('xla')."
    )


def active_region() -> KeyedRegion | None:
    """The region that keys the random ops recorded now (None: the program key)."""
    return _REGION[0]


def set_region(region: KeyedRegion | None) -> None:
    """Key the random ops recorded from now on with ``region`` (None: the program key).

    ``region`` must have ``keyed(fn, name, template, inputs)`` returning the
    node's new ``(fn, name, template, inputs)``. By default a random node's key
    is folded from the key of the program it runs in, so the same recorded op
    draws anew in each program; a region (``spmdtorch.tensor.random_state``'s
    explicit stream) hands out keys of its own, so that recording the same
    ops again under a restored region replays the same numbers.
    """
    _REGION[0] = region


def program_boundary() -> None:
    """A program was cut (``sync()``): back to program keys, so every step records the same graph."""
    _REGION[0] = None


@contextlib.contextmanager
def keyed_region(region: KeyedRegion | None) -> Iterator[KeyedRegion | None]:
    """``set_region(region)`` for the duration of the block, then the previous region."""
    prev = _REGION[0]
    _REGION[0] = region
    try:
        yield region
    finally:
        _REGION[0] = prev
