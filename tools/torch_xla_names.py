"""Write the index of PyTorch/XLA's modules and their public names that spmdtorch.compat follows.

Reads a PyTorch/XLA checkout (the ``torch_xla`` package directory of a source
tree, e.g. tag v2.9.0) by AST only, never importing it, and writes
``spmdtorch/compat/_upstream_names.py``: for every module, the names bound at
its top level and what each is (``class``, ``function``, ``value``,
``module``). Names only; no upstream code is copied. ``torch_xla._XLAC`` has no
Python source: its names come from the ``.def("name"`` / ``(m, "Name")``
bindings of ``csrc/init_python_bindings.cpp`` and from every ``_XLAC.name`` the
Python sources use.

What counts as a module's name (what ``from torch_xla.x import name`` finds in
PyTorch/XLA): top-level ``def``/``class``/assignments (also inside top-level
``if``/``try``/``with`` blocks) and imports of other ``torch_xla`` modules or of
their names (``from .x import *`` follows ``__all__`` when the module defines
it). Imports of other packages (``import os``, ``from typing import Any``) are
left out: they are not PyTorch/XLA's API. Dunder names are left out except
``__version__``.

Usage (from the repository root)::

    python tools/torch_xla_names.py /path/to/xla/torch_xla [--check]

``--check`` compares with the stored index instead of writing it (exit 1 on a difference).
"""

from __future__ import annotations

import argparse
import ast
import pprint
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "spmdtorch" / "compat" / "_upstream_names.py"
ROOT = "torch_xla"
#: Kinds, strongest first: when a name is bound twice (an ``if``/``else``), the first kind listed wins.
KINDS = ("class", "function", "module", "value")


@dataclass
class _Module:
    name: str
    is_package: bool
    tree: ast.Module
    names: dict[str, str] = field(default_factory=dict)
    all_: list[str] | None = None
    #: Deferred bindings: local name -> (source module, source name or None for the module itself).
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)


def _module_name(pkg_dir: Path, path: Path) -> tuple[str, bool]:
    rel = path.relative_to(pkg_dir.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _public(name: str) -> bool:
    return name == "__version__" or not (name.startswith("__") and name.endswith("__"))


def _bind(mod: _Module, name: str, kind: str) -> None:
    if not _public(name):
        return
    old = mod.names.get(name)
    if old is None or KINDS.index(kind) < KINDS.index(old):
        mod.names[name] = kind


def _resolve_from(mod: _Module, node: ast.ImportFrom) -> str | None:
    if node.level == 0:
        return node.module
    base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Tuple | ast.List):
        return [n for elt in target.elts for n in _targets(elt)]
    return []


def _scan(mod: _Module, body: list[ast.stmt]) -> None:
    for node in body:
        if isinstance(node, ast.ClassDef):
            _bind(mod, node.name, "class")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            _bind(mod, node.name, "function")
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for n in _targets(t):
                    if n == "__all__" and isinstance(node, ast.Assign):
                        try:
                            mod.all_ = [str(x) for x in ast.literal_eval(node.value)]
                        except ValueError:
                            pass
                    else:
                        _bind(mod, n, "value")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                    if alias.asname:
                        mod.imports[alias.asname] = (alias.name, None)
                    # `import torch_xla.x.y` binds `torch_xla` itself: nothing new in this module.
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_from(mod, node)
            if source is None or not (source == ROOT or source.startswith(ROOT + ".")):
                continue
            for alias in node.names:
                if alias.name == "*":
                    mod.stars.append(source)
                else:
                    mod.imports[alias.asname or alias.name] = (source, alias.name)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody"):
                _scan(mod, getattr(node, block, []) or [])
            for handler in getattr(node, "handlers", []):
                _scan(mod, handler.body)


def _xlac_names(pkg_dir: Path, modules: dict[str, _Module]) -> dict[str, str]:
    names: dict[str, str] = {}
    cpp = pkg_dir / "csrc" / "init_python_bindings.cpp"
    if cpp.exists():
        src = cpp.read_text()
        comment = r"(?:\s*//[^\n]*\n)*"
        # Module functions: every binding whose name starts with "_" (class methods are public names).
        for n in re.findall(r"\.def(?:_static)?\(" + comment + r'\s*"(_[A-Za-z0-9_]+)"', src):
            if _public(n):
                names[n] = "function"
        for n in re.findall(r'\(\s*m,\s*"([A-Za-z_][A-Za-z0-9_]*)"', src):
            names[n] = "class"
        for n in re.findall(r'def_submodule\(\s*"([A-Za-z_][A-Za-z0-9_]*)"', src):
            names[n] = "value"
    for mod in modules.values():
        for n in re.findall(r"_XLAC\.([A-Za-z_][A-Za-z0-9_]*)", ast.unparse(mod.tree)):
            if _public(n) and n not in names:
                names[n] = "class" if n[:1].isupper() else ("value" if n in ("lowering", "profiler") else "function")
    return names


