"""The xla device's RNG state, as torch's device-module protocol expects it.

By default an xla random op is keyed from the key of the program it runs in
(``spmdtorch.lazy.rng``): each execution draws fresh numbers. That leaves no
state to save and restore, which ``torch.utils.checkpoint`` (its
``preserve_rng_state``), ``torch.random.fork_rng(device_type="xla")`` and
``checkpoint_module`` need: the recomputation of a checkpointed block must
draw the same dropout mask as its forward.

So :func:`get_rng_state` switches the device to an explicit stream: its first
random op draws one key into a small int32 xla tensor (an ordinary random op,
so fresh each step), and every random op of the stream is keyed by that
tensor and a counter. The state is the pair ``(key, counter)``; :func:`set_rng_state` restores it, and
the ops recorded next replay the same numbers, in the same program or in a
later one (the key tensor is then a concrete input). Each program boundary
(``sync()``, the end of a step, a ``.cpu()``) returns the device to program
keys, so the next step's graph is the same as this one's and compiles once:
a restored state replays the ops recorded until the next boundary; call
``set_rng_state`` again after one to go on replaying (``torch.manual_seed``
replays whole runs).

This module also registers itself as ``torch.xla`` (``torch.get_device_module
("xla")``), unless PyTorch/XLA already did.

Example:
    >>> import torch, spmdtorch
    >>> from spmdtorch.tensor import random_state
    >>> state = random_state.get_rng_state()
    >>> a = torch.rand(3, device="xla")
    >>> random_state.set_rng_state(state)
    >>> b = torch.rand(3, device="xla")  # recorded before a.cpu() ends the program
    >>> torch.equal(a.cpu(), b.cpu())
    True
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import torch

from spmdtorch.lazy import record, rng
from spmdtorch.lazy.graph import Slot
from spmdtorch.tensor.dispatch import read_value
from spmdtorch.tensor.xla_tensor import new_base

__all__ = ["XlaRngState", "XlaRngStateError", "device_module", "get_rng_state", "set_rng_state"]


class XlaRngStateError(TypeError):
    """``set_rng_state`` was given something that is not an :class:`XlaRngState`."""


class _KeyCell:
    """A stream's key tensor, drawn by its first random op (None until then).

    Saving a state draws nothing: a checkpointed block without random ops
    adds no random node (and no draw from torch's generator) to the step.
    """

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None

    def get(self) -> torch.Tensor:
        if self.key is None:
            self.key = _new_key()
        return self.key


@dataclasses.dataclass(frozen=True)
class XlaRngState:
    """A saved xla RNG state: the stream's key (drawn when first needed) and how many ops it keyed.

    Attributes:
        cell: holds the int32 xla tensor of the key's words, once drawn.
        offset: number of random ops keyed from the key before this state.
    """

    cell: _KeyCell
    offset: int

    @property
    def key(self) -> torch.Tensor | None:
        """The key tensor, or None while no random op of the stream has run."""
        return self.cell.key


def _key_words(*, key: jax.Array) -> jax.Array:
    # A key's raw words, as int32 so that they live in an ordinary tensor.
    return jax.lax.bitcast_convert_type(jax.random.key_data(key), jnp.int32)


class _Keyed:
    """A random lowering fed from a stream's key tensor: ``fold_in(key, index)``."""

    __slots__ = ("fn", "index")

    def __init__(self, fn: Callable[..., Any], index: int) -> None:
        self.fn = fn
        self.index = index

    def __call__(self, *args: Any, _stream_key: jax.Array, **kwargs: Any) -> Any:
        words = jax.lax.bitcast_convert_type(_stream_key, jnp.uint32)
        key = jax.random.fold_in(jax.random.wrap_key_data(words), self.index)
        return self.fn(*args, key=key, **kwargs)


class _Stream:
    """The active explicit stream (installed as ``spmdtorch.lazy.rng``'s region)."""

    __slots__ = ("cell", "count")

    def __init__(self, cell: _KeyCell, count: int) -> None:
        self.cell = cell
        self.count = count

    def keyed(
        self, fn: Callable[..., Any], name: Any, template: Any, inputs: Sequence[Any]
    ) -> tuple[Callable[..., Any], Any, Any, Sequence[Any]]:
        key = self.cell.get()
        index = self.count
        self.count += 1
        args_t, kw_t = template
        inputs = [*inputs, read_value(key)]
        template = (args_t, (*kw_t, ("_stream_key", Slot(len(inputs) - 1))))
        return _Keyed(fn, index), (name, "keyed", index), template, inputs


def _new_key() -> torch.Tensor:
    shape = jax.eval_shape(_key_words, key=jax.random.key(0)).shape
    with rng.keyed_region(None):  # the key itself comes from the program's key
        ref = record(_key_words, "spmdtorch.rng_stream_key", ((), ()), [], ((shape, jnp.int32),), random=True)
    return new_base(ref, torch.int32)


def get_rng_state(device: torch.device | str | int | None = None) -> XlaRngState:
    """The xla RNG state; the ops recorded after a restore of it draw the same numbers.

    Args:
        device: ignored (one stream serves every xla device, as the mesh does).

    Returns:
        An :class:`XlaRngState` for :func:`set_rng_state`.
    """
    stream = rng.active_region()
    if not isinstance(stream, _Stream):
        stream = _Stream(_KeyCell(), 0)
        rng.set_region(stream)
    return XlaRngState(stream.cell, stream.count)


def set_rng_state(state: XlaRngState, device: torch.device | str | int | None = None) -> None:
    """Restore a state from :func:`get_rng_state`.

    Args:
        state: the saved state.
        device: ignored.

    Raises:
        XlaRngStateError: ``state`` is not an :class:`XlaRngState`.
    """
    if not isinstance(state, XlaRngState):
        raise XlaRngStateError(
            f"set_rng_state for the xla device expects an XlaRngState from get_rng_state(), got "
            f"{type(state).__name__}; reseed with torch.manual_seed(...) instead"
        )
    rng.set_region(_Stream(state.cell, state.offset))


def _device_module() -> types.ModuleType:
    mod = types.ModuleType("torch.xla", "spmdtorch's xla device module (torch.get_device_module('xla')).")
    # Through __dict__: a fresh ModuleType has no declared attributes to assign.
    vars(mod).update(
        _initialized=True,
        is_available=lambda: True,
        is_initialized=lambda: True,
        device_count=lambda: 1,  # torch sees one logical device, xla:0
        current_device=lambda: 0,
        device=lambda device=None: contextlib.nullcontext(),
        get_rng_state=get_rng_state,
        set_rng_state=set_rng_state,
        manual_seed=rng.manual_seed,
        manual_seed_all=rng.manual_seed,
        synchronize=lambda device=None: None,
    )
    return mod


device_module = _device_module()


def register() -> None:
    """Make this module ``torch.xla`` unless PyTorch/XLA is loaded."""
    if "torch_xla" in sys.modules or getattr(torch, "xla", None) is not None:
        return
    torch._register_device_module("xla", device_module)
