"""tools/codebase_counts.py: the counts issue 44 reports, read from the tree."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

import codebase_counts


def test_counts_read_the_tree(capsys):
    assert codebase_counts.main(["--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    # The engine's data model stays inside its owners (tests/partition/test_packages.py enforces it too).
    assert counts["storage_accesses_outside_owners"] == {}
    assert counts["cross_package_private_imports"] == {}
    assert "config.py" in counts["loose_top_level_modules"]
    assert "lazy.executor.compile_cache" in counts["caches"]
    assert counts["typed_share"]["lazy"].endswith("= 100%")  # mypy strict covers spmdtorch.lazy
    assert any(" static_decode" in f or " launch" in f for f in counts["long_functions"])


def test_a_function_is_fully_typed_only_with_every_annotation():
    import ast

    fns = ast.parse("def a(self, x: int) -> int: ...\ndef b(x: int): ...\ndef c(*args, **kw: int) -> None: ...").body
    assert [codebase_counts._fully_typed(f) for f in fns] == [True, False, False]
