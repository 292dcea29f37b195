"""The README's usage snippet runs as written."""

import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_snippet_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    exec(compile(blocks[0], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "Counter: UncachedCompile" in out


def test_readme_sharding_snippet_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    exec(compile(blocks[1], "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}" in out
    assert "CPU 1,3,5,7" in out


def _block_after(heading: str) -> str:
    text = README.read_text()
    assert heading in text, f"README has no section {heading!r}"
    return re.findall(r"```python\n(.*?)```", text.split(heading, 1)[1], re.S)[0]


def test_readme_fsdp_snippet_runs(capsys):
    exec(compile(_block_after("### FSDPv2, activation checkpointing, mixed precision"), "README.md", "exec"), {})
    loss = float(capsys.readouterr().out.strip().splitlines()[-1])
    assert 4.0 < loss < 7.0  # ~log(256) = 5.5 for a fresh model


def test_readme_planning_snippet_runs(capsys):
    exec(
        compile(_block_after("### Models that do not fit: plan, materialize, check the memory"), "README.md", "exec"),
        {},
    )
    out = capsys.readouterr().out
    assert "('fsdp', 'tp')" in out
    assert "layers.0.attention.wo.weight" in out and "optimizer state (adamw)" in out
    assert "memory plan per device (8 devices)" in out  # the mesh the parameters were placed on


def test_readme_assume_pure_snippet_runs(capsys):
    exec(compile(_block_after("### Lazy mode without re-recording: `assume_pure`"), "README.md", "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()[-3:]
    ops = [int(line.split()[1]) for line in lines]
    # The first step records the layers once; later steps record one node per layer call instead
    # (what is left: the model outside its layers and AdamW, whose foreach ops count per parameter).
    assert ops[1] == ops[2] and ops[0] > 1.5 * ops[1], lines
