"""The import hook: ``torch_xla.*`` module names resolve to spmdtorch's implementations.

Each alias is a fresh module object named as in PyTorch/XLA (``torch_xla.core.xla_model``)
whose namespace is filled from one implementation module of this package; its
``__getattr__`` imports child aliases on first use (``torch_xla.runtime`` after a
bare ``import torch_xla``) and raises :class:`TorchXlaNameError` for names not provided.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import Any

from spmdtorch.compat.errors import GUIDE, TorchXlaModuleNotProvidedError, TorchXlaNameError

ROOT = "torch_xla"

#: PyTorch/XLA module name -> the implementation module (None: a package with no names of its own).
ALIASES: dict[str, str | None] = {
    "torch_xla": "spmdtorch.compat._torch_xla",
    "torch_xla._XLAC": "spmdtorch.compat._xlac",
    "torch_xla.core": None,
    "torch_xla.core.xla_model": "spmdtorch.compat._xla_model",
    "torch_xla.runtime": "spmdtorch.compat._runtime",
    "torch_xla.distributed": None,
    "torch_xla.distributed.spmd": "spmdtorch.compat._spmd",
    "torch_xla.distributed.spmd.xla_sharding": "spmdtorch.compat._spmd",
    "torch_xla.distributed.spmd.debugging": "spmdtorch.compat._spmd",
    "torch_xla.distributed.parallel_loader": "spmdtorch.compat._parallel_loader",
    "torch_xla.distributed.xla_multiprocessing": "spmdtorch.compat._xla_multiprocessing",
    "torch_xla.distributed.xla_backend": "spmdtorch.compat._xla_backend",
    "torch_xla.distributed.fsdp": "spmdtorch.compat._fsdp",
    "torch_xla.distributed.fsdp.wrap": "spmdtorch.compat._fsdp",
    "torch_xla.experimental": None,
    "torch_xla.experimental.xla_sharding": "spmdtorch.compat._spmd",
    "torch_xla.experimental.spmd_fully_sharded_data_parallel": "spmdtorch.compat._fsdpv2",
    "torch_xla.experimental.distributed_checkpoint": "spmdtorch.compat._dcp",
    "torch_xla.experimental.assume_pure": "spmdtorch.compat._experimental",
    "torch_xla.experimental.scan": "spmdtorch.compat._experimental",
    "torch_xla.experimental.scan_layers": "spmdtorch.compat._experimental",
    "torch_xla.debug": None,
    "torch_xla.debug.metrics": "spmdtorch.compat._metrics",
    "torch_xla.debug.profiler": "spmdtorch.compat._profiler",
    "torch_xla.amp": "spmdtorch.compat._amp",
    "torch_xla.backends": "spmdtorch.compat._backends",
    "torch_xla.amp.syncfree": "spmdtorch.compat._amp",
    "torch_xla.utils": None,
    "torch_xla.utils.serialization": "spmdtorch.compat._serialization",
    "torch_xla.utils.checkpoint": "spmdtorch.compat._utils_checkpoint",
    "torch_xla.utils.utils": "spmdtorch.compat._utils",
    "torch_xla.core.xla_env_vars": "spmdtorch.compat._xla_env_vars",
    "torch_xla.core.xla_builder": "spmdtorch.compat._xla_builder",
    "torch_xla.distributed.spmd.xla_sharded_tensor": "spmdtorch.compat._sharded_tensor",
    "torch_xla.distributed.spmd.api": "spmdtorch.compat._dtensor",
    "torch_xla.experimental.distributed_checkpoint._helpers": "spmdtorch.compat._dcp_helpers",
    "torch_xla.experimental.gradient_accumulation": "spmdtorch.compat._gradient_accumulation",
}

_PACKAGES = frozenset(name.rpartition(".")[0] for name in ALIASES if "." in name)


def _children(name: str) -> set[str]:
    prefix = name + "."
    return {n[len(prefix) :] for n in ALIASES if n.startswith(prefix) and "." not in n[len(prefix) :]}


def _module_getattr(fullname: str, impl: types.ModuleType | None) -> Any:
    children = _children(fullname)

    def __getattr__(attr: str) -> Any:
        if attr in children:
            return importlib.import_module(f"{fullname}.{attr}")
        if impl is not None and not attr.startswith("__"):
            try:
                return getattr(impl, attr)
            except TorchXlaNameError:
                raise
            except AttributeError:
                pass
        raise TorchXlaNameError(
            f"module {fullname!r} has no attribute {attr!r} under spmdtorch.compat: spmdtorch does not provide "
            f"{fullname}.{attr}. The names it provides, their spmdtorch equivalents and what is not supported "
            f"(with the reason) are listed in {GUIDE}"
        )

    return __getattr__


def make_alias(fullname: str) -> types.ModuleType:
    """A new module named ``fullname`` holding its implementation's public names."""
    target = ALIASES[fullname]
    impl = importlib.import_module(target) if target is not None else None
    module = types.ModuleType(fullname, None if impl is None else impl.__doc__)
    module.__spmdtorch_compat__ = True  # type: ignore[attr-defined]  # tells uninstall() and install() it is ours
    if impl is not None:
        names: Sequence[str] = getattr(impl, "__all__", None) or [n for n in vars(impl) if not n.startswith("_")]
        for n in names:
            setattr(module, n, getattr(impl, n))
        module.__all__ = list(names)  # type: ignore[attr-defined]
    if fullname in _PACKAGES:
        module.__path__ = []  # a package: its children are found by TorchXlaFinder
    module.__getattr__ = _module_getattr(fullname, impl)  # type: ignore[method-assign]
    return module


class _AliasLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return make_alias(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: :meth:`create_module` filled the namespace."""


class TorchXlaFinder(importlib.abc.MetaPathFinder):
    """Finds ``torch_xla`` and its submodules among the aliases; refuses the others by name."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != ROOT and not fullname.startswith(ROOT + "."):
            return None
        if fullname not in ALIASES:
            raise TorchXlaModuleNotProvidedError(
                f"No module named {fullname!r} under spmdtorch.compat: spmdtorch provides the torch_xla modules "
                f"of SPMD programs ({', '.join(sorted(n for n in ALIASES if ALIASES[n]))}); {GUIDE} says what "
                "to use instead of the others",
                name=fullname,
            )
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(), is_package=fullname in _PACKAGES)


def installed_finder() -> TorchXlaFinder | None:
    """The finder on ``sys.meta_path``, if installed."""
    for f in sys.meta_path:
        if isinstance(f, TorchXlaFinder):
            return f
    return None
