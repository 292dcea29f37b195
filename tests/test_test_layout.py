"""The test tree's own layout: pytest's default (prepend) import mode needs unique basenames.

tests/ has no ``__init__.py`` files, so pytest imports each test module by its
basename; a second ``test_x.py`` in another folder is refused at collection
("import file mismatch"), an error that fails the whole tier.
"""

from __future__ import annotations

import collections
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_test_module_basenames_are_unique():
    by_name = collections.defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if path.name.startswith("test_") or path.name == "conftest.py":
            by_name[path.name].append(path.relative_to(TESTS).as_posix())
    clashes = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1 and name != "conftest.py"}
    assert not clashes, f"rename one of each: {clashes}"
