"""``torch_xla``'s distribution metadata while compat is installed.

Libraries decide whether PyTorch/XLA is present, and which release, from its
distribution metadata (transformers' ``is_torch_xla_available`` and its FSDPv2
check ask ``importlib.metadata.version("torch_xla")``; Lightning's
``RequirementCache("torch_xla>=...")`` likewise). The import hook answers
``importlib.metadata``'s ``find_distributions`` with this in-memory
distribution, so the answer is "2.9.0" (the release whose API compat follows)
exactly while compat is installed, and nothing is written to site-packages.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

__all__ = ["VERSION", "TorchXlaDistribution", "matches"]

#: The PyTorch/XLA release whose API compat follows (``torch_xla.__version__`` adds ``+spmdtorch``).
VERSION = "2.9.0"

_METADATA = f"""Metadata-Version: 2.1
Name: torch_xla
Version: {VERSION}
Summary: spmdtorch.compat: PyTorch/XLA {VERSION}'s modules and names, implemented by spmdtorch
Requires-Dist: spmdtorch
"""


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def matches(name: str | None) -> bool:
    """Whether a metadata query for ``name`` (None: every distribution) should see this one."""
    return name is None or _normal(name) == "torch_xla"


class TorchXlaDistribution(importlib.metadata.Distribution):
    """The ``torch_xla`` distribution as compat presents it: metadata only, no files."""

    def read_text(self, filename: str) -> str | None:
        """``METADATA`` and ``top_level.txt``; None for every other file (as for a missing one)."""
        if filename == "METADATA":
            return _METADATA
        if filename == "top_level.txt":
            return "torch_xla\n"
        return None

    def locate_file(self, path: str | os.PathLike[str]) -> Path:
        """Paths resolve inside ``spmdtorch.compat`` (the distribution lists no files)."""
        return Path(__file__).parent / path
