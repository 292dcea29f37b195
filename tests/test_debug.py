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


def _train_steps(inspect, device, steps=3):
    import numpy as np

    from spmdtorch.mesh import Mesh
    from spmdtorch.sharding import mark_sharding

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    xs = [torch.randn(8, 4, 16) for _ in range(steps)]
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mesh = Mesh(np.arange(8), (8,), ("d",)) if device == "xla" else None
    losses = []
    for x in xs:
        y = model(x.to(device))
        if mesh is not None:
            mark_sharding(y, mesh, ("d", None, None))  # a user mesh: replicated inputs get re-homed onto it
        loss = y.sum()
        if inspect is not None:
            inspect([loss])
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device == "xla":
            spmdtorch.sync()
        losses.append(loss.item())
    return losses, model.weight.detach().cpu()


def test_inspecting_a_step_mid_way_changes_nothing_and_crashes_nothing():
    # Issue 42 item 14: get_hlo_text in the middle of a step used to re-home the
    # graph's replicated inputs onto the user's mesh for real; the step then
    # passed one buffer twice and donated it (XLA: "Attempt to donate a buffer
    # which is also used by the same call to Execute()"; SIGSEGV).
    cpu_losses, cpu_weight = _train_steps(None, "cpu")
    for inspect in (
        debug.get_hlo_text,
        lambda ts: debug.get_hlo_text(ts, optimized=True),
        debug.get_stablehlo,
        debug.lower_graph,
        None,
    ):
        losses, weight = _train_steps(inspect, "xla")
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(weight, cpu_weight, rtol=1e-4, atol=1e-4)
