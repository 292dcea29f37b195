"""tools/torch_xla_suite.py: per-file outcomes of a PyTorch/XLA-style unittest suite, on a made-up checkout."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "torch_xla_suite.py"

MIXED = """
import unittest

class A(unittest.TestCase):
    def test_ok(self):
        self.assertEqual(1 + 1, 2)

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise KeyError("boom")

    @unittest.skip("not here")
    def test_skip(self):
        pass

if __name__ == "__main__":
    unittest.main()
"""

# Runs only with the compatibility layer installed: torch_xla names resolve.
USES_TORCH_XLA = """
import unittest
import torch
import torch_xla.core.xla_model as xm

class B(unittest.TestCase):
    def test_device_add(self):
        t = torch.ones(3, device=xm.xla_device()) + 1
        self.assertEqual(t.cpu().tolist(), [2.0, 2.0, 2.0])

if __name__ == "__main__":
    unittest.main()
"""

CRASHES_AT_IMPORT = """
import unittest
import does_not_exist_anywhere

class C(unittest.TestCase):
    def test_never_runs(self):
        pass

    def test_never_runs_either(self):
        pass

if __name__ == "__main__":
    unittest.main()
"""

HANGS = """
import time, unittest

class D(unittest.TestCase):
    def test_first(self):
        pass

    def test_hangs(self):
        time.sleep(600)

if __name__ == "__main__":
    unittest.main()
"""


def checkout(tmp_path: Path, files: dict[str, str]) -> Path:
    spmd = tmp_path / "xla" / "test" / "spmd"
    spmd.mkdir(parents=True)
    (spmd / "test_xla_sharding_base.py").write_text("raise RuntimeError('a helper module, never run as a test')\n")
    for name, text in files.items():
        (spmd / name).write_text(textwrap.dedent(text))
    return tmp_path / "xla"


def run_tool(*args: object, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False
    )


def test_counts_each_outcome_per_file_and_writes_json(tmp_path):
    root = checkout(tmp_path, {"test_mixed.py": MIXED, "test_crash.py": CRASHES_AT_IMPORT})
    out = tmp_path / "r.json"
    proc = run_tool(root, "--real", "--json", out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["files"]["test_mixed.py"] == {
        "A.test_ok": "passed",
        "A.test_fail": "failed",
        "A.test_error": "error",
        "A.test_skip": "skipped",
    }
    assert data["files"]["test_crash.py"] == {}
    assert "does_not_exist_anywhere" in data["errors"]["test_crash.py"]
    assert "test_xla_sharding_base.py" not in data["files"]
    lines = {ln.split()[0]: ln.split()[1:] for ln in proc.stdout.splitlines() if ln.startswith(("test_", "total"))}
    # defined, ran, passed, failed, errors, skipped
    assert lines["test_mixed.py"] == ["4", "4", "1", "1", "1", "1"]
    assert lines["test_crash.py"] == ["2", "0", "0", "0", "0", "0"]
    assert lines["total"] == ["6", "4", "1", "1", "1", "1"]


def test_compat_mode_runs_torch_xla_code_and_baseline_lists_what_is_lost(tmp_path):
    root = checkout(tmp_path, {"test_xm.py": USES_TORCH_XLA, "test_mixed.py": MIXED})
    base = tmp_path / "base.json"
    # A made-up baseline: the "real" run passed B.test_device_add and A.test_fail.
    files = {"test_xm.py": {"B.test_device_add": "passed"}, "test_mixed.py": {"A.test_fail": "passed"}}
    base.write_text(json.dumps({"files": files}))
    proc = run_tool(root, "--baseline", base, "--markdown")
    assert proc.returncode == 0, proc.stderr
    assert "| test_xm.py | 1 | 1 | 1 | 0 | 0 | 0 | 1 |" in proc.stdout
    assert "1 tests PyTorch/XLA passes that spmdtorch does not:" in proc.stdout
    assert "test_mixed.py::A.test_fail" in proc.stdout


def test_a_hanging_file_is_killed_and_keeps_what_ran(tmp_path):
    root = checkout(tmp_path, {"test_hang.py": HANGS})
    out = tmp_path / "r.json"
    proc = run_tool(root, "--real", "--timeout", 20, "--json", out)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["files"]["test_hang.py"] == {"D.test_first": "passed"}
    assert "timeout" in data["errors"]["test_hang.py"]


def test_only_rejects_unknown_files(tmp_path):
    root = checkout(tmp_path, {"test_mixed.py": MIXED})
    proc = run_tool(root, "--only", "test_nope.py")
    assert proc.returncode == 2
    assert "test_nope.py" in proc.stderr
