"""The codebase counts issue 44 tracks, measured from the source tree.

    python tools/codebase_counts.py            # a table
    python tools/codebase_counts.py --json     # the same as JSON

What is counted (AST only, except the cache list, which imports spmdtorch):

- storage accesses: ``._st`` / ``._chain`` attribute reads or writes per
  package (their owners are ``tensor`` and ``lazy``; anywhere else the engine's
  data model leaks);
- cross-package private imports: ``from spmdtorch.<pkg>._x import ...`` or
  ``import spmdtorch.<pkg>._x`` from another package (tests/partition/
  test_packages.py fails on them; this counts what it allows);
- loose top-level modules: ``spmdtorch/*.py`` other than ``__init__.py``;
- caches: the names ``spmdtorch.debug.cache_sizes()`` lists (every one is
  emptied by ``clear_caches()``);
- typed share: functions whose every parameter (but ``self``/``cls``) and
  return value are annotated, per package;
- long functions: definitions over 80 lines, docstring included.
"""

from __future__ import annotations

import argparse
import ast
import json
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "spmdtorch"
OWNERS = {"tensor", "lazy"}  # the packages that own the storage and view chain
LONG = 80


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py") if len(rel.parts) > 1 else f"(top) {rel.stem}"


def _fully_typed(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x)]
    params = [p for p in params if p.arg not in ("self", "cls")]
    return fn.returns is not None and all(p.annotation is not None for p in params)


def _private_import(node: ast.AST, pkg: str) -> str | None:
    names = []
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    elif isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    for name in names:
        parts = name.split(".")
        if len(parts) >= 3 and parts[0] == "spmdtorch" and parts[1] != pkg and parts[2].startswith("_"):
            return name
    return None


def measure() -> dict:
    """Every count, from the tree this script sits in."""
    accesses: Counter[str] = Counter()
    private: Counter[str] = Counter()
    typed: dict[str, list[int]] = {}
    long_fns = []
    lines = 0
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        lines += text.count("\n")
        pkg = _package(path)
        top = pkg.split()[-1] if pkg.startswith("(top)") else pkg
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Attribute) and node.attr in ("_st", "_chain") and top not in OWNERS:
                accesses[pkg] += 1
            elif (name := _private_import(node, top)) is not None:
                private[f"{pkg} -> {name}"] += 1
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                share = typed.setdefault(pkg if not pkg.startswith("(top)") else "(top)", [0, 0])
                share[0] += _fully_typed(node)
                share[1] += 1
                n = node.end_lineno - node.lineno + 1
                if n > LONG:
                    long_fns.append((n, f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}"))
    loose = sorted(p.name for p in ROOT.glob("*.py") if p.name != "__init__.py")

    import spmdtorch.debug

    caches = sorted(spmdtorch.debug.cache_sizes())
    return {
        "lines": lines,
        "storage_accesses_outside_owners": dict(accesses),
        "cross_package_private_imports": dict(private),
        "loose_top_level_modules": loose,
        "caches": caches,
        "typed_share": {k: f"{v[0]}/{v[1]} = {v[0] / v[1]:.0%}" for k, v in sorted(typed.items())},
        "long_functions": [f"{n} lines: {where}" for n, where in sorted(long_fns, reverse=True)],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)
    counts = measure()
    if args.json:
        print(json.dumps(counts, indent=1))
        return 0
    for key, value in counts.items():
        if isinstance(value, int):
            print(f"{key}: {value}")
            continue
        print(f"{key}: {len(value)}")
        items = value.items() if isinstance(value, dict) else ((v, None) for v in value)
        for k, v in items:
            print(f"  {k}" + ("" if v is None else f": {v}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
