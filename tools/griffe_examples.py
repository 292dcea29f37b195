"""Griffe extension for the documentation site: docstrings' ``Example:`` sections render as examples.

spmdtorch's docstrings title their doctests ``Example:`` (Google style, as
Napoleon reads it); griffe's Google parser knows only ``Examples:`` as the
examples section and renders ``Example:`` as an admonition of plain text, so
the ``>>>`` lines would lose their code formatting and their outputs would be
read as Markdown. The site (``mkdocs.yml``, mkdocstrings' ``extensions``)
loads this module; it renames the section title in the docstring griffe
parses and changes nothing in the source.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)


class ExampleSections(griffe.Extension):
    """Reads every ``Example:`` section title as ``Examples:``."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Renames the section titles in ``obj``'s docstring before griffe parses it."""
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE_TITLE.sub(r"\1Examples:", obj.docstring.value)
