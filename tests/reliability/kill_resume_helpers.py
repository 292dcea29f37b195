"""Helpers shared by the kill-and-resume tests (test_kill_resume*.py)."""

from __future__ import annotations

import os
import queue
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def job_env() -> dict[str, str]:
    """This environment with the repository on ``PYTHONPATH`` (the job imports spmdtorch and the test scripts)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def pump_lines(proc: subprocess.Popen) -> queue.Queue[str | None]:
    """A queue fed with ``proc``'s output lines by a daemon thread, ``None`` at its end.

    The caller reads it with a timeout, so a job that stops printing cannot block the test.
    """
    lines: queue.Queue[str | None] = queue.Queue()

    def pump():
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


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
