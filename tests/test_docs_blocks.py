"""Every code block of the README and of the documentation site (``docs/``) runs as written.

Convention (README, "Documentation"; ``docs/index.md``):

* A ``python`` block runs. A page's blocks run in order in one namespace, as
  a reader pastes them one after another into one interpreter, on the 8
  simulated CPU devices ``tests/conftest.py`` sets up; a block may print, and
  some blocks' output is checked below (``CHECKS``).
* A block that cannot run here (it installs packages, starts several hosts,
  needs a real accelerator, runs a user's script) has the line
  ``<!-- skip-test: reason -->`` right before its opening fence. ``SKIPPED``
  below counts them per page, so a new one is a visible change to this file;
  ``test_skipped_blocks_are_listed`` fails on an unlisted one and prints them all.
* Where a block needs things a reader has (a Hugging Face model directory, a
  file to import), an HTML comment right before it, ``<!-- test-setup`` ...
  ``-->``, holds the Python that makes them; it runs first, in the same
  namespace, and the site does not show it. Pages run in a fresh temporary
  directory, so blocks write relative paths (``ckpt/run1``).
* ``text`` blocks hold output or diagrams, not code. Every other language
  (``bash`` ...) must be skipped explicitly; a fence without a language fails.
* A page whose blocks change the process for good (``spmdtorch.compat.install()``)
  has ``<!-- test-page: subprocess -->`` and runs in a fresh interpreter.
* A page that includes a README section (``--8<-- "README.md:name"``, the
  site's snippets) shows blocks that run with the README.

The API reference's examples are the docstrings' doctests: ``tests/test_doctests.py``
runs them. ``test_site_builds`` builds the site with ``mkdocs build --strict`` (the
``docs`` extra installs MkDocs; without it the test is skipped, naming the
extra).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Callable

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

# Blocks marked `<!-- skip-test: reason -->`, per page. Change a count only with the marker.
SKIPPED = {
    "README.md": 5,  # the two Quickstart commands, the other-stack script, the compat launcher, the site build
    "docs/dtensor.md": 1,  # the training script in one process and under both launchers
    "docs/index.md": 1,  # the site build
    "docs/migrating-from-torch-xla.md": 4,  # the compat launcher (alone, twice, and under spmdtorch.launch), the xla suite
    "docs/multihost.md": 4,  # the launcher (twice), the TPU pod and torchrun recipes
}

# Blocks of pages this file does not own that fail as written (substring of the block -> why). The block
# must still fail: when its page is fixed, this test fails until the entry is removed.
KNOWN_BROKEN: dict[tuple[str, str], str] = {}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^`]*)$")
_SKIP = re.compile(r"^<!--\s*skip-test:(?P<reason>.*?)-->\s*$")
_SUBPROCESS = "<!-- test-page: subprocess -->"
_SNIPPET = re.compile(r'^--8<-- "(?P<file>[^":]+):(?P<section>[\w-]+)"\s*$')


@dataclasses.dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    heading: str  # the nearest heading above the block
    skip: str | None  # the skip-test reason, if marked
    setup: str = ""  # the hidden test-setup code right before the block (padded to its page lines)


def parse(page: str) -> tuple[list[Block], list[str]]:
    """The page's fenced blocks, and the problems found with its markers."""
    lines = (ROOT / page).read_text().split("\n")
    blocks, problems, heading, setup, i = [], [], "", "", 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if m is None:
            if line.strip() == "<!-- test-setup":
                end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "-->"), len(lines))
                if end + 1 >= len(lines) or not _FENCE.match(lines[end + 1]):
                    problems.append(f"{page}:{i + 1}: a test-setup comment not right before a fence")
                setup = "\n" * (i + 1) + "\n".join(lines[i + 1 : end]) + "\n"
                i = end + 1
                continue
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif _SKIP.match(line.strip()):
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                if not _FENCE.match(nxt):
                    problems.append(f"{page}:{i + 1}: a skip-test marker not right before a fence")
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["info"].strip().split(" ")[0]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            problems.append(f"{page}:{i + 1}: a fence that is never closed")
        body = "\n".join(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : end])
        prev = lines[i - 1].strip() if i else ""
        if prev == "-->" and setup:
            prev = ""  # the test-setup comment's end; a skip marker does not go with a setup
        skip = _SKIP.match(prev)
        reason = skip["reason"].strip() if skip else None
        if skip and not reason:
            problems.append(f"{page}:{i}: a skip-test marker without a reason")
        if not lang:
            problems.append(f"{page}:{i + 1}: a fence without a language (`python`, `bash`, `text`, ...)")
        elif lang not in ("python", "text") and reason is None:
            problems.append(f"{page}:{i + 1}: a `{lang}` block that runs nowhere: mark it `<!-- skip-test: why -->`")
        blocks.append(Block(page, i + 1, lang, body + "\n", heading, reason, setup))
        setup = ""
        i = end + 1
    return blocks, problems


