"""tools/torch_xla_examples.py on a made-up checkout: how it judges an example's run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "torch_xla_examples.py"

# Stands in for examples/scan/scan_examples.py: the two results the tool checks, computed by spmdtorch.scan.
SCAN = """
import torch
import torch_xla
from torch_xla.experimental.scan import scan

def step(carry, x):
    carry = carry + x
    return carry, carry

final, ys = scan(step, torch.zeros(1, device="xla"), torch.ones(6, 1, device="xla"))
print("Final sum:", final.cpu())
acc = {"sum": torch.zeros(1, device="xla")}
for i in range(1, 6):
    acc["sum"] = acc["sum"] + i
print({"sum": acc["sum"].cpu()})
"""

WRONG_SCAN = SCAN.replace("torch.ones(6, 1", "torch.ones(5, 1")

# Stands in for a multiprocess example: torch_xla.launch is refused by name.
LAUNCH = """
import torch_xla
torch_xla.launch(print, args=())
"""


def run(root: Path, *only: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), str(root), "--only", *only, "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def checkout(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "xla" / "examples" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "xla"


@pytest.mark.slow  # two example processes (~40 s on 2 cores)
def test_scan_results_and_multiprocess_refusal_are_judged(tmp_path):
    root = checkout(tmp_path, {"scan/scan_examples.py": SCAN, "data_parallel/train_resnet_ddp.py": LAUNCH})
    proc = run(root, "scan_examples", "resnet_ddp")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "scan_examples" in proc.stdout and "ok: cumsum and running-mean results" in proc.stdout
    assert "refused: spmdtorch.compat.errors.MultiprocessNotSupportedError" in proc.stdout


@pytest.mark.slow
def test_a_wrong_result_fails_the_run(tmp_path):
    proc = run(checkout(tmp_path, {"scan/scan_examples.py": WRONG_SCAN}), "scan_examples")
    assert proc.returncode == 1
    assert "FAIL: cumsum and running-mean results" in proc.stdout


def test_a_missing_examples_folder_is_named(tmp_path):
    proc = run(tmp_path, "scan_examples")
    assert proc.returncode == 2
    assert "examples does not exist" in proc.stderr
