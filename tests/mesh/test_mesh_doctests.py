"""The docstring examples of spmdtorch.mesh run and are right (8 devices)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "spmdtorch.mesh",
    "spmdtorch.mesh._devices",
    "spmdtorch.mesh.errors",
    "spmdtorch.mesh.global_mesh",
    "spmdtorch.mesh.hybrid",
    "spmdtorch.mesh.mesh",
    "spmdtorch.mesh.spec",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(devices8, name):
    from spmdtorch.mesh import set_global_mesh

    mod = importlib.import_module(name)
    try:
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS, verbose=False)
    finally:
        set_global_mesh(None)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
