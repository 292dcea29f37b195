"""docs/performance.md's example runs as written and says what the page says it does."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def test_host_bound_example_runs(devices8, capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert blocks, "docs/performance.md has no python example"
    exec(compile(blocks[0], str(DOC), "exec"), {})
    lines = capsys.readouterr().out.strip().splitlines()
    # Simulated CPU devices: one entry for XLA's CPU client, with a share between 0% and 100%.
    assert len(lines) == 1 and lines[0].startswith("cpu idle "), lines
    share = int(re.search(r"idle (\d+)% of the window", lines[0]).group(1))
    assert 0 <= share <= 100
