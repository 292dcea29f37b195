"""Numerics only a GPU can check (skipped where JAX finds no GPU; CI has none).

Run on a machine with a GPU and jax's CUDA plugin: ``pytest tests/accelerator``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("gpu_numerics.py")
REPO = SCRIPT.parents[2]


def test_gpu_numerics():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS", "PJRT_DEVICE")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode == 0 and proc.stdout.strip().endswith("NO_GPU"):
        pytest.skip("no GPU: JAX's default platform has no gpu device")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout[-3000:] + proc.stderr[-3000:]
