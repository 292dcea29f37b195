"""Activation checkpointing (rematerialisation) that survives XLA's optimiser.

``torch.utils.checkpoint`` recomputes a block's forward during backward. In
one XLA program that recomputation is an exact copy of the forward ops, which
XLA's common-subexpression elimination merges straight back, so nothing is
saved. As in PyTorch/XLA (and ``jax.checkpoint``), the recomputation's inputs
go through ``jax.lax.optimization_barrier`` together with the incoming
gradients: the recomputed values then depend on the backward pass, must be
computed there, and the forward activations can be freed.

Backend note: by default XLA's CPU pipeline removes optimisation barriers
(its ``cse_barrier_expander`` pass) before a later CSE pass, so on the CPU
backend neither this nor ``jax.checkpoint`` lowers peak memory unless
``XLA_FLAGS`` holds ``--xla_disable_hlo_passes=cse_barrier_expander``
(:data:`CPU_REMAT_XLA_FLAG`, set before JAX starts; the test suite and
``examples/train_llama.py`` set it). With it, the barriers survive and the
compiled step's temporary memory drops as with ``jax.checkpoint`` (measured
in ``tests/partition/test_activation_checkpoint.py``). ``checkpoint_module``
warns once when it runs on CPU without the flag. GPU and TPU keep barriers.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import torch
import torch.utils._pytree as pytree

from spmdtorch import _checks, _dtypes
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.lazy import rng
from spmdtorch.lazy.graph import Slot
from spmdtorch.runtime.cpu_devices import CPU_REMAT_XLA_FLAG
from spmdtorch.tensor import random_state
from spmdtorch.tensor.dispatch import read_value, record
from spmdtorch.tensor.xla_tensor import XlaTensor, new_base

__all__ = ["CPU_REMAT_XLA_FLAG", "checkpoint_module", "cpu_keeps_barriers", "optimization_barrier"]


def cpu_keeps_barriers(xla_flags: str | None = None) -> bool:
    """Whether ``XLA_FLAGS`` disables XLA:CPU's ``cse_barrier_expander`` pass.

    Args:
        xla_flags: the flags to inspect (default: ``os.environ["XLA_FLAGS"]``).

    Example:
        >>> cpu_keeps_barriers("--xla_disable_hlo_passes=foo,cse_barrier_expander")
        True
        >>> cpu_keeps_barriers("--xla_force_host_platform_device_count=8")
        False
    """
    if xla_flags is None:
        flags = os.environ.get("XLA_FLAGS", "")
    else:
        flags = _checks.check_str(xla_flags, "cpu_keeps_barriers", "xla_flags", ArgumentTypeError)
    passes = ",".join(re.findall(r"--xla_disable_hlo_passes=(\S*)", flags)).split(",")
    return "cse_barrier_expander" in passes


_warned_cpu = False


def _warn_if_cpu_drops_barriers() -> None:
    global _warned_cpu
    if _warned_cpu or jax.default_backend() != "cpu" or cpu_keeps_barriers():
        return
    _warned_cpu = True
    warnings.warn(
        "checkpoint_module on the CPU backend: XLA:CPU removes optimisation barriers by default, so the "
        "recomputation is merged back into the forward and activation memory is NOT reduced. Add "
        f"{CPU_REMAT_XLA_FLAG!r} to XLA_FLAGS before JAX starts to keep them (GPU/TPU need nothing).",
        RuntimeWarning,
        stacklevel=3,
    )


def _barrier(*xs: jax.Array) -> Any:  # jax.lax is unannotated
    return jax.lax.optimization_barrier(tuple(xs))


def optimization_barrier(*tensors: torch.Tensor) -> tuple[XlaTensor, ...]:
    """Return copies of ``tensors`` that XLA may not move across this point nor merge.

    Every result depends on every argument, so whatever is computed from one
    result waits for all arguments (this is how ``checkpoint_module`` makes a
    recomputation wait for the backward pass).

    Args:
        *tensors: xla tensors.

    Returns:
        A tuple of new xla tensors with the same values.

    Raises:
        TypeError: an argument is not an xla tensor.

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.fsdp import optimization_barrier
        >>> a, b = optimization_barrier(torch.ones(2, device="xla"), torch.zeros(2, device="xla"))
        >>> a.cpu().tolist()
        [1.0, 1.0]
    """
    for i, t in enumerate(tensors):
        if not isinstance(t, XlaTensor):
            raise ArgumentTypeError(
                f"optimization_barrier: argument {i} is a {type(t).__name__} on "
                f"{getattr(t, 'device', '?')}, not an xla tensor (tensors[{i}]); move it with .to('xla')"
            )
    values = [read_value(t) for t in tensors]
    avals = tuple((tuple(t.shape), _dtypes.to_jax_dtype(t.dtype)) for t in tensors)
    refs = record(_barrier, "optimization_barrier", (tuple(Slot(i) for i in range(len(values))), ()), values, avals)
    if len(tensors) == 1:
        refs = [refs]
    return tuple(new_base(r, t.dtype) for r, t in zip(refs, tensors))


# Set while a checkpointed module re-runs its forward inside backward: the
# module's (wrapped) forward then runs plainly instead of checkpointing again.
_RECOMPUTING = threading.local()


class _Call:
    """One checkpointed call: the module, its arguments' structure, its outputs' structure."""

    # Set by _Checkpoint.forward, before anything reads them.
    out_leaves: list[Any]
    out_spec: pytree.TreeSpec
    out_pos: list[int]  # positions of the tensor leaves in out_leaves

    def __init__(
        self, forward: Callable[..., Any], arg_leaves: list[Any], arg_spec: pytree.TreeSpec, tensor_pos: list[int]
    ) -> None:
        self.forward = forward
        # Non-tensor leaves only: ``run`` puts the tensors in. Kept, the tensors
        # would outlive their saved-for-backward copies for as long as the graph.
        self.arg_leaves = [None if i in tensor_pos else a for i, a in enumerate(arg_leaves)]
        self.arg_spec = arg_spec
        self.tensor_pos = tensor_pos
        self.rng_state: Any = None  # the RNG state the forward started from

    def run(self, tensors: Sequence[torch.Tensor]) -> Any:
        leaves = list(self.arg_leaves)
        for pos, t in zip(self.tensor_pos, tensors):
            leaves[pos] = t
        args, kwargs = pytree.tree_unflatten(leaves, self.arg_spec)
        return self.forward(*args, **kwargs)


class _Checkpoint(torch.autograd.Function):
    """Forward without saving activations; recompute them behind a barrier in backward."""

    @staticmethod
    def forward(ctx: Any, call: _Call, n_params: int, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.call = call
        ctx.n_params = n_params
        ctx.save_for_backward(*inputs)
        # Random ops (dropout) must draw the same numbers when backward
        # recomputes this forward: record them on a saved RNG state.
        call.rng_state = random_state.get_rng_state()
        with torch.no_grad():
            out = call.run(inputs[n_params:])
        leaves, spec = pytree.tree_flatten(out)
        call.out_spec = spec
        call.out_pos = [i for i, o in enumerate(leaves) if isinstance(o, torch.Tensor)]
        call.out_leaves = leaves
        tensors = tuple(leaves[i] for i in call.out_pos)
        ctx.mark_non_differentiable(*(t for t in tensors if not t.is_floating_point()))
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        inputs = ctx.saved_tensors
        n = ctx.n_params
        params, args = inputs[:n], inputs[n:]
        # Tie the recomputation's inputs to the incoming gradients: XLA must
        # then recompute in backward instead of reusing forward values.
        live = [g for g in grads if isinstance(g, XlaTensor)]
        xla_args = [i for i, a in enumerate(args) if isinstance(a, XlaTensor)]
        tied = list(args)
        if live and xla_args:
            out = optimization_barrier(*live, *(args[i] for i in xla_args))[len(live) :]
            for i, t in zip(xla_args, out):
                tied[i] = t
        tied = [t.detach().requires_grad_(a.requires_grad) for t, a in zip(tied, args)]
        _RECOMPUTING.active = True
        current = rng.active_region()
        random_state.set_rng_state(ctx.call.rng_state)
        try:
            with torch.enable_grad():
                out = ctx.call.run(tied)
        finally:
            _RECOMPUTING.active = False
            rng.set_region(current)
        leaves = pytree.tree_leaves(out)
        outs, out_grads = [], []
        for i, g in zip(ctx.call.out_pos, grads):
            o = leaves[i]
            if g is not None and o.requires_grad:
                outs.append(o)
                out_grads.append(g)
        wanted = [p for p in params if p.requires_grad] + [t for t in tied if t.requires_grad]
        got = torch.autograd.grad(outs, wanted, out_grads, allow_unused=True) if outs and wanted else ()
        it = iter(got)
        param_grads = [next(it) if p.requires_grad else None for p in params]
        arg_grads = [next(it) if t.requires_grad else None for t in tied]
        return (None, None, *param_grads, *arg_grads)


def checkpoint_module(module: torch.nn.Module) -> torch.nn.Module:
    """Make ``module`` recompute its activations in backward instead of keeping them.

    PyTorch/XLA's ``checkpoint_module``: only the module's inputs are kept for
    backward; its forward runs again there, behind an optimisation barrier.
    The module is changed in place (its ``forward`` is wrapped) and returned,
    so it composes with ``FSDPv2``'s ``auto_wrapper_callable``. Arguments and
    outputs may be any nesting of tuples/lists/dicts of tensors and other
    values. Random ops (dropout...) draw the same numbers in the
    recomputation as in the forward, as with ``torch.utils.checkpoint``'s
    ``preserve_rng_state``; each step still draws fresh ones.

    Args:
        module: the module to checkpoint.

    Returns:
        ``module``.

    Raises:
        ArgumentTypeError: ``module`` is not an ``nn.Module`` (a ``TypeError``).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.fsdp import checkpoint_module
        >>> block = checkpoint_module(torch.nn.Linear(4, 4).to("xla"))
        >>> block(torch.ones(2, 4, device="xla")).sum().backward()
        >>> tuple(block.weight.grad.shape)
        (4, 4)
    """
    if not isinstance(module, torch.nn.Module):
        raise ArgumentTypeError(
            f"checkpoint_module expects an nn.Module, got {type(module).__name__} as module; "
            "wrap plain functions in a module or use torch.utils.checkpoint"
        )
    if getattr(module, "_spmdtorch_checkpointed", False):
        return module
    _warn_if_cpu_drops_barriers()
    forward = module.forward

    @functools.wraps(forward)
    def checkpointed(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled() or getattr(_RECOMPUTING, "active", False):
            return forward(*args, **kwargs)
        leaves, spec = pytree.tree_flatten((args, kwargs))
        pos = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor)]
        call = _Call(forward, leaves, spec, pos)
        params = list(module.parameters())
        # torch leaves Function.apply unannotated.
        outs = _Checkpoint.apply(call, len(params), *params, *(leaves[i] for i in pos))  # type: ignore[no-untyped-call]
        result = list(call.out_leaves)
        for i, t in zip(call.out_pos, outs):
            result[i] = t
        # The outputs' grad_fn holds ``call``: held by it too, they would be a
        # reference cycle, freed only by a garbage collection, not when the step
        # drops them. Meanwhile each block's output stays on the device, and a
        # compiled step (which traces with the collector paused) finds it alive,
        # keeps it as state, and traces again on every call once it is gone.
        call.out_leaves = []
        return pytree.tree_unflatten(result, call.out_spec)

    module.forward = checkpointed
    # torch's stub types Module.__setattr__'s value as Tensor | Module; any value is accepted.
    module._spmdtorch_checkpointed = True  # type: ignore[assignment]
    return module
