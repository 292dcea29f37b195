"""Opt-in PyTorch/XLA names: ``import torch_xla...`` resolves to spmdtorch.

``install()`` adds an import hook so that a PyTorch/XLA SPMD program runs
unchanged: ``torch_xla``, ``torch_xla.core.xla_model`` (``xm``),
``torch_xla.runtime`` (``xr``), ``torch_xla.distributed.spmd`` (``xs``),
``torch_xla.distributed.parallel_loader`` (``pl``), FSDPv2, the FSDP wrap
policies and ``checkpoint_module``, ``torch_xla.debug.metrics`` (``met``),
``torch_xla.debug.profiler`` (``xp``), ``torch_xla.utils.serialization``
(``xser``), ``torch_xla.utils.checkpoint``,
``torch_xla.experimental.distributed_checkpoint`` and a few ``torch_xla._XLAC``
debugging calls, with PyTorch/XLA's signatures and return shapes.
``python -m spmdtorch.compat script.py args...`` runs a script with it
installed. Importing ``spmdtorch`` never installs it.

SPMD is the only mode: ``xr.use_spmd()`` is accepted and the
multiprocess-only APIs (``xmp.spawn``, ``torch_xla.launch``, the ``xla``
``torch.distributed`` backend, ``XlaFullyShardedDataParallel``) raise
:class:`MultiprocessNotSupportedError` naming the SPMD equivalent. The full
name table and what differs: ``docs/migrating-from-torch-xla.md``.

Example:
    >>> import spmdtorch.compat
    >>> spmdtorch.compat.install()
    >>> import torch, torch_xla.core.xla_model as xm
    >>> t = torch.ones(2, device=xm.xla_device()) * 2
    >>> xm.mark_step(); t.cpu().tolist()
    [2.0, 2.0]
    >>> spmdtorch.compat.uninstall()
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import sys

from spmdtorch.compat import _env
from spmdtorch.compat._finder import ALIASES, ROOT, TorchXlaFinder, installed_finder
from spmdtorch.compat._metadata import TorchXlaDistribution
from spmdtorch.compat.errors import (
    CompatError,
    MultiprocessNotSupportedError,
    TorchXlaInstalledError,
    TorchXlaModuleNotProvidedError,
    TorchXlaNameError,
    UnsupportedEnvironmentError,
)

__all__ = [
    "ALIASES",
    "CompatError",
    "MultiprocessNotSupportedError",
    "TorchXlaInstalledError",
    "TorchXlaModuleNotProvidedError",
    "TorchXlaNameError",
    "UnsupportedEnvironmentError",
    "install",
    "is_installed",
    "uninstall",
]


def _real_torch_xla() -> str | None:
    """Where a real torch_xla is installed or imported, or None."""
    mod = sys.modules.get(ROOT)
    if mod is not None and not getattr(mod, "__spmdtorch_compat__", False):
        return getattr(mod, "__file__", None) or "sys.modules['torch_xla']"
    spec = importlib.machinery.PathFinder.find_spec(ROOT)
    if spec is not None:
        return spec.origin or str(list(spec.submodule_search_locations or []))
    for dist in importlib.metadata.distributions(name="torch_xla"):
        if not isinstance(dist, TorchXlaDistribution):  # compat's own metadata is not a real torch_xla
            return f"the {dist.metadata['Name']} distribution"
    return None


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return installed_finder() is not None


def install() -> None:
    """Make ``import torch_xla...`` resolve to spmdtorch (idempotent).

    Also acts on PyTorch/XLA's environment variables (``PT_XLA_DEBUG_LEVEL``,
    ``XLA_SAVE_TENSORS_FILE``, ``XLA_METRICS_FILE``...; the migration guide
    lists each).

    Raises:
        TorchXlaInstalledError: the real ``torch_xla`` is installed or
            imported; uninstall it (``pip uninstall torch_xla``) or run
            without the compatibility layer.
        UnsupportedEnvironmentError: a PyTorch/XLA variable that means nothing
            in spmdtorch is set (``XLA_USE_BF16``...); the message says what
            to do instead.
    """
    if is_installed():
        return
    where = _real_torch_xla()
    if where is not None:
        raise TorchXlaInstalledError(
            f"the real torch_xla is installed ({where}); spmdtorch.compat would shadow it. Uninstall it "
            "(pip uninstall torch_xla) to run this program on spmdtorch, or do not call "
            "spmdtorch.compat.install() to keep using PyTorch/XLA"
        )
    _env.apply()
    sys.meta_path.insert(0, TorchXlaFinder())
    # backend="openxla" becomes spmdtorch's TorchDynamo backend (without importing torch._dynamo).
    from spmdtorch.compat import _dynamo

    _dynamo.route_openxla()


def uninstall() -> None:
    """Undo :func:`install`: remove the hook, the ``torch_xla`` aliases and the environment hooks."""
    finder = installed_finder()
    if finder is not None:
        sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n == ROOT or n.startswith(ROOT + ".")]:
        if getattr(sys.modules[name], "__spmdtorch_compat__", False):
            del sys.modules[name]
    dynamo_bridge = sys.modules.get("spmdtorch.compat._dynamo")
    if dynamo_bridge is not None:  # install() pointed backend="openxla" at spmdtorch
        dynamo_bridge.unroute_openxla()
    _env.remove()
