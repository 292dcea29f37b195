"""Every test here runs as a PyTorch/XLA user's program: ``import torch_xla...`` after ``install()``.

The ``compat`` fixture (autouse) installs the layer before each test and removes
it (hook, ``torch_xla`` aliases, environment hooks) after, so tests do not
depend on each other's imports.
"""

from __future__ import annotations

import pytest

import spmdtorch.compat


@pytest.fixture(autouse=True)
def compat(devices8):
    spmdtorch.compat.uninstall()
    spmdtorch.compat.install()
    yield spmdtorch.compat
    spmdtorch.compat.uninstall()
