"""The PyTorch/XLA-style training scripts in examples/torch_xla_style/ run unchanged under ``python -m spmdtorch.compat``.

Each runs in a fresh subprocess with a hard timeout and small sizes; the child
inherits the 8-CPU-device environment of tests/conftest.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "torch_xla_style"
RUN_TIMEOUT_S = 300


def _run(script: str, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spmdtorch.compat", str(EXAMPLES / script), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} did not finish in {RUN_TIMEOUT_S}s: {str(e.stdout)[-3000:]} {str(e.stderr)[-3000:]}")
    assert proc.returncode == 0, f"{script}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _first_last(out: str) -> tuple[float, float]:
    m = re.search(r"first -> last loss: (\d+\.\d+) -> (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_fsdpv2_decoder_script_trains():
    out = _run("train_fsdpv2_decoder.py", "--steps", "6", "--batch-size", "8", "--seq", "16", "--dim", "32")
    first, last = _first_last(out)
    assert last < first, out
    assert "weight sharding: {devices=[8,1]0,1,2,3,4,5,6,7}" in out, out
    assert out.count("step ") == 6 and "Counter: MarkStep" in out, out


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_data_parallel_cnn_script_trains():
    out = _run("train_cnn_data_parallel.py", "--epochs", "2", "--samples", "128")
    first, last = _first_last(out)
    assert last < first, out
    assert "input sharding: {devices=[8,1,1,1]0,1,2,3,4,5,6,7}" in out, out
    assert float(re.search(r"train accuracy: (\d\.\d+)", out).group(1)) > 0.5, out