def included_sections(page: str) -> list[str]:
    """The README sections a docs page includes (the site's snippets)."""
    text = (ROOT / page).read_text()
    return [f"{m['file']}:{m['section']}" for m in map(_SNIPPET.match, text.split("\n")) if m]


# Output checks: (page, heading of the block) -> check of what the block printed.
def _check_train(out: str) -> None:
    assert "Counter: UncachedCompile" in out, out


def _check_shard(out: str) -> None:
    assert "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}" in out, out
    assert "CPU 1,3,5,7" in out, out


def _check_fsdp(out: str) -> None:
    loss = float(out.strip().splitlines()[-1])
    assert 4.0 < loss < 7.0, out  # ~log(256) = 5.5 for a fresh model


def _check_planning(out: str) -> None:
    assert "('fsdp', 'tp')" in out, out
    assert "layers.0.attention.wo.weight" in out and "optimizer state (adamw)" in out, out
    assert "memory plan per device (8 devices)" in out, out  # the mesh the parameters were placed on


def _check_assume_pure(out: str) -> None:
    lines = out.strip().splitlines()[-3:]
    ops = [int(line.split()[1]) for line in lines]
    # The first step records the layers once; later steps record one node per layer call instead
    # (what is left: the model outside its layers and AdamW, whose foreach ops count per parameter).
    assert ops[1] == ops[2] and ops[0] > 1.5 * ops[1], lines


def _check_scan(out: str) -> None:
    assert out.strip().splitlines()[-1] == "(64, 64)", out


CHECKS: dict[tuple[str, str], Callable[[str], None]] = {
    ("README.md", "1. Train a PyTorch model: lazy mode and compiled mode"): _check_train,
    ("README.md", "2. Shard it: `mark_sharding`, FSDPv2, DTensor"): _check_shard,
    ("docs/sharding.md", "FSDPv2, activation checkpointing, mixed precision"): _check_fsdp,
    ("docs/planning.md", "Models that do not fit: plan, materialize, check the memory"): _check_planning,
    ("docs/training.md", "Lazy mode without re-recording: `assume_pure`"): _check_assume_pure,
    ("docs/training.md", "Deep models: scan over layers"): _check_scan,
}

# Pages whose blocks take long on 2 cores (the default tier keeps the rest).
SLOW_PAGES = {"docs/checkpoint.md", "docs/models.md"}


def _runnable(page: str) -> list[Block]:
    return [b for b in parse(page)[0] if b.lang == "python" and b.skip is None]


def _known_broken(block: Block) -> str | None:
    return next((why for (page, text), why in KNOWN_BROKEN.items() if page == block.page and text in block.code), None)


def test_every_block_is_run_or_marked():
    problems = [p for page in PAGES for p in parse(page)[1]]
    assert not problems, "\n".join(problems)


def test_skipped_blocks_are_listed():
    """The skipped blocks are the ones ``SKIPPED`` counts; `pytest -rP` prints them and the per-page counts."""
    skipped = {page: [b for b in parse(page)[0] if b.skip] for page in PAGES}
    listing = "\n".join(f"{b.page}:{b.line}: {b.skip}" for bs in skipped.values() for b in bs)
    counts = {page: len(bs) for page, bs in skipped.items() if bs}
    for page in PAGES:
        blocks = parse(page)[0]
        run = sum(b.lang == "python" and b.skip is None for b in blocks)
        text = sum(b.lang == "text" for b in blocks)
        setups = sum(bool(b.setup) for b in blocks)
        included = ", ".join(included_sections(page))
        if blocks or included:
            print(
                f"{page}: {run} run ({setups} with a hidden setup), {len(skipped[page])} skipped, {text} text"
                + (f"; shows {included}" if included else "")
            )
    print(listing)
    assert counts == SKIPPED, f"skip-test markers changed; update SKIPPED.\n{listing}"


