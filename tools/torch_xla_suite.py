"""Run PyTorch/XLA's own SPMD test suite, unchanged, on spmdtorch and print per-file pass counts.

Usage::

    python tools/torch_xla_suite.py /path/to/pytorch-xla-checkout [--markdown] [--json out.json]
        [--baseline real.json] [--only test_xla_sharding.py ...] [--real] [--timeout 900]

Each ``test/spmd/test_*.py`` file of the checkout runs in its own process, from
its own directory, as ``__main__`` (exactly as ``python test_x.py`` would), on
8 simulated CPU devices (``PJRT_DEVICE=CPU``), with ``spmdtorch.compat``
installed; ``--real`` runs it without the layer instead, to measure an
installed PyTorch/XLA on the same machine (the baseline column). The child
records every test's outcome as it ends (one JSON line each, so a file that
crashes or hangs half-way still reports what ran), and a file that outlives
``--timeout`` is killed with its whole process group (JAX traps SIGTERM).

``--json`` writes every test's outcome; ``--baseline`` reads such a file (from a
``--real`` run) and adds the baseline's pass count per file and the list of
tests the baseline passes that spmdtorch does not.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

#: Files of test/spmd that are helpers, not test files.
NOT_TESTS = frozenset({"test_xla_sharding_base.py"})
OUTCOMES = ("passed", "failed", "error", "skipped", "xfail", "xpass")
DEVICES = 8


class Setting(NamedTuple):
    """What PyTorch/XLA's own CI (test/run_tests.sh) passes one file beyond ``python file``."""

    env: dict[str, str] = {}
    args: tuple[str, ...] = ()


#: Files run_tests.sh runs with more than ``python file``; ``{tmp}`` is a fresh temporary directory.
UPSTREAM_CI: dict[str, Setting] = {
    # run_save_tensor_hlo: the graphs are written to a file the tests read back.
    "test_spmd_graph_dump.py": Setting({"XLA_SAVE_TENSORS_FILE": "{tmp}/save.hlo", "XLA_SAVE_TENSORS_FMT": "hlo"}),
    "test_spmd_lowering_context.py": Setting(
        {"XLA_SAVE_TENSORS_FILE": "{tmp}/save.hlo", "XLA_SAVE_TENSORS_FMT": "hlo"}
    ),
    "test_train_spmd_linear_model.py": Setting(args=("--skip-gradient-checkpointing",)),
}


@dataclasses.dataclass(frozen=True)
class FileResult:
    """One test file's run: each test's outcome, and how the process ended."""

    name: str
    defined: int  # test methods the file defines
    outcomes: dict[str, str]  # "Class.test_name" -> one of OUTCOMES
    returncode: int
    seconds: float
    last_error: str  # the last "...Error: ..." line of its output (a crash before any test, a timeout)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def _child(argv: list[str]) -> None:
    """In the test's process: record each outcome to $SUITE_RESULTS, then run the file as ``__main__``."""
    import runpy
    import unittest

    real, path, rest = argv[0] == "real", argv[1], argv[2:]
    out = open(os.environ["SUITE_RESULTS"], "a", buffering=1)

    def note(test: unittest.TestCase, outcome: str) -> None:
        test_id = test.id()
        # "module.Class.test" -> "Class.test" (the module is always __main__ here); subtests keep their test's id.
        parts = test_id.split(".")
        out.write(json.dumps({"test": ".".join(parts[-2:]) if len(parts) >= 2 else test_id, "outcome": outcome}) + "\n")

    base = unittest.TextTestResult

    class Recording(base):  # type: ignore[misc,valid-type]
        def addSuccess(self, test):
            super().addSuccess(test)
            note(test, "passed")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            note(test, "failed")

        def addError(self, test, err):
            super().addError(test, err)
            # setUpClass/tearDownClass errors arrive as a _ErrorHolder, not a TestCase.
            if isinstance(test, unittest.TestCase):
                note(test, "error")
            else:
                out.write(json.dumps({"test": str(test), "outcome": "error"}) + "\n")

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            note(test, "skipped")

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            note(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            note(test, "xpass")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                note(test, "failed")

    unittest.TextTestRunner.resultclass = Recording
    if not real:
        import spmdtorch.compat

        spmdtorch.compat.install()
    sys.argv = [path, *rest]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    runpy.run_path(path, run_name="__main__")


def defined_tests(path: Path) -> int:
    """How many ``test*`` methods the file's classes define (a file that fails at import still has them)."""
    tree = ast.parse(path.read_text())
    return sum(
        1
        for cls in tree.body
        if isinstance(cls, ast.ClassDef)
        for fn in cls.body
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and fn.name.startswith("test")
    )


def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if "Error" in ln and ":" in ln and not ln.startswith(" ")]
    return lines[-1][:300] if lines else ""


