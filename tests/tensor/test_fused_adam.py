"""Adam/AdamW steps on xla tensors take torch's fused path and record one node
(spmdtorch.tensor.optim_hooks + spmdtorch.tensor.dispatch._fused_adam)."""

import copy

import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.tensor import optim_hooks
from spmdtorch.tensor.dispatch import read_value

OPTIMIZERS = {
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=1e-2, **kw),
    "adam_l2_amsgrad_maximize": lambda p, **kw: torch.optim.Adam(
        p, lr=1e-2, weight_decay=0.05, amsgrad=True, maximize=True, **kw
    ),
    "adamw_no_decay_amsgrad": lambda p, **kw: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0, amsgrad=True, **kw),
}


class _Mixed(torch.nn.Module):
    """Parameters of several shapes (a 0-d and a 3-d one among them) and, optionally, two dtypes."""

    def __init__(self, width: int = 6, low: torch.dtype | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(width, 4)
        self.cube = torch.nn.Parameter(torch.randn(2, 3, 4) * 0.1)
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.low = None if low is None else torch.nn.Linear(4, 4).to(low)

    def forward(self, x):
        y = self.lin(x) * self.scale + self.cube.sum()
        if self.low is not None:
            y = y + self.low(y.to(self.low.weight.dtype)).float()
        return y


def _train(model, opt, steps, device, lrs=None):
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        if lrs is not None:
            for group in opt.param_groups:
                group["lr"] = lrs[i]
        x = torch.randn(5, model.lin.in_features, generator=g).to(device)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if device == "xla":
            spmdtorch.sync()


def _state(model, opt):
    tensors = [p.detach() for p in model.parameters()]
    tensors += [v for s in opt.state.values() for k, v in sorted(s.items()) if k != "step"]
    return [t.cpu() for t in tensors]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_step_matches_eager_cpu(name):
    cpu = _Mixed()
    xla = copy.deepcopy(cpu).to("xla")
    opt_cpu, opt_xla = OPTIMIZERS[name](cpu.parameters()), OPTIMIZERS[name](xla.parameters())
    fused0 = debug.counter_value("FusedOptimizerSteps")
    _train(cpu, opt_cpu, 4, "cpu")
    _train(xla, opt_xla, 4, "xla")
    # The first step creates the state (torch refuses fused=True for xla there): foreach; then fused.
    assert debug.counter_value("FusedOptimizerSteps") - fused0 == 3
    for t_xla, t_cpu in zip(_state(xla, opt_xla), _state(cpu, opt_cpu)):
        torch.testing.assert_close(t_xla, t_cpu, rtol=1e-5, atol=1e-6)
    # What the user chose (None) is what the optimizer shows afterwards.
    assert [(g["fused"], g["foreach"]) for g in opt_xla.param_groups] == [(None, None)]
    assert opt_xla.state_dict()["param_groups"][0]["fused"] is None
    assert all(s["step"].device.type == "cpu" and s["step"].item() == 4 for s in opt_xla.state.values())


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fused_step_equals_the_foreach_path_bit_for_bit_over_mixed_dtypes(name, monkeypatch):
    base = _Mixed(low=torch.bfloat16)
    results = []
    for fused in (True, False):
        monkeypatch.setattr(optim_hooks, "fused_adam_by_default", fused)
        xla = copy.deepcopy(base).to("xla")
        opt = OPTIMIZERS[name](xla.parameters())
        fused0 = debug.counter_value("FusedOptimizerSteps")
        _train(xla, opt, 4, "xla")
        # torch groups the tensors by dtype: one fused call per dtype per step.
        assert debug.counter_value("FusedOptimizerSteps") - fused0 == (6 if fused else 0)
        results.append(_state(xla, opt))
    assert {t.dtype for t in results[0]} == {torch.float32, torch.bfloat16}
    for a, b in zip(*results):
        assert torch.equal(a, b)


def _ops_in_step(n_layers):
    """(ATen ops dispatched by the second AdamW step, nodes giving the parameters' new values, parameters)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(n_layers))).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):  # the first step creates the state (foreach), the second is fused
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        ops = debug.counter_value("DispatchedOps")
        opt.step()
        ops = debug.counter_value("DispatchedOps") - ops
        written = {id(read_value(p).node) for p in model.parameters()}
        spmdtorch.sync()
    return ops, written, len(list(model.parameters()))


def test_recorded_ops_and_nodes_per_step_do_not_grow_with_the_parameter_count():
    few = _ops_in_step(2)
    many = _ops_in_step(12)
    assert many[2] > few[2] + 15
    assert few[0] == many[0] == 1  # one _fused_adamw_ call
    assert len(few[1]) == len(many[1]) == 1  # every parameter's new value comes from one node


def test_changing_learning_rate_does_not_recompile():
    cpu = _Mixed()
    xla = copy.deepcopy(cpu).to("xla")
    opt_cpu, opt = torch.optim.AdamW(cpu.parameters(), lr=1e-2), torch.optim.AdamW(xla.parameters(), lr=1e-2)
    _train(cpu, opt_cpu, 3, "cpu")
    _train(xla, opt, 3, "xla")
    compiles = debug.counter_value("UncachedCompile")
    lrs = [5e-3, 2e-3, 1e-3]
    _train(cpu, opt_cpu, 3, "cpu", lrs=lrs)
    _train(xla, opt, 3, "xla", lrs=lrs)
    assert debug.counter_value("UncachedCompile") == compiles
    for p_xla, p_cpu in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_xla.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False), id="user_foreach_false"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True), id="user_foreach_true"),
        pytest.param(lambda p: torch.optim.AdamW(p, lr=torch.tensor(1e-2), foreach=False), id="tensor_lr"),
        pytest.param(lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9), id="sgd"),
        pytest.param(lambda p: type("MyAdam", (torch.optim.Adam,), {})(p, lr=1e-2), id="adam_subclass"),
    ],
)
def test_other_optimizers_and_user_choices_keep_their_path(make):
    cpu = _Mixed()
    xla = copy.deepcopy(cpu).to("xla")
    opt_cpu, opt_xla = make(cpu.parameters()), make(xla.parameters())
    before = [(g["foreach"], g.get("fused")) for g in opt_xla.param_groups]
    fused0 = debug.counter_value("FusedOptimizerSteps")
    _train(cpu, opt_cpu, 3, "cpu")
    _train(xla, opt_xla, 3, "xla")
    assert debug.counter_value("FusedOptimizerSteps") == fused0
    assert [(g["foreach"], g.get("fused")) for g in opt_xla.param_groups] == before
    for p_xla, p_cpu in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p_xla.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)


def test_complex_parameters_keep_the_foreach_path():
    torch.manual_seed(0)
    cpu = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    xla = torch.nn.Parameter(cpu.detach().to("xla"))
    opt_cpu, opt_xla = torch.optim.Adam([cpu], lr=0.1), torch.optim.Adam([xla], lr=0.1)
    fused0 = debug.counter_value("FusedOptimizerSteps")
    for _ in range(3):
        for p, opt in ((cpu, opt_cpu), (xla, opt_xla)):
            opt.zero_grad()
            (p * p.conj()).real.sum().backward()
            opt.step()
        spmdtorch.sync()
    assert debug.counter_value("FusedOptimizerSteps") == fused0
    torch.testing.assert_close(xla.detach().cpu(), cpu.detach(), rtol=1e-5, atol=1e-6)


def test_grad_scale_is_refused_by_name():
    p = [torch.ones(3, device="xla")]
    g = [torch.full((3,), 0.5, device="xla")]
    m, v = [torch.zeros(3, device="xla")], [torch.zeros(3, device="xla")]
    steps = [torch.tensor(1.0)]
    with pytest.raises(NotImplementedError, match="_fused_adamw_"):
        torch._fused_adamw_(
            p, g, m, v, [], steps, lr=0.1, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8,
            amsgrad=False, maximize=False, grad_scale=torch.tensor(2.0, device="xla"),
        )  # fmt: skip


def test_direct_fused_call_matches_cpu_kernel():
    g = torch.Generator().manual_seed(3)
    shapes = [(3, 4), (5,), ()]
    cpu = [[torch.randn(s, generator=g) for s in shapes] for _ in range(3)]
    cpu[2] = [t.abs() for t in cpu[2]]  # exp_avg_sqs are >= 0
    xla = [[t.to("xla") for t in lst] for lst in cpu]
    grads = [torch.randn(s, generator=g) for s in shapes]
    for (p, m, v), gr in ((cpu, grads), (xla, [t.to("xla") for t in grads])):
        steps = [torch.tensor(3.0) for _ in shapes]
        kw = dict(lr=0.01, beta1=0.9, beta2=0.999, weight_decay=0.1, eps=1e-8, amsgrad=False, maximize=False)
        torch._fused_adamw_(p, gr, m, v, [], steps, **kw)
    spmdtorch.sync()
    for lst_xla, lst_cpu in zip(xla, cpu):
        for t_xla, t_cpu in zip(lst_xla, lst_cpu):
            torch.testing.assert_close(t_xla.cpu(), t_cpu, rtol=1e-5, atol=1e-6)


def test_compiled_model_lazy_step_takes_the_fused_path():
    """The loop issue 46 times: the model under torch.compile, the step (AdamW included) lazy."""
    cpu = _Mixed()
    xla = copy.deepcopy(cpu).to("xla")
    fast = torch.compile(xla, backend="spmdtorch")
    opt_cpu, opt_xla = OPTIMIZERS["adamw"](cpu.parameters()), OPTIMIZERS["adamw"](xla.parameters())
    fused0 = debug.counter_value("FusedOptimizerSteps")
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(5, 6, generator=g)
        for model, opt, xx in ((cpu, opt_cpu, x), (fast, opt_xla, x.to("xla"))):
            opt.zero_grad()
            model(xx).pow(2).mean().backward()
            opt.step()
        spmdtorch.sync()
    assert debug.counter_value("FusedOptimizerSteps") - fused0 == 3
    for t_xla, t_cpu in zip(_state(xla, opt_xla), _state(cpu, opt_cpu)):
        torch.testing.assert_close(t_xla, t_cpu, rtol=1e-5, atol=1e-6)


def test_parameters_sharing_one_storage_take_the_foreach_ops(monkeypatch):
    """Views of one buffer as parameters: one node cannot write a storage twice; the foreach ops can."""
    from spmdtorch.tensor.dispatch import _fused_adam

    fallbacks = []
    inner = _fused_adam._foreach_step
    monkeypatch.setattr(_fused_adam, "_foreach_step", lambda a, decoupled: fallbacks.append(1) or inner(a, decoupled))
    buf = torch.randn(10, generator=torch.Generator().manual_seed(4))
    results = []
    for device in ("cpu", "xla"):
        base = buf.clone().to(device)
        params = [torch.nn.Parameter(base[:4]), torch.nn.Parameter(base[4:])]
        if device == "xla":
            assert params[0]._st is params[1]._st
        opt = torch.optim.AdamW(params, lr=0.1, weight_decay=0.1)
        fused0 = debug.counter_value("FusedOptimizerSteps")
        for step in range(3):
            for p in params:
                p.grad = torch.full_like(p, 0.5 + step)
            opt.step()
            if device == "xla":
                spmdtorch.sync()
        assert debug.counter_value("FusedOptimizerSteps") == fused0  # no one-node step
        results.append([p.detach().cpu() for p in params] + [base.cpu()])
    assert len(fallbacks) == 2  # the fused call from the second step on, computed by the foreach ops
    for t_xla, t_cpu in zip(results[1], results[0]):
        torch.testing.assert_close(t_xla, t_cpu, rtol=1e-5, atol=1e-6)
