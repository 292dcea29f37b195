"""A captured graph replays as one node per call (``spmdtorch.assume_pure`` of the graph), checked against eager CPU.

Graphs assume_pure refuses (an input updated in place, random numbers, an
output aliasing an input) are recorded op by op, with eager's semantics.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo

import spmdtorch
import spmdtorch.dynamo
from spmdtorch import debug


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    debug.clear_counters()
    yield
    torch._dynamo.reset()


def _deep(layers: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(16, 16), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def _forward_ops(fn, x) -> int:
    spmdtorch.sync()
    before = debug.counter_value("DispatchedOps")
    fn(x)
    ops = debug.counter_value("DispatchedOps") - before
    spmdtorch.sync()
    return ops


def test_a_replayed_graph_records_one_node_whatever_its_depth():
    x = torch.randn(4, 16).to("xla")
    for layers in (2, 8):
        xla = _deep(layers).to("xla")
        fast = torch.compile(xla, backend="spmdtorch")
        fast(x)  # the first call records the graph once (assume_pure's recording), then runs it
        assert _forward_ops(xla, x) >= 2 * layers  # lazy: every op of every layer
        assert _forward_ops(fast, x) <= 1  # replay: one node
        torch._dynamo.reset()
    assert debug.counter_value("DynamoGraphsRecorded") == 0


def test_replayed_forward_and_backward_match_eager_cpu_over_steps():
    cpu = _deep(3)
    xla = copy.deepcopy(cpu).to("xla")
    fast = torch.compile(xla, backend="spmdtorch")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1)
    opt_xla = torch.optim.SGD(xla.parameters(), lr=0.1)
    for _ in range(3):
        x = torch.randn(4, 16)
        for model, opt, inp in ((cpu, opt_cpu, x), (fast, opt_xla, x.to("xla"))):
            opt.zero_grad()
            model(inp).square().mean().backward()
            opt.step()
        spmdtorch.sync()
    for p, q in zip(xla.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)
    assert debug.counter_value("DynamoGraphReplays") == 3


def test_graph_updating_an_input_in_place_is_recorded_op_by_op():
    def fn(a, b):
        a.add_(b)
        return a * 2

    x, y = torch.randn(4), torch.randn(4)
    xx = x.to("xla")
    fast = torch.compile(fn, backend="spmdtorch")
    for _ in range(2):
        out = fast(xx, y.to("xla"))
        x.add_(y)
        torch.testing.assert_close(out.cpu(), x * 2)
    torch.testing.assert_close(xx.cpu(), x)  # both updates landed
    assert debug.counter_value("DynamoGraphsRecorded") == 1
    assert debug.counter_value("DynamoGraphReplays") == 0


def test_output_that_is_a_view_of_an_input_keeps_the_alias():
    def fn(a):
        return a.view(-1)[:3], a.sum()

    x = torch.arange(6.0).reshape(2, 3)
    xx = x.to("xla")
    fast = torch.compile(fn, backend="spmdtorch")
    for _ in range(2):
        view, total = fast(xx)
        view.mul_(10)  # writes through to the input, as in eager
        v, t = fn(x)
        v.mul_(10)
        torch.testing.assert_close(total.cpu(), t)
    torch.testing.assert_close(xx.cpu(), x)
    assert debug.counter_value("DynamoGraphReplays") == 0


def test_random_graph_draws_fresh_numbers_every_call():
    fast = torch.compile(lambda a: torch.nn.functional.dropout(a, 0.5, training=True), backend="spmdtorch")
    x = torch.ones(256).to("xla")
    first, second = fast(x).cpu(), fast(x).cpu()
    assert not torch.equal(first, second)
    for out in (first, second):
        assert set(out.unique().tolist()) <= {0.0, 2.0}
    assert debug.counter_value("DynamoGraphReplays") == 0
