"""docs/design.md's "Following one op" walk names exactly the files `x + y` and `sync()` run.

The walk is a claim about the hot path ("recording a warm op runs Python in these
files"), so it is checked by profiling, not by reading: a fresh interpreter
(no state left by other tests: caches, autocast, debug modes) records `x + y`
cold and warm and syncs each time, with `sys.setprofile` noting every
spmdtorch file that runs a Python frame. A file added to or dropped from the
path, or a stale line in the doc, fails here.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"

_PROFILE = textwrap.dedent(
    """
    import json, os, sys
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    import torch
    import spmdtorch

    def files_run(fn):
        seen = set()
        def prof(frame, event, arg):
            name = frame.f_code.co_filename.replace(os.sep, "/")
            if event == "call" and "/spmdtorch/" in name:
                seen.add(name.rsplit("/spmdtorch/", 1)[1])
        sys.setprofile(prof)
        try:
            fn()
        finally:
            sys.setprofile(None)
        return sorted(seen)

    x = torch.randn(4, 4).to("xla")
    y = torch.randn(4, 4).to("xla")
    spmdtorch.sync()
    out, kept = {}, []  # kept: a result nobody holds is dropped, and sync would have nothing to run
    out["record_cold"] = files_run(lambda: kept.append(x + y))
    out["sync_cold"] = files_run(spmdtorch.sync)
    out["record_warm"] = files_run(lambda: kept.append(x + y))
    out["sync_hit"] = files_run(spmdtorch.sync)
    print("WALK" + json.dumps(out))
    """
)


def _documented() -> dict[str, tuple[set[str], set[str]]]:
    """Per block ("Recording", "Running"): (files named outside brackets, files named inside them)."""
    text = DESIGN.read_text()
    section = text.split("## Following one op: `x + y` on two xla tensors", 1)[1].split("\n## ", 1)[0]
    recording, running = section.split("**Running**", 1)
    recording = recording.split("**Recording**", 1)[1]
    blocks = {}
    for name, block in (("Recording", recording), ("Running", running)):
        bracketed = " ".join(re.findall(r"\[[^\]]*\]", block, re.S))
        plain = re.sub(r"\[[^\]]*\]", "", block, flags=re.S)
        paths = re.compile(r"`([\w/]+\.py)`")
        blocks[name] = (set(paths.findall(plain)), set(paths.findall(bracketed)))
    return blocks


def _profiled() -> dict[str, set[str]]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROFILE], capture_output=True, text=True, timeout=240, cwd=ROOT, check=False
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("WALK")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"profiling x + y failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {k: set(v) for k, v in json.loads(lines[0][4:]).items()}


def test_design_walk_names_every_file_x_plus_y_runs():
    doc = _documented()
    run = _profiled()
    rec_plain, rec_cold = doc["Recording"]
    sync_plain, sync_cold = doc["Running"]
    problems = []
    if run["record_warm"] != rec_plain:
        problems.append(
            f"warm recording runs {sorted(run['record_warm'])}; the walk names {sorted(rec_plain)} outside brackets"
        )
    if not run["record_cold"] <= rec_plain | rec_cold or not rec_cold <= run["record_cold"]:
        problems.append(
            f"cold recording runs {sorted(run['record_cold'])}; the walk's cold files are {sorted(rec_cold)}"
        )
    if run["sync_hit"] != sync_plain:
        problems.append(f"a cache-hit sync runs {sorted(run['sync_hit'])}; the walk names {sorted(sync_plain)}")
    if not run["sync_cold"] <= sync_plain | sync_cold or not sync_cold <= run["sync_cold"]:
        problems.append(
            f"a compiling sync runs {sorted(run['sync_cold'])}; the walk's cold files are {sorted(sync_cold)}"
        )
    assert not problems, "docs/design.md's x + y walk is stale:\n" + "\n".join(problems)


def test_design_walk_counts_match_its_lists():
    """The prose counts ("10 files", "12") are the lists' sizes."""
    text = DESIGN.read_text()
    doc = _documented()
    assert f"runs Python in {len(doc['Recording'][0])} files" in text
    assert f"compile cache in {len(doc['Running'][0])};" in text
