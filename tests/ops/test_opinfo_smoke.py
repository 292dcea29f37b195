"""PyTorch's OpInfo samples for ~20 representative ops, through spmdtorch vs eager CPU.

Runs the harness of ``tools/opinfo_report.py`` in-process (every sample of each
entry, float32, forward; OpInfo tolerances) and asserts each entry passes.
The full database is covered by the report tool (docs/opinfo_coverage.md).
"""

from __future__ import annotations

import importlib.util
import pathlib
import warnings

import pytest
import torch

_TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "opinfo_report.py"
_spec = importlib.util.spec_from_file_location("opinfo_report", _TOOL)
opinfo_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(opinfo_report)

ENTRIES = [
    "add", "mul", "div.no_rounding_mode", "exp", "matmul", "addmm", "bmm", "softmax",
    "nn.functional.layer_norm", "nn.functional.cross_entropy", "nn.functional.conv1d",
    "index_select", "scatter_add", "gather", "cumsum", "sort", "where", "sum", "amax",
    "mean", "cat", "transpose", "nn.functional.gelu", "nn.functional.linear",
]


@pytest.fixture(scope="module")
def op_by_name():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return {opinfo_report.entry_name(op): op for op in op_db}


@pytest.mark.parametrize("name", ENTRIES)
def test_opinfo_entry_passes(name, op_by_name):
    import spmdtorch  # noqa: F401

    rec = opinfo_report.run_entry(op_by_name[name], torch.float32, sample_timeout=30)
    assert rec["samples"] > 0
    assert rec["status"] == "pass", (rec["reason"], rec.get("failures", [])[:3])
    assert rec["passed"] + rec["eager_error"] == rec["samples"]


def test_failure_is_reported_not_skipped(op_by_name):
    """A sample that errors is a failure with its reason (here: a bogus op)."""
    import spmdtorch  # noqa: F401

    op = op_by_name["add"]

    class Broken:
        def __getattr__(self, k):
            return getattr(op, k)

        def __call__(self, x, *a, **k):
            if x.device.type == "xla":
                raise NotImplementedError("no lowering for aten.fake.default")
            return op(x, *a, **k)

    rec = opinfo_report.run_entry(Broken(), torch.float32, sample_timeout=30)
    assert rec["status"] == "fail"
    assert rec["failed"] == rec["samples"] > 0
    assert rec["reason"] == "NotImplementedError: no lowering for aten.fake.default"
    assert opinfo_report.category(rec) == "missing lowering"
