"""Every docstring example in the package runs and prints what it shows.

All modules run in one process, in package order, as a user would paste the
examples into one session: an example that only works on a fresh runtime
fails here (this found an in-flight bound that waited on a buffer a later
execution had just taken by donation).
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import spmdtorch

# Entry points that run a program when imported.
_SKIP = {"spmdtorch.launch.__main__"}


def _modules():
    return [m.name for m in pkgutil.walk_packages(spmdtorch.__path__, "spmdtorch.") if m.name not in _SKIP]


def test_every_docstring_example_runs(devices8):
    failed, attempted = {}, 0
    for name in _modules():
        result = doctest.testmod(
            importlib.import_module(name), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
        )
        attempted += result.attempted
        if result.failed:
            failed[name] = result.failed
    assert not failed, f"doctest failures (module: count), details above: {failed}"
    assert attempted > 100, f"only {attempted} examples found: is the package importable?"
