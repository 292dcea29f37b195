"""Random-number state for lazy graphs.

Each program that draws random numbers takes ``(seed, counter)`` as runtime
inputs and derives one key per random op inside the graph, so the graph key
does not change from step to step while every step draws fresh numbers.
``torch.manual_seed`` (or ``spmdtorch.manual_seed``) restarts the sequence.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["manual_seed", "next_key_data"]

_state = {"seed": None, "counter": 0}


def manual_seed(seed: int) -> None:
    """Seed torch and spmdtorch's device random streams.

    Example:
        >>> import spmdtorch
        >>> spmdtorch.manual_seed(0)
    """
    torch.manual_seed(seed)
    _state["seed"] = torch.initial_seed()
    _state["counter"] = 0


def next_key_data() -> np.ndarray:
    """``[seed, counter]`` for the next random program, as uint32 words."""
    seed = torch.initial_seed()
    if seed != _state["seed"]:
        _state["seed"] = seed
        _state["counter"] = 0
    counter = _state["counter"]
    _state["counter"] = counter + 1
    return np.array([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, counter & 0xFFFFFFFF], dtype=np.uint32)
