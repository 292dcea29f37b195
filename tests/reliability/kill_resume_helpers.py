"""Helpers shared by the kill-and-resume tests (test_kill_resume*.py)."""

from __future__ import annotations

from pathlib import Path


def newest_step(directory: Path) -> int:
    """The step the next start resumes from: the newest finalised step directory, or 0.

    Orbax names a finalised step by its number; one still being written (or
    killed while written) has a temporary name, and retired steps are in a trash folder.
    """
    return max([int(p.name) for p in Path(directory).iterdir() if p.name.isdigit()], default=0)


def restored_step(lines: list[str]) -> int:
    for line in lines:
        if line.startswith("restored "):
            return int(line.split()[1])
    return 0
