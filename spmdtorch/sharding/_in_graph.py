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
rule for ``XlaTensor`` applies the real ``mark_sharding``; on other tensors
(CPU) the op does nothing, as ``mark_sharding`` has no meaning there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spmdtorch.mesh import Mesh
from spmdtorch.tensor.xla_tensor import XlaTensor

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


def _on_xla(cls: type, func: Any, types: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    from spmdtorch.sharding._marking import mark_sharding  # _marking imports this module

    t, key = args
    mesh, spec = _ANNOTATIONS[key]
    mark_sharding(t, mesh, spec)


torch.library.register_torch_dispatch("spmdtorch::mark_sharding_", XlaTensor, _on_xla)


def mark_sharding_in_graph(t: torch.Tensor, mesh: Mesh, partition_spec: Sequence[Any]) -> torch.Tensor:
    """What ``mark_sharding(t, mesh, spec)`` does while TorchDynamo traces: record the custom op, return ``t``."""
    torch.ops.spmdtorch.mark_sharding_(t, _annotation_key(mesh, tuple(partition_spec)))
    return t
