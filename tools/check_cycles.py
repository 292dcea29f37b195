"""Fail if any import cycle exists among spmdtorch's modules.

The layers contract (``lint-imports``, pyproject.toml) forbids imports from a
lower layer to a higher one; this checks the stronger rule that no module
reaches itself through imports at all, inside a layer too, counting the
imports inside functions (docs/design.md, decision 9).

Usage:
    python tools/check_cycles.py
"""

from __future__ import annotations

import sys

import grimp


def _cycles(graph: grimp.ImportGraph, modules: set[str]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child) & modules))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def main() -> int:
    graph = grimp.build_graph("spmdtorch", include_external_packages=False)
    modules = set(graph.modules)
    cycles = _cycles(graph, modules)
    for component in cycles:
        print("import cycle among:", ", ".join(component))
        for m in component:
            for other in sorted(graph.find_modules_directly_imported_by(m) & set(component)):
                details = graph.get_import_details(importer=m, imported=other)
                lines = ", ".join(str(d["line_number"]) for d in details)
                print(f"    {m} -> {other} (line {lines})")
    if not cycles:
        print(f"no import cycles among {len(modules)} modules")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
