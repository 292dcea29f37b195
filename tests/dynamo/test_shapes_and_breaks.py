"""Dynamic shapes and ``fullgraph=True`` under ``torch.compile(fn, backend="spmdtorch")``, against eager CPU.

Dynamic shapes: Dynamo keeps one graph for every size (``dynamic=True`` or a
``mark_dynamic`` dim); the engine compiles one XLA program per concrete shape
(no padding), reused when a shape comes back. ``fullgraph=True`` raises torch's
own ``Unsupported`` at a graph break, as it does on CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import spmdtorch
import spmdtorch.dynamo
from spmdtorch import debug


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _xla_compiles() -> int:
    return debug.counter_value("UncachedCompile")


def test_mark_dynamic_keeps_one_graph_and_compiles_one_program_per_concrete_shape():
    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter)
    compiles = []
    for batch in (3, 5, 7, 5, 3):
        x = torch.randn(batch, 8)
        xx = x.to("xla")
        torch._dynamo.mark_dynamic(xx, 0)
        spmdtorch.sync()  # the upload is not the compiled call's
        before = _xla_compiles()
        out = fast(xx).cpu()  # the graph's ops joined the lazy program: computed here
        compiles.append(_xla_compiles() - before)
        torch.testing.assert_close(out, cpu(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1  # one Dynamo graph, symbolic in the batch
    assert compiles == [1, 1, 1, 0, 0]  # one XLA program per new concrete batch, reused after


def test_dynamic_true_graph_is_symbolic_and_values_match_eager():
    recorded = []

    def backend(gm, example_inputs):
        recorded.append([n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"])
        return spmdtorch.dynamo.backend(gm, example_inputs)

    def fn(a):
        return torch.softmax(a, dim=-1) * a.shape[0]

    fast = torch.compile(fn, backend=backend, dynamic=True)
    for n in (2, 3, 4):
        x = torch.randn(n, n + 1)
        torch.testing.assert_close(fast(x.to("xla")).cpu(), torch.softmax(x, dim=-1) * n)
    assert len(recorded) == 1
    sizes = [v for v in recorded[0] if isinstance(v, torch.Tensor)][0].shape
    assert all(isinstance(s, torch.SymInt) for s in sizes)


@pytest.mark.parametrize("device", ["cpu", "xla"])
def test_fullgraph_with_an_explicit_graph_break_raises_torchs_unsupported(device):
    def fn(a):
        b = a + 1
        torch._dynamo.graph_break()
        return b * 2

    fast = torch.compile(fn, backend="spmdtorch", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported, match="graph_break"):
        fast(torch.ones(3).to(device))


@pytest.mark.parametrize("device", ["cpu", "xla"])
def test_fullgraph_with_data_dependent_branch_raises_as_on_cpu(device):
    def fn(a):
        if a.sum() > 0:
            return a * 2
        return a - 1

    fast = torch.compile(fn, backend="spmdtorch", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        fast(torch.ones(3).to(device))


def test_without_fullgraph_a_data_dependent_branch_breaks_and_runs_lazily():
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")

    def fn(a):
        b = torch.cos(a)
        if b.sum() > 0:
            return b * 2
        return b - 1

    fast = torch.compile(fn, backend=counter)
    for x in (torch.zeros(3), torch.full((3,), 3.0)):
        expected = fn(x)
        torch.testing.assert_close(fast(x.to("xla")).cpu(), expected)
    assert counter.frame_count >= 2  # the graph before the branch, then each branch taken


def test_fullgraph_without_a_break_compiles_one_graph():
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    xla = _mlp().to("xla")
    fast = torch.compile(xla, backend=counter, fullgraph=True)
    x = torch.randn(2, 8)
    torch.testing.assert_close(fast(x.to("xla")).cpu(), xla.cpu()(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
