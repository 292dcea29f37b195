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


def run_example(
    name: str, *args: str, nprocs: int | None = None, devices_per_proc: int = 4, cwd: Path = ROOT
) -> subprocess.CompletedProcess:
    """Run ``examples/<name> args...`` (from the repository root by default); fail the test if it hangs.

    Args:
        name: the example's file name.
        *args: its command-line arguments.
        nprocs: run it as one job of that many processes through
            ``python -m spmdtorch.launch`` (each with ``devices_per_proc``
            simulated CPU devices; the launcher prefixes each output line with
            ``[rank N]``); None runs one plain process.
        devices_per_proc: the launcher's ``--devices-per-proc``.
        cwd: the working directory.
    """
    example = EXAMPLES / name
    env = dict(os.environ)
    env["COLUMNS"] = "160"  # rich wraps at 80 columns when stdout is a pipe
    command = [sys.executable, str(example), *args]
    if nprocs is not None:
        # The launcher's own limit ends every process of the job (the subprocess limit would end the launcher only).
        job = ["-m", "spmdtorch.launch", "--nprocs", str(nprocs), "--devices-per-proc", str(devices_per_proc)]
        command = [sys.executable, *job, "--timeout", str(RUN_TIMEOUT_S - 30), str(example), *args]
    try:
        return subprocess.run(
            command,
            cwd=cwd,
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
