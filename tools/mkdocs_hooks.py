"""MkDocs hook for the documentation site (``mkdocs.yml``, ``hooks:``): links to the repository's own files.

The pages link to files outside ``docs/`` (``../examples/train_llama.py``,
``../benchmarks/README.md``): right when the Markdown is read on a forge or in
a checkout, but not pages of the site, which MkDocs reports as broken links
(errors under ``--strict``). This hook checks that each such target exists in
the repository, so a renamed file still fails the build, and then writes the
link as a link to ``repo_url``'s copy of the file when ``mkdocs.yml`` names a
``repo_url``, else as the link's text alone (the path, in code).
"""

from __future__ import annotations

import logging
import pathlib
import posixpath
import re
from typing import Any

log = logging.getLogger("mkdocs.plugins.spmdtorch")

# [text](target) with a relative target; images and code spans are not used with such links here.
_LINK = re.compile(r"\[(?P<text>[^\]\n]+)\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)


def _outside_target(page_src: str, target: str) -> str | None:
    """The repository path of ``target`` if it leaves ``docs/``, else None."""
    if "://" in target or target.startswith(("/", "mailto:")):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(page_src), target))
    if not joined.startswith("../"):
        return None
    return posixpath.normpath(posixpath.join("docs", joined))


def on_page_markdown(markdown: str, *, page: Any, config: Any, files: Any) -> str:
    """Checks and rewrites the page's links to repository files outside ``docs/``."""
    repo_root = pathlib.Path(config["config_file_path"]).resolve().parent
    repo_url = (config.get("repo_url") or "").rstrip("/")
    src = page.file.src_uri

    def rewrite(match: re.Match[str]) -> str:
        path = _outside_target(src, match["target"])
        if path is None:
            return match[0]
        if path.startswith("../") or not (repo_root / path).exists():
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository", src, match["target"])
            return match[0]
        if repo_url:
            kind = "tree" if (repo_root / path).is_dir() else "blob"
            return f"[{match['text']}]({repo_url}/{kind}/main/{path}{match['anchor'] or ''})"
        text = match["text"]
        return text if path.rstrip("/") in text.strip("`") else f"{text} (`{path}`)"

    # Leave code blocks alone: only prose links are rewritten.
    out, last = [], 0
    for fence in _FENCE.finditer(markdown):
        out.append(_LINK.sub(rewrite, markdown[last : fence.start()]))
        out.append(fence[0])
        last = fence.end()
    out.append(_LINK.sub(rewrite, markdown[last:]))
    return "".join(out)
