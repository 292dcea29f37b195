"""Training with ``torch.compile(..., backend="spmdtorch")`` against eager CPU: values, counts, recompiles.

The backend's graphs join the lazy program, so a compiled model's forward, the
backward and the optimizer step are one XLA program per step: a loop compiles
exactly what the same loop compiles in plain lazy mode, and Dynamo traces once.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
import torch._dynamo
import torch._dynamo.testing
from training_helpers import assert_adamw_params_close

import spmdtorch
import spmdtorch.dynamo
from spmdtorch import config, debug
from spmdtorch.fsdp import FSDPv2, MixedPrecision
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import get_sharding_spec, mark_sharding

STEPS = 5
LR = 1e-2


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mesh() -> Mesh:
    return Mesh(np.arange(8), (8,), ("fsdp",))


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


class _Block(torch.nn.Module):
    """A pre-norm transformer block (attention + MLP), small."""

    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        # No qkv bias (as Llama): the key bias's gradient is zero in exact arithmetic (softmax ignores a
        # shift of all scores), and AdamW turns its rounding noise into steps of up to lr.
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim, bias=False), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.head = torch.nn.Linear(dim, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, d))
        x = x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))
        return self.head(x.mean(1))


def _block() -> torch.nn.Module:
    torch.manual_seed(0)
    return _Block()


def _batches(make_x):
    torch.manual_seed(1)
    return [(make_x(), torch.randn(8, 8)) for _ in range(STEPS)]


def _train_eager_cpu(model, batches, mp: MixedPrecision | None):
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        out = mp.run(model, (x,), {}) if mp is not None else model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _train_xla(model, batches, *, compiled: bool, whole_step: bool = False):
    """Train on xla: batch sharded over "fsdp", targets unsharded. Returns losses, per-step compiles, Dynamo frames."""
    mesh = _mesh()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")

    def step(m, o, x, y):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x).float(), y)
        loss.backward()
        o.step()
        return loss

    if compiled and whole_step:
        run = torch.compile(step, backend=counter)
        fwd = model
    else:
        run = step
        fwd = torch.compile(model, backend=counter) if compiled else model
    losses, compiles, executions = [], [], []
    for x, y in batches:
        xx = mark_sharding(x.to("xla"), mesh, ("fsdp",) + (None,) * (x.dim() - 1))
        yy = y.to("xla")
        spmdtorch.sync()  # uploads are not the step's
        c0, e0 = debug.counter_value("UncachedCompile"), debug.counter_value("ExecuteCount")
        loss = run(fwd, opt, xx, yy)
        spmdtorch.sync()
        compiles.append(debug.counter_value("UncachedCompile") - c0)
        executions.append(debug.counter_value("ExecuteCount") - e0)
        losses.append(loss.item())
    return losses, compiles, executions, counter.frame_count


@pytest.mark.parametrize("make", [_mlp, _block], ids=["mlp", "transformer_block"])
def test_compiled_fsdpv2_model_trains_like_eager_with_the_compiles_of_lazy_mode(make):
    shape = (8, 16) if make is _mlp else (8, 4, 16)
    batches = _batches(lambda: torch.randn(*shape))
    cpu = make()
    expected = _train_eager_cpu(cpu, batches, None)

    debug.clear_caches()
    model = FSDPv2(make(), mesh=_mesh())
    specs = [get_sharding_spec(p) for p in model.parameters()]
    losses, compiles, executions, frames = _train_xla(model, batches, compiled=True)
    lazy_losses, lazy_compiles, _, _ = _train_xla(FSDPv2(make(), mesh=_mesh()), batches, compiled=False)

    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-5)
    assert_adamw_params_close(
        {n.removeprefix("_orig_module."): p for n, p in model.module.named_parameters()}, cpu, lr=LR, steps=STEPS
    )
    assert frames == 1  # one Dynamo trace for the five steps
    assert executions == [1] * STEPS  # forward, backward and AdamW: one program per step
    # The first step, AdamW's first update with state, then none: as plain lazy mode compiles the loop.
    assert compiles[0] == 1 and compiles[1] <= 1 and compiles[2:] == [0] * (STEPS - 2)
    assert sum(lazy_compiles) <= 2 and lazy_compiles[2:] == [0] * (STEPS - 2)
    np.testing.assert_allclose(lazy_losses, losses, rtol=1e-5, atol=1e-6)
    # The parameters kept FSDPv2's sharding through five compiled steps.
    assert [get_sharding_spec(p) for p in model.parameters()] == specs
    assert all("devices=" in spec for spec in specs)


def test_compiled_model_with_mixed_precision_trains_like_eager_mixed_precision():
    batches = _batches(lambda: torch.randn(8, 16))
    mp = MixedPrecision(param_dtype=torch.bfloat16)
    cpu = _mlp()
    expected = _train_eager_cpu(cpu, batches, mp)
    model = FSDPv2(_mlp(), mesh=_mesh(), mixed_precision=mp)
    losses, compiles, executions, frames = _train_xla(model, batches, compiled=True)
    # bfloat16 forward: XLA's and torch's CPU kernels round differently.
    np.testing.assert_allclose(losses, expected, rtol=2e-2, atol=1e-3)
    for (name, p), q in zip(model.module.named_parameters(), cpu.parameters(), strict=True):
        assert p.dtype == torch.float32, name  # float32 master weights
        # AdamW normalises each gradient: where a bfloat16 gradient is near zero, rounding can flip an
        # element's step (up to lr each); a wrong update would move most elements.
        diff = (p.detach().cpu() - q.detach()).abs()
        assert int((diff > 2e-3).sum()) <= diff.numel() // 100, (name, diff.max().item())
        assert diff.max().item() <= LR * STEPS, name
    assert frames == 1
    assert executions == [1] * STEPS
    assert compiles[2:] == [0] * (STEPS - 2)


def test_whole_step_with_optimizer_compiled_trains_like_eager():
    batches = _batches(lambda: torch.randn(8, 16))
    cpu = _mlp()
    expected = _train_eager_cpu(cpu, batches, None)
    model = FSDPv2(_mlp(), mesh=_mesh())
    losses, compiles, executions, frames = _train_xla(model, batches, compiled=True, whole_step=True)
    np.testing.assert_allclose(losses, expected, rtol=1e-4, atol=1e-5)
    assert_adamw_params_close(
        {n.removeprefix("_orig_module."): p for n, p in model.module.named_parameters()}, cpu, lr=LR, steps=STEPS
    )
    # Dynamo breaks the step at loss.backward() (as it does on CPU without compiled autograd): the graph
    # before it and the graph after it (zero_grad's work folded in, AdamW's update) are the step's two frames.
    assert frames == 2
    assert executions == [1] * STEPS
    assert compiles[2:] == [0] * (STEPS - 2)


def test_stateless_optimizer_loop_is_one_trace_and_one_xla_compile():
    mesh = _mesh()
    model = FSDPv2(_mlp(), mesh=mesh)
    cpu = _mlp()
    opt, opt_cpu = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(cpu.parameters(), lr=0.1)
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(model, backend=counter)
    debug.clear_counters()
    for x, y in _batches(lambda: torch.randn(8, 16)):
        xx, yy = mark_sharding(x.to("xla"), mesh, ("fsdp", None)), y.to("xla")  # a sharded and an unsharded input
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(fast(xx), yy)
        loss.backward()
        opt.step()
        spmdtorch.sync()
        opt_cpu.zero_grad()
        want = torch.nn.functional.mse_loss(cpu(x), y)
        want.backward()
        opt_cpu.step()
        torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    assert counter.frame_count == 1
    assert debug.counter_value("DynamoGraphs") == 1
    assert debug.counter_value("UncachedCompile") == 1  # uploads included: nothing else was compiled
    assert debug.counter_value("DynamoRecompiles") == 0


def test_a_new_input_sharding_is_no_guard_failure_and_compiles_one_program_per_layout():
    # Dynamo guards shapes, dtypes and Python state, not layouts: a sharding Dynamo has not seen
    # re-uses the graph, and only the engine compiles (once per layout, cached like any lazy step).
    mesh = _mesh()
    cpu = _mlp()
    model = copy.deepcopy(cpu).to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    fast = torch.compile(model, backend=counter)
    debug.clear_counters()
    compiles = []
    for spec in [("fsdp", None), (None, "fsdp"), None, ("fsdp", None), (None, "fsdp")]:
        x = torch.randn(8, 16)
        xx = x.to("xla") if spec is None else mark_sharding(x.to("xla"), mesh, spec)
        before = debug.counter_value("UncachedCompile")
        out = fast(xx)
        spmdtorch.sync()
        compiles.append(debug.counter_value("UncachedCompile") - before)
        torch.testing.assert_close(out.cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1
    assert debug.counter_value("DynamoRecompiles") == 0
    assert all(c >= 1 for c in compiles[:3]), compiles  # three layouts, three programs
    assert compiles[3:] == [0, 0]  # a layout seen before: the engine's cached program


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 8)
        self.scale = 2  # a Python int the graph bakes in: Dynamo guards on it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@pytest.fixture
def log_recompiles_env(monkeypatch):
    """``SPMDTORCH_LOG_RECOMPILES`` as each test sets it, re-read by spmdtorch.config, then restored."""
    yield monkeypatch
    monkeypatch.undo()
    config.reload()


def test_recompiles_happen_only_where_a_guard_fails_and_are_logged_naming_it(log_recompiles_env, caplog):
    log_recompiles_env.setenv("SPMDTORCH_LOG_RECOMPILES", "1")
    config.reload()
    torch.manual_seed(0)
    cpu = _Scaled()
    model = copy.deepcopy(cpu).to("xla")
    fast = torch.compile(model, backend="spmdtorch", dynamic=False)
    debug.clear_counters()
    with caplog.at_level(logging.WARNING, logger="spmdtorch.compile"):
        for _ in range(3):
            fast(torch.randn(4, 16).to("xla"))
        assert debug.counter_value("DynamoRecompiles") == 0
        assert not [r for r in caplog.records if "Dynamo guard failed" in r.getMessage()]
        fast(torch.randn(6, 16).to("xla"))  # a new batch size: the size guard fails
        model.scale = cpu.scale = 3  # the Python int's guard fails
        x = torch.randn(6, 16)
        out = fast(x.to("xla"))
        fast(torch.randn(6, 16).to("xla"))  # nothing changed: no recompile
    torch.testing.assert_close(out.cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    lines = [r.getMessage() for r in caplog.records if "Dynamo guard failed" in r.getMessage()]
    assert debug.counter_value("DynamoRecompiles") == 2
    assert len(lines) == 2, lines
    assert "size mismatch at index 0. expected 4, actual 6" in lines[0]
    assert "scale" in lines[1] and "2" in lines[1]


def test_recompiles_are_counted_but_not_logged_without_the_knob(log_recompiles_env, caplog):
    log_recompiles_env.delenv("SPMDTORCH_LOG_RECOMPILES", raising=False)
    config.reload()
    fast = torch.compile(lambda a: a * 2, backend="spmdtorch", dynamic=False)
    debug.clear_counters()
    with caplog.at_level(logging.WARNING, logger="spmdtorch.compile"):
        fast(torch.ones(2).to("xla"))
        fast(torch.ones(3).to("xla"))
    assert debug.counter_value("DynamoRecompiles") == 1
    assert not [r for r in caplog.records if "Dynamo guard failed" in r.getMessage()]


def test_a_torch_without_the_recompile_hook_is_named_once_when_logging_is_asked(log_recompiles_env, caplog):
    log_recompiles_env.setenv("SPMDTORCH_LOG_RECOMPILES", "1")
    config.reload()
    log_recompiles_env.setattr(spmdtorch.dynamo, "_RECOMPILE_HOOK", False)
    log_recompiles_env.setattr(spmdtorch.dynamo, "_NO_HOOK_WARNED", False)
    with caplog.at_level(logging.WARNING, logger="spmdtorch.compile"):
        torch.compile(lambda a: a * 2, backend="spmdtorch")(torch.ones(2).to("xla"))
        torch.compile(lambda a: a * 3, backend="spmdtorch")(torch.ones(2).to("xla"))
    lines = [r.getMessage() for r in caplog.records if "get_and_maybe_log_recompilation_reasons" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "TORCH_LOGS=recompiles" in lines[0] and torch.__version__ in lines[0]


def test_compiled_model_with_a_checkpoint_module_layer_matches_eager_values_and_gradients():
    from spmdtorch.fsdp import checkpoint_module

    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    xla[0] = checkpoint_module(xla[0])
    fast = torch.compile(xla, backend="spmdtorch")
    for _ in range(2):
        x = torch.randn(4, 16)
        for m in (cpu, xla):
            m.zero_grad()
        out = fast(x.to("xla"))
        out.square().sum().backward()
        want = cpu(x)
        want.square().sum().backward()
        torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)
        for p, q in zip(xla.parameters(), cpu.parameters(), strict=True):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-5)
