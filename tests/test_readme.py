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
