"""Mixed precision for FSDPv2: low-precision compute, float32 master weights.

A :class:`MixedPrecision` policy keeps the parameters (and so the optimizer's
view of them) in their own dtype, normally float32, and runs each forward with
a low-precision copy of them: ``p.to(param_dtype)`` per floating parameter,
recorded by autograd, so gradients arrive in the master dtype and the
optimizer updates float32 weights. Under SPMD each device casts only its own
shard, so the all-gathers XLA inserts for FSDP move ``param_dtype`` bytes.
The policy mirrors ``torch.distributed.fsdp.MixedPrecisionPolicy``
(``param_dtype``, ``output_dtype``, ``cast_forward_inputs``). There is no
``reduce_dtype``: gradient reductions are placed by the GSPMD partitioner
inside the compiled step, so spmdtorch cannot promise their dtype.

Example:
    >>> import torch
    >>> from spmdtorch.fsdp import MixedPrecision
    >>> policy = MixedPrecision(param_dtype=torch.bfloat16, output_dtype=torch.float32)
    >>> layer = torch.nn.Linear(4, 2)
    >>> out = policy.run(layer, (torch.ones(3, 4),), {})
    >>> out.dtype, layer.weight.dtype
    (torch.float32, torch.float32)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

__all__ = ["MixedPrecision", "MixedPrecisionError"]

_LOW_PRECISION = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


class MixedPrecisionError(ValueError):
    """A :class:`MixedPrecision` policy was given an invalid value."""


def _check_dtype(name: str, value: Any, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, torch.dtype) or value not in _LOW_PRECISION:
        raise MixedPrecisionError(
            f"MixedPrecision {name} must be a floating torch.dtype "
            f"({', '.join(str(d) for d in _LOW_PRECISION)}){' or None' if optional else ''}, "
            f"got {value!r}"
        )


def _cast_floating(tree: Any, dtype: torch.dtype) -> Any:
    return pytree.tree_map(lambda t: t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t, tree)


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """Which dtype a wrapped module computes in.

    Attributes:
        param_dtype: the dtype of the parameter copies the forward uses
            (default ``torch.bfloat16``). The parameters themselves keep
            their dtype (float32 master weights).
        output_dtype: cast floating outputs to this dtype (e.g. float32
            logits for the loss); None leaves them as computed.
        cast_forward_inputs: cast floating tensor arguments of ``forward``
            to ``param_dtype`` (integer inputs such as token ids are left alone).

    Raises:
        MixedPrecisionError: a dtype that is not a floating torch dtype.
    """

    param_dtype: torch.dtype = torch.bfloat16
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True

    def __post_init__(self) -> None:
        _check_dtype("param_dtype", self.param_dtype, optional=False)
        _check_dtype("output_dtype", self.output_dtype, optional=True)
        if not isinstance(self.cast_forward_inputs, bool):
            raise MixedPrecisionError(
                f"MixedPrecision cast_forward_inputs must be a bool, got {self.cast_forward_inputs!r}"
            )

    def run(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call ``module(*args, **kwargs)`` with its floating parameters cast to ``param_dtype``.

        Works the same on CPU and xla tensors (the tests use it as the eager
        reference). Buffers are left alone: models keep statistics and
        rotary tables in float32 on purpose.
        """
        if self.cast_forward_inputs:
            args, kwargs = _cast_floating((args, kwargs), self.param_dtype)
        # remove_duplicate=False: a tied weight is one tensor under two names,
        # and both names must see the same low-precision copy.
        params = dict(module.named_parameters(remove_duplicate=False))
        cast = {}
        copies: dict[int, torch.Tensor] = {}
        for name, p in params.items():
            if p.is_floating_point() and p.dtype != self.param_dtype:
                if id(p) not in copies:
                    copies[id(p)] = p.to(self.param_dtype)
                cast[name] = copies[id(p)]
        out = torch.func.functional_call(module, cast, args, kwargs, strict=False, tie_weights=False)
        if self.output_dtype is not None:
            out = _cast_floating(out, self.output_dtype)
        return out
