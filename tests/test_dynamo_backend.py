"""``torch.compile(..., backend="spmdtorch")`` on xla tensors, checked against eager PyTorch on CPU."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import spmdtorch
import spmdtorch.dynamo
from spmdtorch.mesh import get_1d_mesh
from spmdtorch.sharding import get_sharding_spec, mark_sharding

SHARDED_8 = "{devices=[8]0,1,2,3,4,5,6,7}"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class _GraphRecorder:
    """A backend that keeps each captured graph, then hands it to ``backend="spmdtorch"``."""

    def __init__(self) -> None:
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return spmdtorch.dynamo.backend(gm, example_inputs)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


def test_backend_is_found_by_name():
    assert "spmdtorch" in torch._dynamo.list_backends()
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend("spmdtorch") is spmdtorch.dynamo.backend


def test_values_and_grads_match_eager_cpu_and_shardings_are_kept():
    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    mesh = get_1d_mesh("x")
    mark_sharding(xla[0].weight, mesh, ("x", None))
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter)

    x = torch.randn(4, 16)
    out = fast(x.to("xla"))
    out.pow(2).sum().backward()
    expected = cpu(x)
    expected.pow(2).sum().backward()

    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    for p_xla, p_cpu in zip(xla.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p_xla.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-5)
    # The parameter keeps its sharding through the compiled call and backward.
    assert get_sharding_spec(xla[0].weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert get_sharding_spec(xla[0].weight.grad) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert counter.frame_count == 1


def test_second_call_with_same_shapes_does_not_retrace():
    xla = _mlp().to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter)
    x1, x2 = torch.randn(4, 16), torch.randn(4, 16)
    fast(x1.to("xla"))
    out2 = fast(x2.to("xla"))
    assert counter.frame_count == 1
    torch.testing.assert_close(out2.cpu(), xla.cpu()(x2), rtol=1e-5, atol=1e-5)


def test_new_input_sharding_does_not_retrace_and_is_honoured():
    xla = _mlp().to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter)
    x = torch.randn(8, 16)
    plain = fast(x.to("xla")).cpu()
    xs = mark_sharding(x.to("xla"), get_1d_mesh("x"), ("x", None))
    sharded = fast(xs)
    spmdtorch.sync()  # the graph joined the lazy program: its shardings are known once computed
    assert counter.frame_count == 1
    assert get_sharding_spec(sharded) == "{devices=[8,1]0,1,2,3,4,5,6,7}"  # batch-sharded in, batch-sharded out
    torch.testing.assert_close(sharded.cpu(), plain, rtol=1e-5, atol=1e-5)


def test_mark_sharding_inside_the_graph_is_one_op_and_applied():
    mesh = get_1d_mesh("x")

    def fn(a):
        b = torch.sin(a) * 3
        mark_sharding(b, mesh, ("x", None))
        return b + 1, b

    recorder = _GraphRecorder()
    out, b = torch.compile(fn, backend=recorder)(torch.arange(16.0).reshape(8, 2).to("xla"))
    assert len(recorder.graphs) == 1  # no graph break at mark_sharding
    targets = [n.target for n in recorder.graphs[0].graph.nodes if n.op == "call_function"]
    op = torch.ops.spmdtorch.mark_sharding_
    assert sum(t in (op, op.default) for t in targets) == 1
    assert get_sharding_spec(b) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(out.cpu(), torch.sin(torch.arange(16.0).reshape(8, 2)) * 3 + 1)


def test_graph_break_runs_the_break_lazily_and_resumes():
    recorder = _GraphRecorder()
    seen = []

    def fn(a):
        b = a * 2
        seen.append(1)  # Python side effect Dynamo replays, not a graph break
        torch._dynamo.graph_break()
        return torch.cos(b) + 1

    x = torch.linspace(-1, 1, 8)
    out = torch.compile(fn, backend=recorder)(x.to("xla"))
    assert len(recorder.graphs) == 2
    assert seen == [1]
    torch.testing.assert_close(out.cpu(), torch.cos(x * 2) + 1)


def test_tensors_created_in_the_graph_land_on_xla():
    def fn(a):
        return a + torch.ones(a.shape, device=a.device) + torch.arange(a.shape[0], device=a.device)

    x = torch.randn(4)
    out = torch.compile(fn, backend="spmdtorch")(x.to("xla"))
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), x + 1 + torch.arange(4))


def test_cpu_graph_runs_as_plain_torch():
    out = torch.compile(lambda a: a * 2 + 1, backend="spmdtorch")(torch.ones(3))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, torch.full((3,), 3.0))


def test_import_spmdtorch_does_not_import_dynamo():
    code = "import sys, spmdtorch; print('torch._dynamo' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip() == "False"


def test_aot_function_with_mark_sharding_with_gradients_matches_eager_cpu():
    from functorch.compile import aot_function, make_boxed_func

    from spmdtorch.sharding import mark_sharding_with_gradients

    mesh = get_1d_mesh("x")
    graphs: list[torch.fx.GraphModule] = []

    def compiler(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm)

    def fn(a):
        return mark_sharding_with_gradients(torch.sin(a), mesh, ("x",)) * 3

    x = torch.linspace(-2, 2, 8)
    xx = x.to("xla").requires_grad_(True)
    out = aot_function(fn, compiler)(xx)
    out.square().sum().backward()
    xc = x.clone().requires_grad_(True)
    (torch.sin(xc) * 3).square().sum().backward()

    torch.testing.assert_close(out.cpu(), torch.sin(x) * 3)
    torch.testing.assert_close(xx.grad.cpu(), xc.grad)
    assert get_sharding_spec(out) == SHARDED_8
    assert get_sharding_spec(xx.grad) == SHARDED_8
    assert len(graphs) == 2  # forward and backward, each with the annotation as an op
    for gm in graphs:
        targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
        assert torch.ops.spmdtorch.sharded_copy.default in targets


def test_compiled_mark_sharding_with_gradients_shards_value_and_gradient():
    from spmdtorch.sharding import mark_sharding_with_gradients

    mesh = get_1d_mesh("x")

    def fn(a):
        return mark_sharding_with_gradients(a * 2, mesh, ("x", None)).cos()

    recorder = _GraphRecorder()
    x = torch.randn(8, 4)
    xx = x.to("xla").requires_grad_(True)
    out = torch.compile(fn, backend=recorder)(xx)
    out.sum().backward()
    xc = x.clone().requires_grad_(True)
    (xc * 2).cos().sum().backward()
    assert len(recorder.graphs) == 1
    torch.testing.assert_close(out.cpu(), (x * 2).cos())
    torch.testing.assert_close(xx.grad.cpu(), xc.grad)
    assert get_sharding_spec(xx.grad) == "{devices=[8,1]0,1,2,3,4,5,6,7}"


@pytest.mark.parametrize("dynamic", [False, None])
def test_new_shape_fails_a_guard_and_retraces(dynamic):
    xla = _mlp().to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter, dynamic=dynamic)
    cpu = copy.deepcopy(xla).cpu()
    for batch in (4, 6, 6):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(fast(x.to("xla")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 2  # the first shape, then the second (static or, by default, dynamic batch)


def test_dynamic_true_keeps_one_graph_for_every_batch():
    xla = _mlp().to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(xla, backend=counter, dynamic=True)
    cpu = copy.deepcopy(xla).cpu()
    for batch in (4, 6, 9):
        x = torch.randn(batch, 16)
        torch.testing.assert_close(fast(x.to("xla")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1


def test_compiled_training_step_with_optimizer_trains_like_eager_cpu():
    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=0.1, momentum=0.9)
    opt_xla = torch.optim.SGD(xla.parameters(), lr=0.1, momentum=0.9)

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = torch.compile(step, backend="spmdtorch")
    for _ in range(3):
        x, y = torch.randn(4, 16), torch.randn(4, 8)
        expected = step(cpu, opt_cpu, x, y)
        got = compiled(xla, opt_xla, x.to("xla"), y.to("xla"))
        torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
    for p_xla, p_cpu in zip(xla.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p_xla.cpu(), p_cpu, rtol=1e-5, atol=1e-6)
