"""The migration guide's name table and the compat layer cannot drift: checked both ways.

``docs/migrating-from-torch-xla.md``, section "Name table": each ``###``
heading names its module (the first backticked ``torch_xla...`` in it); the
first cell of each table row lists PyTorch/XLA names in backticks, either
dotted from ``torch_xla`` or relative to the heading's module (a relative name
after a dotted one in the same cell is relative to that one's module).

* Every name the table lists is provided by compat (not a stand-in for an
  unprovided PyTorch/XLA name).
* Every name an implementation module provides (its ``__all__``) is listed
  for one of the ``torch_xla`` modules it backs.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from spmdtorch.compat._finder import ALIASES, modules
from spmdtorch.compat._placeholders import is_placeholder

DOC = Path(__file__).resolve().parents[2] / "docs" / "migrating-from-torch-xla.md"
_NAME = re.compile(r"^\.{0,3}[A-Za-z_][A-Za-z0-9_.]*")


def _section(text: str) -> str:
    start = text.index("\n## Name table\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _split(path: str) -> tuple[str, str] | None:
    """``torch_xla.a.b.name`` -> (``torch_xla.a.b``, ``name``) by the longest importable module prefix."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        mod = ".".join(parts[:i])
        if mod in modules():
            return mod, ".".join(parts[i:])
    return None


def documented() -> list[tuple[str, str, str]]:
    """``(module, name, row)`` for every name in the table's first column."""
    out = []
    module = None
    for line in _section(DOC.read_text()).splitlines():
        if line.startswith("### "):
            heads = [s for s in re.findall(r"`([^`]+)`", line) if s.startswith("torch_xla")]
            module = heads[0] if heads else None
            continue
        if not line.startswith("| ") or line.startswith("| ---") or line.startswith("| PyTorch/XLA |"):
            continue
        cell = line.split(" | ")[0]
        current = module
        for span in re.findall(r"`([^`]+)`", cell):
            m = _NAME.match(span)
            if m is None:
                continue  # a return form such as `(TOTAL_SAMPLES, ...)`
            name = m.group(0).lstrip(".")
            if not name:
                continue
            if name.startswith("torch_xla."):
                split = _split(name)
                assert split is not None, f"{name!r} (row {line!r}) names no torch_xla module compat has"
                current, name = split
            assert current is not None, f"{name!r} (row {line!r}) under a heading that names no torch_xla module"
            out.append((current, name, line))
    return out


def test_the_table_lists_names():
    names = documented()
    assert len(names) > 80
    assert any(m == "torch_xla.core.xla_model" and n == "mark_step" for m, n, _ in names)


def test_every_listed_name_is_provided():
    missing = []
    for module_name, name, row in documented():
        obj = importlib.import_module(module_name)
        try:
            for part in name.split("."):
                obj = getattr(obj, part)
        except AttributeError as e:
            missing.append(f"{module_name}.{name}: {e.__class__.__name__} (row {row!r})")
            continue
        if is_placeholder(obj):
            missing.append(f"{module_name}.{name}: listed, but compat does not provide it (row {row!r})")
    assert not missing, "\n".join(missing)


def test_every_provided_name_is_listed():
    listed = {(ALIASES.get(m), n.split(".")[0]) for m, n, _ in documented()}
    # A name re-exported by another module (xs.XLAShardedTensor is xla_sharded_tensor's) is listed once.
    listed_objects = set()
    for m, n, _ in documented():
        obj = getattr(importlib.import_module(m), n.split(".")[0], None)
        if callable(obj):
            listed_objects.add(id(obj))
    unlisted: dict[tuple[str, str], str] = {}  # (impl, name) -> the first torch_xla module it backs
    for module_name, impl_name in sorted(ALIASES.items()):
        if impl_name is None:
            continue
        impl = importlib.import_module(impl_name)
        for name in getattr(impl, "__all__", []):
            if (impl_name, name) not in listed and id(getattr(impl, name)) not in listed_objects:
                unlisted.setdefault((impl_name, name), f"{module_name}.{name} (implemented in {impl_name})")
    assert not unlisted, (
        "names compat provides that docs/migrating-from-torch-xla.md's name table does not list "
        "(add a row under the module's heading):\n" + "\n".join(sorted(unlisted.values()))
    )
