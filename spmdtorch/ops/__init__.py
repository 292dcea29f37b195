"""ATen → JAX lowerings, one module per op family.

Importing this package imports every op module, which fills
``registry.LOWERINGS``.
"""

import importlib
import pkgutil

from spmdtorch.ops import registry
from spmdtorch.ops.registry import LOWERINGS, get_lowering, register

for _mod in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    if not _mod.startswith("_") and _mod != "registry":
        importlib.import_module(f"{__name__}.{_mod}")

__all__ = ["registry", "register", "get_lowering", "LOWERINGS"]
