"""End-to-end: ``examples/generate.py`` generates on 8 devices with tensor-parallel heads.

Each run is a fresh subprocess (the example configures XLA before JAX starts),
at the example's small default sizes; the child inherits the 8-CPU-device
environment that ``tests/conftest.py`` sets. The example itself compares its
tokens with transformers' eager CPU ``generate`` and exits non-zero when they
differ or when more than 3 programs were compiled.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from example_runner import RUN_TIMEOUT_S, run_example


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_example("generate.py", *args)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "flags,verdict",
    [
        pytest.param(  # ~12 s; greedy compiled generation vs eager: tests/models/test_generate.py in-process
            ("--new-tokens", "16"),
            "OK: tokens equal eager CPU",
            marks=pytest.mark.slow,
        ),
        pytest.param(  # sampling and lazy decoding: tests/models/test_generate.py in-process
            ("--new-tokens", "6", "--mode", "lazy", "--sample", "--top-k", "4"),
            "OK: sampled tokens in eager CPU top-4",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["greedy-compiled", "sampled-lazy"],
)
def test_generate_example(flags, verdict):
    proc = _run(*flags)
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
    assert "devices: 8 x CPU" in out, out
    assert "mesh: tp=8" in out, out
    assert "self_attn.q_proj.weight: {devices=[8,1]0,1,2,3,4,5,6,7}" in out, out
    assert "self_attn.o_proj.weight: {devices=[1,8]0,1,2,3,4,5,6,7}" in out, out
    m = re.search(r"decode tokens/s: (\d+\.\d+) per sequence", out)
    assert m and float(m.group(1)) > 0, out
    m = re.search(r"compiles: (\d+)", out)
    assert m and int(m.group(1)) <= 3, out
    assert verdict in out, out


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_generate_example_rejects_bad_sizes():
    proc = _run("--hidden", "100", "--head-dim", "16")
    assert proc.returncode != 0
    assert "--head-dim" in proc.stderr, proc.stderr