def build(pkg_dir: Path) -> dict[str, dict[str, str]]:
    """Module name -> {public name: kind} for the ``torch_xla`` package at ``pkg_dir``."""
    modules: dict[str, _Module] = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        if "csrc" in path.relative_to(pkg_dir).parts:
            continue
        name, is_pkg = _module_name(pkg_dir, path)
        mod = _Module(name, is_pkg, ast.parse(path.read_text(), str(path)))
        _scan(mod, mod.tree.body)
        modules[name] = mod
    # Submodules are attributes of their package once imported.
    for name in modules:
        parent, _, child = name.rpartition(".")
        if parent in modules:
            _bind(modules[parent], child, "module")

    # Imports form cycles (spmd/__init__ <-> spmd/xla_sharding): iterate to a fixed point.
    index = {name: dict(mod.names) for name, mod in modules.items()}
    modattrs: dict[str, dict[str, str]] = {name: {} for name in modules}
    changed = True
    while changed:
        changed = False
        for name, mod in modules.items():
            out = index[name]
            for source in mod.stars:
                src_mod = modules.get(source)
                exported = src_mod.all_ if src_mod is not None else None
                for n, kind in list(index.get(source, {}).items()):
                    if ((n in exported) if exported is not None else not n.startswith("_")) and n not in out:
                        out[n] = kind
                        changed = True
            for local, (source, attr) in mod.imports.items():
                if not _public(local) or local in out:
                    continue
                target = source if attr is None else f"{source}.{attr}"
                if target in modules:
                    out[local] = "module"
                    modattrs[name][local] = target
                elif attr in index.get(source, {}):
                    out[local] = index[source][attr]
                else:
                    continue
                changed = True
    for name, mod in modules.items():
        for local in mod.imports:
            if _public(local):
                index[name].setdefault(local, "value")  # from a module the checkout does not have (version.py)
    index[f"{ROOT}._XLAC"] = _xlac_names(pkg_dir, modules)
    index[ROOT].setdefault("_XLAC", "module")
    # A module attribute that is not the child of that name (`torch_xla.tpu` is `torch_xla._internal.tpu`).
    for name, attrs in modattrs.items():
        for local, target in attrs.items():
            if target != f"{name}.{local}":
                index[name][local] = "module=" + target
    return {m: dict(sorted(n.items())) for m, n in sorted(index.items())}


def render(index: dict[str, dict[str, str]], source: str) -> str:
    """The index as the Python module stored in the package (grouped by kind, sorted)."""
    modules, module_attrs = split(index)
    return (
        '"""PyTorch/XLA 2.9\'s modules and their public names (generated: do not edit).\n\n'
        f"Written by ``tools/torch_xla_names.py`` from {source} (names only, read by AST).\n"
        "``MODULES[module][kind]`` lists the names of that kind; kinds: class, function, module, value.\n"
        "``MODULE_ATTRS[module][name]`` is the module an attribute of kind module is, where it is not the\n"
        "child module of that name.\n"
        '"""\n\n'
        "from __future__ import annotations\n\n"
        f"MODULES: dict[str, dict[str, tuple[str, ...]]] = {pprint.pformat(modules, width=118)}\n\n"
        f"MODULE_ATTRS: dict[str, dict[str, str]] = {pprint.pformat(module_attrs, width=118)}\n"
    )


def split(
    index: dict[str, dict[str, str]],
) -> tuple[dict[str, dict[str, tuple[str, ...]]], dict[str, dict[str, str]]]:
    """``(MODULES, MODULE_ATTRS)`` as stored, from :func:`build`'s index."""
    modules: dict[str, dict[str, tuple[str, ...]]] = {}
    module_attrs: dict[str, dict[str, str]] = {}
    for m, names in index.items():
        kinds = {k: tuple(sorted(n for n, kind in names.items() if kind.partition("=")[0] == k)) for k in KINDS}
        modules[m] = {k: v for k, v in kinds.items() if v}
        attrs = {n: kind.partition("=")[2] for n, kind in names.items() if kind.startswith("module=")}
        if attrs:
            module_attrs[m] = dict(sorted(attrs.items()))
    return modules, module_attrs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("torch_xla_dir", type=Path, help="the torch_xla package directory of a PyTorch/XLA checkout")
    parser.add_argument("--source", default="PyTorch/XLA v2.9.0", help="what the checkout is, for the header")
    parser.add_argument("--check", action="store_true", help="compare with the stored index instead of writing")
    args = parser.parse_args(argv)
    pkg = args.torch_xla_dir.resolve()
    if not (pkg / "__init__.py").exists() or pkg.name != ROOT:
        parser.error(f"{pkg} is not a torch_xla package directory (expected .../torch_xla with an __init__.py)")
    index = build(pkg)
    if args.check:
        stored: dict[str, object] = {}
        exec(compile(OUT.read_text(), str(OUT), "exec"), stored)  # our own generated file: plain literals
        if (stored.get("MODULES"), stored.get("MODULE_ATTRS")) != split(index):
            print(f"{OUT} differs from what {pkg} gives: rerun without --check", file=sys.stderr)
            return 1
        print(f"{OUT} matches {pkg}")
        return 0
    OUT.write_text(render(index, args.source))
    print(f"wrote {OUT}: {len(index)} modules (run `ruff format` on it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
