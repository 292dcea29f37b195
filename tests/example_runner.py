"""Running an example script in a fresh subprocess, as the example tests do.

A fresh process because each example configures XLA before JAX starts; it
inherits the 8-CPU-device environment that ``tests/conftest.py`` sets.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
# The subprocess limit; tests mark themselves `timeout(RUN_TIMEOUT_S + 60)` so that
# pytest-timeout (pyproject: 300 s) does not kill the session before the run reports.
RUN_TIMEOUT_S = 300


def _text(stream: str | bytes | None) -> str:
    return stream.decode(errors="replace") if isinstance(stream, bytes) else (stream or "")


def run_example(name: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``examples/<name> args...`` from the repository root; fail the test if it hangs."""
    example = EXAMPLES / name
    env = dict(os.environ)
    env["COLUMNS"] = "160"  # rich wraps at 80 columns when stdout is a pipe
    try:
        return subprocess.run(
            [sys.executable, str(example), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"{name} {' '.join(args)} did not finish in {RUN_TIMEOUT_S}s\n"
            f"--- stdout ---\n{_text(e.stdout)[-4000:]}\n--- stderr ---\n{_text(e.stderr)[-4000:]}",
            pytrace=False,
        )
