"""torch.set_float32_matmul_precision is built into the programs (spmdtorch/lazy/_precision.py).

On CPU the three settings compute the same float32 products; what these
tests can check here is that the setting reaches XLA's ``precision``
attribute and that changing it builds a new program instead of reusing one
(lazy and compiled). tests/accelerator/ checks the numbers on a GPU.
"""

from __future__ import annotations

import pytest
import torch

import spmdtorch
from spmdtorch import debug


@pytest.fixture
def precision():
    """Sets torch's float32 matmul precision for one test, restoring it after."""
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _hlo_precision(setting: str) -> str:
    a = torch.randn(8, 8).to("xla")
    b = torch.randn(8, 8).to("xla")
    torch.set_float32_matmul_precision(setting)
    text = debug.get_stablehlo([a @ b])
    return next(line for line in text.splitlines() if "dot_general" in line)


@pytest.mark.parametrize(("setting", "xla"), [("highest", "HIGHEST"), ("high", "HIGH"), ("medium", "DEFAULT")])
def test_setting_reaches_the_dot(precision, setting, xla):
    assert f"precision = [{xla}, {xla}]" in _hlo_precision(setting)


def test_lazy_change_compiles_new_program(precision):
    x = torch.randn(16, 16)
    w = torch.randn(16, 16)
    xd, wd = x.to("xla"), w.to("xla")
    expected = (x @ w).tanh()
    results = {}
    for setting in ("highest", "medium", "highest"):
        precision(setting)
        before = debug.counter_value("UncachedCompile")
        results.setdefault(setting, []).append((xd @ wd).tanh().cpu())
        results[setting].append(debug.counter_value("UncachedCompile") - before)
    # highest: compiled; medium: a new program (not the cached highest one);
    # highest again: the cached one.
    assert results["highest"][1] == 1 and results["medium"][1] == 1 and results["highest"][3] == 0
    for got in (results["highest"][0], results["medium"][0], results["highest"][2]):
        torch.testing.assert_close(got, expected)  # a CPU computes float32 at every setting


def test_compiled_change_retraces(precision):
    w = torch.randn(16, 16).to("xla")

    @spmdtorch.compile
    def f(x):
        return x @ w

    x = torch.randn(4, 16).to("xla")
    precision("highest")
    for _ in range(4):  # traces until two agree, then replays
        f(x)
    assert debug.counter_value("CompiledReplay") > 0
    precision("medium")
    traces = debug.counter_value("CompiledTrace")
    f(x)
    assert debug.counter_value("CompiledTrace") == traces + 1  # not a replay of the "highest" program
    torch.testing.assert_close(f(x).cpu(), x.cpu() @ w.cpu())


def test_recompile_log_names_the_precision(precision, caplog):
    debug.clear_caches()  # no program of an earlier test may be reused
    a = torch.randn(7, 5).to("xla")
    b = torch.randn(5, 3).to("xla")
    spmdtorch.sync()
    precision("highest")
    (a @ b).cpu()
    precision("high")
    with caplog.at_level("INFO", logger="spmdtorch.compile"):
        (a @ b).cpu()
    assert "float32 matmul precision changed: highest -> high" in caplog.text, caplog.text
