"""``mark_sharding`` inside a ``torch.compile``d function: one custom op in the captured graph.

TorchDynamo traces the Python of a compiled function and would stop at
``mark_sharding``'s own code (it reads the engine's storage, which a fake
tensor has none of). While Dynamo traces, ``mark_sharding`` instead calls
``torch.ops.spmdtorch.mark_sharding_(t, key)``: an in-place custom op that
Dynamo records in the graph like any tensor op. ``key`` names the
``(mesh, partition_spec)`` pair in a process-wide table (custom ops take no
mesh objects); it is computed once per trace, outside the graph
(``assume_constant_result``), after the spec was checked against the
tensor's rank. When the graph runs on xla tensors, the op's torch-dispatch
handler in spmdtorch's op router (``special_op``, registered by ``_marking``) applies the real ``mark_sharding``; on other tensors
(CPU) the op does nothing, as ``mark_sharding`` has no meaning there.

AOTAutograd (``aot_function``, or a Dynamo backend built on it) traces with
functionalization, which would wrap an in-place custom op in a higher-order
op that xla tensors cannot run. Under AOTAutograd the annotation is therefore
the functional ``torch.ops.spmdtorch.sharded_copy(t, key)`` written back
with ``t.copy_``, which functionalization turns into plain data flow: the
graph's later uses of ``t`` read the sharded copy. Its gradient is the
incoming gradient unchanged (as ``mark_sharding`` leaves gradients alone).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spmdtorch.mesh import Mesh

__all__ = ["annotation", "mark_sharding_in_graph"]

# key -> (mesh, partition spec); one entry per distinct annotation a trace used.
# Meshes are few and long-lived; the table never needs clearing.
_ANNOTATIONS: dict[int, tuple[Mesh, tuple[Any, ...]]] = {}
_KEYS: dict[tuple[int, tuple[Any, ...]], int] = {}
_LOCK = threading.Lock()


def annotation(key: int) -> tuple[Mesh, tuple[Any, ...]]:
    """The ``(mesh, partition_spec)`` registered under ``key``."""
    return _ANNOTATIONS[key]


def _register(mesh: Mesh, spec: tuple[Any, ...]) -> int:
    with _LOCK:
        key = _KEYS.get((id(mesh), spec))
        if key is None or _ANNOTATIONS[key][0] is not mesh:
            key = len(_ANNOTATIONS)
            _ANNOTATIONS[key] = (mesh, spec)
            _KEYS[(id(mesh), spec)] = key
        return key


# Dynamo calls it at trace time and bakes the returned int into the graph. This
# is the mark torch.compiler.assume_constant_result sets; calling that would
# import torch._dynamo (1.5 s) at ``import spmdtorch``, which must not need it.
_register._dynamo_marked_constant = True  # type: ignore[attr-defined]
_annotation_key: Callable[[Mesh, tuple[Any, ...]], int] = _register


@torch.library.custom_op("spmdtorch::mark_sharding_", mutates_args=("t",))
def _mark_sharding_op(t: torch.Tensor, key: int) -> None:
    """Non-xla tensors: a sharding annotation has no meaning, nothing to do."""


@torch.library.custom_op("spmdtorch::sharded_copy", mutates_args=())
def _sharded_copy_op(t: torch.Tensor, key: int) -> torch.Tensor:
    """Non-xla tensors: a copy (the annotation has no meaning there)."""
    return t.clone()


@_sharded_copy_op.register_fake
def _(t: torch.Tensor, key: int) -> torch.Tensor:
    return torch.empty_like(t)


def _sharded_copy_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
    return grad, None


_sharded_copy_op.register_autograd(_sharded_copy_backward)


def mark_sharding_in_graph(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """What ``mark_sharding(t, mesh, spec)`` does while a tracer runs on fakes: record the annotation, return ``t``."""
    key = _annotation_key(mesh, tuple(partition_spec))
    if torch.compiler.is_compiling():  # TorchDynamo: the in-place op, run as is by spmdtorch's backend
        torch.ops.spmdtorch.mark_sharding_(t, key)
    else:  # AOTAutograd / make_fx: functional form (see the module docstring)
        with torch.no_grad():
            t.copy_(torch.ops.spmdtorch.sharded_copy(t, key))
    return t
