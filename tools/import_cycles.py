"""Fail if any import cycle exists among spmdtorch's modules.

Builds the module-level import graph with grimp (the library import-linter
uses; imports inside functions count too) and reports every strongly
connected component of more than one module. Run it from the repository root:

    PYTHONPATH=$PWD python tools/import_cycles.py
"""

from __future__ import annotations

import sys

import grimp


def _cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in graph.modules:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def main() -> int:
    graph = grimp.build_graph("spmdtorch", cache_dir=None)
    cycles = _cycles(graph)
    for comp in cycles:
        print(f"import cycle among {len(comp)} modules:")
        for m in comp:
            inside = sorted(n for n in graph.find_modules_directly_imported_by(m) if n in comp)
            print(f"  {m} -> {', '.join(inside)}")
    if cycles:
        return 1
    print(f"no import cycle among {len(graph.modules)} spmdtorch modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