def test_included_sections_exist():
    """Each snippet a docs page includes names a marked README section (the site build checks it too)."""
    for page in PAGES:
        for ref in included_sections(page):
            file, section = ref.split(":")
            text = (ROOT / file).read_text()
            assert f"--8<-- [start:{section}]" in text and f"--8<-- [end:{section}]" in text, (page, ref)


def test_checks_find_their_blocks():
    """Every output check names a block that exists (a renamed heading must not drop a check silently)."""
    found = {(b.page, b.heading) for page in PAGES for b in _runnable(page)}
    assert not set(CHECKS) - found, set(CHECKS) - found
    broken = {key for key in KNOWN_BROKEN if not any(_known_broken(b) for b in _runnable(key[0]))}
    assert not broken, f"KNOWN_BROKEN entries that match no block: {broken}"


def test_readme_links_lead_somewhere():
    """The README is not a page of the site (whose build checks its links): its links to files are checked here."""
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert local, "the README links to no page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def _subprocess_page(page: str) -> bool:
    return _SUBPROCESS in (ROOT / page).read_text()


def _page_params():
    params = []
    for page in PAGES:
        if not _runnable(page):
            continue
        marks = [pytest.mark.slow] if page in SLOW_PAGES else []
        params.append(pytest.param(page, marks=marks, id=page))
    return params


def _run_in_process(blocks: list[Block], capsys) -> list[str]:
    namespace: dict = {"__name__": "__docs__"}
    outs = []
    for block in blocks:
        # Blank lines in front: tracebacks give the line numbers of the page.
        if block.setup:
            exec(compile(block.setup, block.page, "exec"), namespace)
        code = compile("\n" * block.line + block.code, block.page, "exec")
        if (why := _known_broken(block)) is not None:
            try:
                exec(code, namespace)
            except Exception:  # noqa: BLE001 (whatever it raises: the block is broken as written)
                outs.append(capsys.readouterr().out)
                continue
            pytest.fail(f"{block.page}:{block.line} runs now ({why}: no longer true); remove its KNOWN_BROKEN entry")
        exec(code, namespace)
        outs.append(capsys.readouterr().out)
    return outs


_SEPARATOR = "\n@@docs-block-end@@\n"


def _run_in_subprocess(blocks: list[Block], tmp_path) -> list[str]:
    script = "".join(
        f"exec(compile({b.setup!r}, {b.page!r}, 'exec'))\n"
        f"exec(compile({padded!r}, {b.page!r}, 'exec'))\nprint({_SEPARATOR!r}, end='', flush=True)\n"
        for b, padded in ((b, "\n" * b.line + b.code) for b in blocks)
    )
    path = tmp_path / "page.py"
    path.write_text(script)
    proc = subprocess.run(
        [sys.executable, str(path)], cwd=tmp_path, env=dict(os.environ), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{blocks[0].page} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout.split(_SEPARATOR)[: len(blocks)]


@pytest.mark.parametrize("page", _page_params())
def test_page_blocks_run(page, capsys, tmp_path, monkeypatch):
    blocks = _runnable(page)
    monkeypatch.chdir(tmp_path)  # blocks write relative paths (checkpoints, model directories)
    if _subprocess_page(page):
        assert not any(_known_broken(b) for b in blocks), "known-broken blocks run in process only"
        outs = _run_in_subprocess(blocks, tmp_path)
    else:
        outs = _run_in_process(blocks, capsys)
    for block, out in zip(blocks, outs):
        check = CHECKS.get((block.page, block.heading))
        if check is not None:
            check(out)


@pytest.mark.timeout(600)
def test_site_builds(tmp_path):
    """`mkdocs build --strict` (README, "Documentation"): every page, link, anchor and docstring, no warning."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip("MkDocs is not installed: pip install -e '.[docs]' (the `dev` extra includes it)")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    assert (tmp_path / "site" / "api" / "index.html").exists()
