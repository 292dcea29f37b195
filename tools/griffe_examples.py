"""Griffe extension for the documentation site: docstrings read as the site renders them.

Two habits of spmdtorch's docstrings that griffe's Google parser reads
otherwise, fixed in the text griffe parses (the source is unchanged):

* Doctests are titled ``Example:`` (Google style, as Napoleon reads it); griffe
  knows only ``Examples:`` as the examples section and renders ``Example:`` as
  an admonition of plain text, so the ``>>>`` lines would lose their code
  formatting and their outputs would be read as Markdown.
* Cross-references are Sphinx roles (``:func:`~spmdtorch.sharding.mark_sharding```),
  which Markdown shows as they are typed; here each becomes a code span of the
  name (the last component for ``~``, as Sphinx shows it).

The site (``mkdocs.yml``, mkdocstrings' ``extensions``) loads this module.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE_TITLE = re.compile(r"^(\s*)Example:[ \t]*$", re.M)
_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|exc|data|obj):`(?P<tilde>~?)(?P<name>[^`]+)`")


def _role_to_code(match: re.Match[str]) -> str:
    name = match["name"]
    return f"`{name.rsplit('.', 1)[-1] if match['tilde'] else name}`"


class ExampleSections(griffe.Extension):
    """Reads every ``Example:`` section title as ``Examples:`` and Sphinx roles as code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrites ``obj``'s docstring before griffe parses it."""
        if obj.docstring is not None:
            text = _EXAMPLE_TITLE.sub(r"\1Examples:", obj.docstring.value)
            obj.docstring.value = _ROLE.sub(_role_to_code, text)