def run_file(path: Path, *, real: bool, timeout: float, python: str) -> FileResult:
    """Run one test file in a fresh process group; kill the group after ``timeout`` seconds."""
    env = dict(os.environ)
    env.update(
        PJRT_DEVICE="CPU",
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={DEVICES}",
        CPU_NUM_DEVICES=str(DEVICES),  # PyTorch/XLA's own knob for its CPU client (the --real baseline)
        # XLA's CPU client deadlocks with too few threads for many queued collectives (docs/design.md).
        NPROC=str(max(2 * DEVICES, os.cpu_count() or 1)),
    )
    setting = UPSTREAM_CI.get(path.name, Setting())
    with (
        tempfile.NamedTemporaryFile("r", suffix=".jsonl") as results,
        tempfile.TemporaryFile("w+") as log,
        tempfile.TemporaryDirectory() as tmp,
    ):
        env["SUITE_RESULTS"] = results.name
        env.update({k: v.format(tmp=tmp) for k, v in setting.env.items()})
        start = time.monotonic()
        proc = subprocess.Popen(
            [
                python,
                os.path.abspath(__file__),
                "--child",
                "real" if real else "compat",
                # The full path, as run_tests.sh passes it: files find their helpers from __file__.
                str(path.resolve()),
                *setting.args,
                "-v",
            ],
            cwd=path.parent,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        seconds = time.monotonic() - start
        outcomes: dict[str, str] = {}
        for line in results.read().splitlines():
            rec = json.loads(line)
            # A test that failed a subtest and then "passed" stays failed.
            if outcomes.get(rec["test"]) not in ("failed", "error"):
                outcomes[rec["test"]] = rec["outcome"]
        log.seek(0)
        text = log.read()
    err = _last_error(text) if rc != 0 else ""
    if rc == -signal.SIGKILL and seconds >= timeout:
        err = f"killed after {timeout:.0f} s (timeout)"
    return FileResult(path.name, defined_tests(path), outcomes, rc, seconds, err)


def _table(results: list[FileResult], baseline: dict[str, dict[str, str]] | None, markdown: bool) -> str:
    head = ["file", "defined", "ran", "passed", "failed", "errors", "skipped"]
    if baseline is not None:
        head.append("PyTorch/XLA 2.9 passed")
    rows = []
    totals: Counter[str] = Counter()
    for r in results:
        row = [
            r.name,
            str(r.defined),
            str(len(r.outcomes)),
            str(r.count("passed")),
            str(r.count("failed")),
            str(r.count("error")),
        ]
        row.append(str(r.count("skipped")))
        totals.update(defined=r.defined, tests=len(r.outcomes), passed=r.count("passed"), failed=r.count("failed"))
        totals.update(error=r.count("error"), skipped=r.count("skipped"))
        if baseline is not None:
            b = baseline.get(r.name, {})
            nb = sum(1 for o in b.values() if o == "passed")
            totals.update(baseline=nb)
            row.append(str(nb))
        rows.append(row)
    total = [
        "**total**" if markdown else "total",
        str(totals["defined"]),
        str(totals["tests"]),
        str(totals["passed"]),
        str(totals["failed"]),
    ]
    total += [str(totals["error"]), str(totals["skipped"])]
    if baseline is not None:
        total.append(str(totals["baseline"]))
    rows.append(total)
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    return "\n".join(fmt.format(*r) for r in [head, *rows])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--child":
        _child(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="a PyTorch/XLA checkout (the directory holding test/spmd)")
    parser.add_argument("--only", nargs="*", default=None, help="run only these test files")
    parser.add_argument("--real", action="store_true", help="run on the installed torch_xla instead of spmdtorch")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per file before it is killed")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run each file with")
    parser.add_argument("--json", type=Path, help="write every test's outcome here")
    parser.add_argument("--baseline", type=Path, help="a --json file of a --real run, for its pass counts")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = parser.parse_args(argv)

    spmd = args.checkout / "test" / "spmd"
    if not spmd.is_dir():
        parser.error(f"{spmd} is not a directory: pass the root of a PyTorch/XLA checkout (it holds test/spmd)")
    files = sorted(p for p in spmd.glob("test_*.py") if p.name not in NOT_TESTS)
    if args.only:
        wanted = set(args.only)
        missing = wanted - {p.name for p in files}
        if missing:
            parser.error(f"--only names files that are not in {spmd}: {sorted(missing)}")
        files = [p for p in files if p.name in wanted]
    baseline = json.loads(args.baseline.read_text())["files"] if args.baseline else None

    results = []
    for path in files:
        r = run_file(path, real=args.real, timeout=args.timeout, python=args.python)
        print(f"{r.name}: {r.count('passed')}/{len(r.outcomes)} passed in {r.seconds:.0f} s", file=sys.stderr)
        if r.last_error:
            print(f"    {r.last_error}", file=sys.stderr)
        results.append(r)
    print(_table(results, baseline, args.markdown))
    if baseline is not None:
        lost = [
            f"{r.name}::{t}"
            for r in results
            for t, o in sorted(baseline.get(r.name, {}).items())
            if o == "passed" and r.outcomes.get(t) != "passed"
        ]
        print(f"\n{len(lost)} tests PyTorch/XLA passes that spmdtorch does not:")
        for t in lost:
            print(f"  {t}")
    if args.json:
        data = {
            "runner": "real torch_xla" if args.real else "spmdtorch.compat",
            "files": {r.name: r.outcomes for r in results},
            "errors": {r.name: r.last_error for r in results if r.last_error},
        }
        args.json.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
