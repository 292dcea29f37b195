"""The package's import structure: one-way layers, no cycle (docs/design.md, "Layers")."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys

import grimp

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("import_cycles", _ROOT / "tools" / "import_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycle_in_spmdtorch():
    tool = _load_tool()
    graph = grimp.build_graph("spmdtorch", cache_dir=None)
    assert tool._cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    """The check above can fail: a two-module cycle is reported as one component."""
    tool = _load_tool()

    class Graph:
        modules = {"a", "b", "c"}
        edges = {"a": {"b"}, "b": {"a", "c"}, "c": set()}

        def find_modules_directly_imported_by(self, m):
            return self.edges[m]

    assert tool._cycles(Graph()) == [["a", "b"]]


def test_layers_contract_holds():
    out = subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()"],
        cwd=_ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
