"""End-to-end: examples/finetune_hf.py fine-tunes a local pretrained directory and saves it back.

A fresh subprocess (the example configures XLA before JAX starts) with a
tiny model and a few steps; it inherits the 8-CPU-device environment of
``tests/conftest.py``. The script itself compares its losses with eager CPU
PyTorch and the saved directory with transformers' ``from_pretrained``; the
test checks its report and the files it wrote.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
from example_runner import RUN_TIMEOUT_S, run_example


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_example("finetune_hf.py", *args)


# Slow tier (12-17 s, CI runs it): loading a pretrained directory into sharded
# parameters, training against eager and saving back are tested by default in
# tests/checkpoint/test_hf_pretrained.py.
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_finetune_hf_example(tmp_path):
    out_dir = tmp_path / "finetuned"
    proc = _run(
        "--steps",
        "3",
        "--layers",
        "2",
        "--hidden",
        "32",
        "--vocab",
        "128",
        "--max-shard-size",
        "20KB",
        "--out",
        str(out_dir),
    )
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
    assert "devices: 8 x CPU" in out, out
    assert re.search(r"embedding \(128, 32\) sharding \{devices=\[8,1\]0,1,2,3,4,5,6,7\}", out), out
    m = re.search(r"first -> last loss\s*│\s*(\d+\.\d+) -> (\d+\.\d+)", out)
    assert m and float(m.group(2)) < float(m.group(1)), out
    m = re.search(r"eager CPU max \|loss diff\|\s*│\s*(\S+)", out)
    assert m and float(m.group(1)) < 1e-3, out
    assert re.search(r"reloaded max \|param diff\|\s*│\s*0\s", out), out
    assert "same as pretrained: True" in out, out
    # The saved directory: an index, its shards and transformers' config.
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and all((out_dir / s).is_file() for s in shards)
    assert (out_dir / "config.json").is_file()
    assert "lm_head.weight" not in index["weight_map"]  # tied to the embedding: stored once
