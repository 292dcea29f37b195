"""spmdtorch.debug: metrics report, counters, HLO of the pending graph."""

import torch

import spmdtorch
from spmdtorch import debug


def test_metrics_report_lists_compiles_executions_transfers():
    x = torch.randn(4, 4).to("xla")
    (x @ x).sum().item()
    report = debug.metrics_report()
    for name in ("CompileTime", "ExecuteTime", "UncachedCompile", "TransferToDevice", "TransferFromDevice"):
        assert name in report
    assert debug.counter_value("ExecuteCount") >= 1
    assert debug.metric_data("CompileTime")[0] >= 1
    assert debug.counter_value("NoSuchCounter") == 0


def test_cache_hits_are_counted():
    before = debug.counter_value("CachedCompile")
    for _ in range(3):
        (torch.ones(7, device="xla") * 3).sum().item()
    assert debug.counter_value("CachedCompile") >= before + 2


def test_hlo_text_of_pending_graph():
    x = torch.ones(4, 4, device="xla")
    spmdtorch.sync()
    y = torch.tanh(x @ x)
    hlo = debug.get_hlo_text([y])
    assert "HloModule" in hlo and "tanh" in hlo and "dot" in hlo
    shlo = debug.get_stablehlo([y])
    assert "stablehlo" in shlo and "func.func" in shlo
    # inspecting does not execute
    assert debug.get_hlo_text([x]) == ""
