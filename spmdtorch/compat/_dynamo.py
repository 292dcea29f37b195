"""PyTorch/XLA's TorchDynamo path: ``torch.compile(fn, backend="openxla")`` runs on spmdtorch.

Under compat, ``import torch_xla`` points the TorchDynamo backend names
``"openxla"`` and ``"openxla_eval"`` at ``spmdtorch.dynamo.openxla_backend``
(``route_openxla``): each captured graph's ops run on the xla tensors through
the lazy engine as one program per graph, computed at the call, as PyTorch/XLA
executes each graph. Unlike PyTorch/XLA's ``"openxla"`` there is no
AOTAutograd step: gradients flow through the graph's ops as in eager.
``torch_xla.core.dynamo_bridge.extract_compiled_graph`` (what torch's own
backends call) is the same backend. The rest of PyTorch/XLA's bridge (its
graph partitioner for CPU fallback, buffer-donor configuration, input
matchers) works on PyTorch/XLA's IR; those names raise ``TorchXlaNameError``
when used.

This module also defines PyTorch/XLA's op ``torch.ops.xla.dynamo_mark_sharding``
(registered when ``torch_xla`` is imported, as PyTorch/XLA does): the
annotation Dynamo can keep in a graph, given as device ids, mesh shape and the
``repr`` of the axis names and of the partition spec.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spmdtorch.compat.errors import CompatError
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import mark_sharding
from spmdtorch.tensor import XlaTensor
from spmdtorch.tensor.dispatch import special_op

# The torch_xla names (torch_xla._dynamo.dynamo_bridge). register_ops, route_openxla and
# unroute_openxla are compat's own: spmdtorch.compat.install()/uninstall() call them.
__all__ = [
    "DynamoMarkShardingError",
    "dynamo_mark_sharding",
    "extract_compiled_graph",
    "is_xla_tensor",
]


class DynamoMarkShardingError(CompatError, ValueError):
    """``torch.ops.xla.dynamo_mark_sharding`` got a mesh or spec it cannot read (a ``ValueError`` too)."""


def extract_compiled_graph(model: torch.fx.GraphModule, args: Sequence[Any]) -> Callable[..., Any]:
    """PyTorch/XLA's bridge entry: the callable that runs ``model`` on xla tensors (``spmdtorch.dynamo.openxla_backend``)."""
    from spmdtorch import dynamo

    return dynamo.openxla_backend(model, args)


def is_xla_tensor(t: Any) -> bool:
    """Whether ``t`` is an xla tensor."""
    return isinstance(t, XlaTensor)


def _literal(text: str, what: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise DynamoMarkShardingError(
            f"torch.ops.xla.dynamo_mark_sharding: {what} must be the repr of a Python literal "
            f"(e.g. str(mesh.axis_names) or '(0, None)'), got {text!r}"
        ) from e


def dynamo_mark_sharding(
    t: torch.Tensor, device_ids: list[int], mesh_shape: list[int], axis_names: str, partition_spec: str
) -> torch.Tensor:
    """Annotate xla tensor ``t`` in place with the sharding the arguments spell; return ``t``."""
    names = _literal(axis_names, "axis_names")
    spec = _literal(partition_spec, "partition_spec")
    if not isinstance(spec, tuple):
        raise DynamoMarkShardingError(
            f"torch.ops.xla.dynamo_mark_sharding: partition_spec must spell a tuple with one entry per dim of the "
            f"tensor (shape {tuple(t.shape)}), got {partition_spec!r}; e.g. '(0, None)'"
        )
    mesh = Mesh(list(device_ids), tuple(mesh_shape), tuple(names) if names is not None else None)
    return mark_sharding(t, mesh, spec)


_XLA_LIB: torch.library.Library | None = None


def _on_xla(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], facts: Any) -> torch.Tensor:
    return dynamo_mark_sharding(*args, **kwargs)


def register_ops() -> None:
    """Define ``torch.ops.xla.dynamo_mark_sharding`` once per process (``import torch_xla`` calls it)."""
    global _XLA_LIB
    if _XLA_LIB is not None:
        return
    lib = torch.library.Library("xla", "FRAGMENT")
    lib.define(
        "dynamo_mark_sharding(Tensor input, int[] device_ids, int[] mesh_shape, str axis_names, "
        "str partition_spec) -> Tensor"
    )
    # Any tensor but an xla one (CPU, Dynamo's fakes): the annotation has no meaning; the input is returned,
    # as PyTorch/XLA's CompositeExplicitAutograd kernel does.
    lib.impl("dynamo_mark_sharding", lambda t, *_: t, "CompositeExplicitAutograd")
    special_op(torch.ops.xla.dynamo_mark_sharding.default)(_on_xla)
    _XLA_LIB = lib


# -- backend="openxla" -----------------------------------------------------------
# torch registers "openxla" as AOTAutograd around the bridge. AOTAutograd's
# backward refuses gradients that are tensor subclasses when it traced plain
# tensors (xla tensors trace as plain meta stand-ins), so under compat both
# names go straight to spmdtorch's backend, which needs no AOTAutograd: the
# graph's ops run under autograd on the real tensors. torch registers its
# backends when it first looks one up (importing the module below, 1-4 s with
# torch._dynamo); the names are re-pointed right after that import, so
# ``import torch_xla`` imports nothing of Dynamo.
_TORCH_BACKEND_MODULE = "torch._dynamo.backends.torchxla"
_OPENXLA_NAMES = ("openxla", "openxla_eval")


# torch's own compiler functions for the names, kept to restore at compat.uninstall().
_TORCH_FNS: dict[str, Any] = {}


def _point_openxla_at_spmdtorch() -> None:
    from torch._dynamo.backends import registry

    # Imported here, when torch looks a backend up (Dynamo is loaded by then): importing
    # spmdtorch.dynamo wraps Dynamo's tracing, which ``import torch_xla`` must not load.
    from spmdtorch import dynamo

    for name in _OPENXLA_NAMES:
        # No public call replaces a registered backend; register_backend refuses a taken name.
        current = registry._COMPILER_FNS.get(name)
        if current is not dynamo.openxla_backend:
            _TORCH_FNS[name] = current
        registry._COMPILER_FNS[name] = dynamo.openxla_backend
        registry._BACKENDS.setdefault(name, None)


class _ThenRoute(importlib.abc.Loader):
    """Runs torch's backend module, then re-points the openxla names."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        _point_openxla_at_spmdtorch()


class _BackendImportHook(importlib.abc.MetaPathFinder):
    """One-shot: wraps the loader of torch's ``torchxla`` backend module when torch imports it."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TORCH_BACKEND_MODULE:
            return None
        _remove_hook()
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenRoute(spec.loader)
        return spec


_HOOK = _BackendImportHook()


def _remove_hook() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)


def route_openxla() -> None:
    """Make ``torch.compile(backend="openxla" | "openxla_eval")`` use ``spmdtorch.dynamo.openxla_backend``."""
    if _TORCH_BACKEND_MODULE in sys.modules:
        _point_openxla_at_spmdtorch()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def unroute_openxla() -> None:
    """Undo ``route_openxla`` (``spmdtorch.compat.uninstall()`` calls it): torch's own openxla backends again."""
    _remove_hook()
    if not _TORCH_FNS:
        return
    from torch._dynamo.backends import registry

    for name, fn in _TORCH_FNS.items():
        if fn is None:
            registry._COMPILER_FNS.pop(name, None)
        else:
            registry._COMPILER_FNS[name] = fn
    _TORCH_FNS.clear()
