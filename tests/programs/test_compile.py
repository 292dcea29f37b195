"""spmdtorch.compile: replay, captured mutations, contract errors, guards."""

import copy
import warnings

import pytest
import torch
from training_helpers import compiled_beside_eager

import spmdtorch
from spmdtorch import debug


def test_replay_runs_without_tracing_the_body():
    w = torch.zeros(3, device="xla")
    calls = []

    @spmdtorch.compile
    def step(x):
        calls.append(1)
        w.add_(x)
        return w.sum() * 2

    for _ in range(6):
        out = step(torch.ones(3, device="xla"))
    assert len(calls) <= 3
    assert out.item() == 36.0
    torch.testing.assert_close(w.cpu(), torch.full((3,), 6.0))


def test_new_input_signature_traces_again():
    @spmdtorch.compile
    def f(x):
        return (x * 2).sum()

    assert f(torch.ones(3, device="xla")).item() == 6.0
    assert f(torch.ones(5, device="xla")).item() == 10.0
    assert f(torch.ones(3)).item() == 6.0  # CPU arguments are moved to xla


def test_outputs_are_fresh_tensors_each_call():
    @spmdtorch.compile
    def f(x):
        return x + 1

    outs = [f(torch.full((2,), float(i), device="xla")) for i in range(5)]
    assert [o.cpu().tolist() for o in outs] == [[i + 1.0] * 2 for i in range(5)]


def test_returning_an_input_or_state_aliases_it():
    state = torch.zeros(2, device="xla")

    @spmdtorch.compile
    def f(x):
        state.add_(x)
        return x, state

    for _ in range(5):
        x = torch.full((2,), 1.0, device="xla")
        a, s = f(x)
        assert a is not None and a.cpu().tolist() == [1.0, 1.0]
    s.add_(100)
    assert state.cpu().tolist() == [105.0, 105.0]


@pytest.mark.parametrize(
    "body",
    [
        lambda x: x.sum().item(),
        lambda x: bool(x.sum() > 0),
        lambda x: print(x),
        lambda x: spmdtorch.sync(),
        lambda x: torch.nonzero(x),
    ],
)
def test_contract_violation_raises_clear_error(body):
    @spmdtorch.compile
    def f(x):
        y = x * 2
        body(y)
        return y

    with pytest.raises(spmdtorch.CompileContractError, match="must not depend on tensor values"):
        f(torch.ones(3, device="xla"))


def _compiled_square_loss_step(model, opt):
    """``spmdtorch.compile`` of the usual step: ``zero_grad()`` first, the squared output as the loss."""

    @spmdtorch.compile
    def step(x):
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        return loss

    return step


@pytest.mark.filterwarnings("ignore:.*changed between calls:RuntimeWarning")
def test_changing_learning_rate_is_not_silently_frozen():
    model = torch.nn.Linear(4, 1, bias=False).to("xla")
    ref = torch.nn.Linear(4, 1, bias=False)
    ref.weight.data.copy_(model.weight.cpu())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.1)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=3, gamma=0.1)
    x = torch.randn(2, 4)

    step = _compiled_square_loss_step(model, opt)

    for _ in range(10):
        step(x)
        sched.step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
        ref_sched.step()
    torch.testing.assert_close(model.weight.cpu(), ref.weight.detach(), rtol=1e-5, atol=1e-6)


def test_random_ops_draw_fresh_numbers_each_replay():
    @spmdtorch.compile
    def f(x):
        return x + torch.rand(4, device="xla")

    vals = [tuple(f(torch.zeros(4, device="xla")).cpu().tolist()) for _ in range(6)]
    assert len(set(vals)) == 6
    assert debug.counter_value("CompiledReplay") > 0


def test_gradients_zeroed_outside_fn_are_never_lost():
    """zero_grad() (set_to_none) between calls drops the grad fn created: trace again, never write it nowhere."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    ref = torch.nn.Linear(4, 3)
    ref.load_state_dict(lin.state_dict())
    lin = lin.to("xla")

    @spmdtorch.compile
    def step(x):
        lin(x).square().sum().backward()

    with pytest.warns(RuntimeWarning, match="zero_grad"):
        for i in range(4):
            x = torch.randn(2, 4) + i
            lin.zero_grad()  # outside fn: p.grad = None before every call
            step(x.to("xla"))
            ref.zero_grad()
            ref(x).square().sum().backward()
            assert lin.weight.grad is not None, f"call {i}: the gradient was lost"
            torch.testing.assert_close(lin.weight.grad.cpu(), ref.weight.grad, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(lin.bias.grad.cpu(), ref.bias.grad, rtol=1e-5, atol=1e-6)


def test_state_made_from_a_sharded_tensor_keeps_its_devices(devices8):
    """zeros_like(p) of an FSDP-sharded parameter used as p.grad, then a compiled step (it raised)."""
    import numpy as np

    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import FSDPv2

    model = FSDPv2(torch.nn.Linear(16, 32, bias=False), mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    spmdtorch.sync()
    assert len(model.weight.grad._st.value.sharding.device_set) == 8  # not device 0 alone

    @spmdtorch.compile
    def step(x):
        model.zero_grad(set_to_none=False)
        model(x).sum().backward()

    x = torch.randn(8, 16)
    for _ in range(3):
        step(x.to("xla"))
    want = torch.ones(8, 32).t() @ x  # d sum(x W^T) / dW
    torch.testing.assert_close(model.weight.grad.cpu(), want, rtol=1e-5, atol=1e-5)


def _adamw_setup():
    """An eager reference MLP, its xla copy with AdamW, the input, and the compiled step."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to("xla")
    x = torch.randn(5, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    @spmdtorch.compile
    def step(inp):
        opt.zero_grad()
        loss = model(inp).square().mean()
        loss.backward()
        opt.step()
        return loss

    return ref, model, opt, x, step


def _eager_adamw(ref, x, steps, tweak=None):
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for i in range(steps):
        if tweak is not None:
            tweak(i, opt)
        opt.zero_grad()
        ref(x).square().mean().backward()
        opt.step()
    return ref


def test_adamw_step_counters_share_one_input():
    """torch's AdamW keeps a step counter per parameter; they are equal, so the
    program reads (and computes the bias corrections from) one array."""
    ref, model, opt, x, step = _adamw_setup()
    xx = x.to("xla")
    for _ in range(6):
        step(xx)
    assert debug.counter_value("CompiledReplay") > 0
    steps = [opt.state[p]["step"] for p in model.parameters()]
    from spmdtorch.tensor.dispatch import read_value

    assert len({id(read_value(s)) for s in steps}) == 1
    assert [s.item() for s in steps] == [6.0] * len(steps)
    _eager_adamw(ref, x, 6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)


def test_changing_one_shared_step_counter_outside_fn_is_not_ignored():
    ref, model, opt, x, step = _adamw_setup()
    xx = x.to("xla")
    first = next(iter(model.parameters()))

    def tweak(i, o):  # the same change on the eager side, to the first parameter only
        if i == 4:
            o.state[next(iter(o.param_groups[0]["params"]))]["step"].fill_(100.0)

    for i in range(7):
        if i == 4:
            with torch.no_grad():
                opt.state[first]["step"].fill_(100.0)
        step(xx)
    _eager_adamw(ref, x, 7, tweak)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
    assert opt.state[first]["step"].item() == 103.0


class _TrainEval(torch.nn.Module):
    """Computes differently in training and in eval mode (as dropout and BatchNorm do)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if self.training else y


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_model_eval_between_calls_is_not_silently_ignored():
    torch.manual_seed(0)
    ref = _TrainEval()
    model = copy.deepcopy(ref).to("xla")
    calls = []

    @spmdtorch.compile
    def forward(x):
        calls.append(1)
        return model(x)

    x = torch.randn(2, 4)
    for mode in ("train", "eval", "train", "eval", "train", "eval"):
        for m in (ref, model):
            getattr(m, mode)()
        for _ in range(3):
            torch.testing.assert_close(forward(x.to("xla")).cpu(), ref(x), msg=mode)
    # Each mode traced until stable once (at most 3 calls), then replayed on every switch.
    assert len(calls) <= 6
    replays = debug.counter_value("CompiledReplay")
    model.train()
    forward(x.to("xla"))
    model.lin.eval()  # a submodule's flag counts too
    torch.testing.assert_close(forward(x.to("xla")).cpu(), ref.train().lin.eval()(x) * 2)
    assert debug.counter_value("CompiledReplay") == replays + 1


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_freezing_a_layer_between_calls_is_not_silently_ignored():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    model = copy.deepcopy(ref).to("xla")
    x = torch.randn(8, 4)

    def make_step(m, opt):
        def step(x):
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            return loss

        return step

    eager = make_step(ref, torch.optim.SGD(ref.parameters(), lr=0.1))
    compiled = spmdtorch.compile(make_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    for frozen in (False, False, False, True, True, True, False, False):
        for m in (ref, model):
            m[0].weight.requires_grad_(not frozen)  # fine-tuning: freeze, then unfreeze
        torch.testing.assert_close(compiled(x.to("xla")).cpu(), eager(x))
        for got, want in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(got.detach().cpu(), want.detach(), msg=f"frozen={frozen}")


def test_hooks_added_between_calls_are_not_silently_ignored():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model = copy.deepcopy(ref).to("xla")
    f = spmdtorch.compile(lambda x: model(x))
    x = torch.randn(3, 4)

    def check():
        for _ in range(3):
            torch.testing.assert_close(f(x.to("xla")).cpu(), ref(x))

    check()
    handles = [m[0].register_forward_hook(lambda mod, args, out: out.relu()) for m in (ref, model)]
    check()  # the hook is part of the program now
    for h in handles:
        h.remove()
    check()
    handles = [torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: out * 2)]
    try:
        check()  # a global hook, on every module called
    finally:
        handles[0].remove()
    check()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_a_forward_under_grad_mode_replays_and_returns_no_history():
    # What autograd saves for a backward fn never runs (the first layer's output)
    # is not state fn keeps: the step replays from the third call on.
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).to("xla")
    f = spmdtorch.compile(lambda x: model(x))
    x = torch.ones(3, 4, device="xla")
    replays = debug.counter_value("CompiledReplay")
    outs = [f(x) for _ in range(6)]
    assert debug.counter_value("CompiledReplay") - replays == 4
    assert all(o.grad_fn is None and not o.requires_grad for o in outs)  # traced or replayed alike
    torch.testing.assert_close(outs[-1].cpu(), model(x).detach().cpu())


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.scale = 2.0

    def forward(self, x):
        return self.lin(x) * self.scale


def test_a_module_attribute_changed_between_calls_is_not_silently_frozen():
    torch.manual_seed(0)
    ref = _Scaled()
    model = copy.deepcopy(ref).to("xla")
    f = spmdtorch.compile(lambda x: model(x))
    x = torch.randn(2, 4)
    for scale in (2.0, 0.5, -0.0, 0.0, 2.0):
        ref.scale = model.scale = scale
        for _ in range(3):
            torch.testing.assert_close(f(x.to("xla")).cpu(), ref(x))
            assert torch.equal(torch.signbit(f(x.to("xla")).cpu()), torch.signbit(ref(x)))


class _Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_an_attribute_fn_changes_every_call_traces_every_call_and_says_so():
    model = _Counting().to("xla")
    f = spmdtorch.compile(lambda x: model(x))
    x = torch.ones(2, 4, device="xla")
    with pytest.warns(RuntimeWarning, match=r"changes the attribute\(s\) 'calls' of a _Counting it calls") as rec:
        for _ in range(5):
            f(x)
    assert model.calls == 5  # traced each call: the side effect happened every time, as in eager
    assert len([w for w in rec if "changes the attribute" in str(w.message)]) == 1


def test_grad_mode_and_autocast_are_part_of_the_signature():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)
    model = copy.deepcopy(lin).to("xla")
    f = spmdtorch.compile(lambda x: model(x))
    x = torch.randn(2, 4)
    for _ in range(3):
        assert f(x.to("xla")).dtype == torch.float32
    with torch.autocast("xla", dtype=torch.bfloat16):
        y = f(x.to("xla"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu(), want)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x.to("xla")).cpu(), lin(x))
    assert f(x.to("xla")).dtype == torch.float32


def test_signed_zero_argument_traces_again():
    """``fn(x, -0.0)`` after ``fn(x, 0.0)``: equal in Python, not to ``copysign``."""
    import math

    @spmdtorch.compile
    def f(x, s):
        return x * math.copysign(1.0, s)

    x = torch.ones(3).to("xla")
    assert f(x, 0.0).cpu().tolist() == [1.0, 1.0, 1.0]
    assert f(x, -0.0).cpu().tolist() == [-1.0, -1.0, -1.0]


def test_nested_and_keyword_arguments_replay_and_keep_their_structure():
    """Flat positional calls take a fast path past torch's pytree; nested and
    keyword arguments take the general one, and the two are different signatures."""

    @spmdtorch.compile
    def f(x, scale=1.0, pair=None):
        out = x * scale
        if pair is not None:
            out = out + pair["a"] - pair["b"][0]
        return out

    x = torch.arange(4.0)
    xx = x.to("xla")
    pair = {"a": torch.ones(4), "b": [torch.full((4,), 2.0)]}
    pair_x = {"a": pair["a"].to("xla"), "b": [pair["b"][0].to("xla")]}
    for _ in range(4):  # traced twice, then replayed
        torch.testing.assert_close(f(xx).cpu(), x)
        torch.testing.assert_close(f(xx, 2.0).cpu(), x * 2)  # a positional non-tensor leaf
        torch.testing.assert_close(f(xx, 3.0, pair=pair_x).cpu(), x * 3 + 1 - 2)
        torch.testing.assert_close(f(xx, 3.0, pair_x).cpu(), x * 3 + 1 - 2)  # nested, positional
    assert debug.counter_value("CompiledReplay") > 0


def test_host_made_constants_replay():
    """A table built on the host inside ``fn`` and copied to the device is the same
    constant on every trace: ``fn`` must reach replays, not trace forever."""

    @spmdtorch.compile
    def f(x):
        table = torch.arange(4.0).cos().to("xla")  # a new array every trace, the same values
        return x * table

    x = torch.ones(4)
    xx = x.to("xla")
    replays = debug.counter_value("CompiledReplay")
    for _ in range(5):
        torch.testing.assert_close(f(xx).cpu(), x * torch.arange(4.0).cos())
    assert debug.counter_value("CompiledReplay") - replays >= 2


def test_host_made_constant_that_changes_is_not_replayed_stale():
    """A host constant whose values differ between calls must not be frozen at the first one."""
    values = iter(range(100))

    @spmdtorch.compile
    def f(x):
        return x + torch.tensor(float(next(values))).to("xla")

    xx = torch.zeros(2).to("xla")
    for i in range(5):
        assert f(xx).cpu().tolist() == [float(i), float(i)]


def _adamw_lambda_lr_run(lr, steps=8):
    """Train a small model for ``steps`` compiled steps under a LambdaLR schedule; eager CPU twin beside it."""
    _, _, model, ref = compiled_beside_eager(
        lambda ps: torch.optim.AdamW(ps, lr=lr),
        lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + s)),
        steps,
        make_ref_opt=lambda ps: torch.optim.AdamW(ps, lr=1e-2),
        zero_grad_first=True,
    )
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_float_learning_rate_schedule_replays_without_a_warning():
    # A float lr that a scheduler changes is a program input, as a tensor lr
    # is (issue 42, item 17; tests/programs/test_compile_hparams.py): no warning, replays.
    debug.clear_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _adamw_lambda_lr_run(1e-2)
    assert debug.counter_value("CompiledReplay") >= 5


def test_tensor_learning_rate_schedule_replays_and_matches_eager():
    debug.clear_metrics()
    _adamw_lambda_lr_run(torch.tensor(1e-2, device="xla"))
    # The first calls trace (AdamW's state appears on the first); the rest replay.
    assert debug.counter_value("CompiledReplay") >= 5


def test_a_returned_state_tensor_replaced_between_calls_runs_the_step_once():
    """The replay checks what it will return before running: a re-trace after running ran the step twice."""
    counter = torch.zeros((), device="xla")
    holder = {"out": torch.ones(2, device="xla")}

    @spmdtorch.compile
    def step():
        counter.add_(1)
        return holder["out"]

    for _ in range(4):
        step()
    assert debug.counter_value("CompiledReplay") > 0
    holder["out"] = torch.full((2,), 7.0, device="xla")  # the storage step returned dies
    out = step()
    assert out.cpu().tolist() == [7.0, 7.0]
    assert counter.item() == 5.0


def _one_cycle_run(cycle_momentum, steps=6):
    """AdamW with a tensor lr under OneCycleLR, compiled, beside its eager CPU twin; the losses of both."""
    losses, ref_losses, _, _ = compiled_beside_eager(
        lambda ps: torch.optim.AdamW(ps, lr=torch.tensor(1e-3, device="xla")),
        lambda opt: torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=1e-2, total_steps=20, cycle_momentum=cycle_momentum
        ),
        steps,
        make_ref_opt=lambda ps: torch.optim.AdamW(ps, lr=1e-3),
    )
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)


def test_one_cycle_lr_with_a_tensor_lr_replays_when_momentum_is_not_cycled():
    # Issue 42 item 17: OneCycleLR beside a compiled step. With a tensor lr and
    # cycle_momentum=False the step settles after AdamW's first two steps and replays.
    debug.clear_metrics()
    _one_cycle_run(cycle_momentum=False)
    assert debug.counter_value("CompiledTrace") <= 3 and debug.counter_value("CompiledReplay") >= 3


def test_one_cycle_lr_cycling_momentum_replays_too():
    # OneCycleLR's default also cycles AdamW's betas as new Python floats each
    # step: they are program inputs as well (tests/programs/test_compile_hparams.py).
    debug.clear_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        _one_cycle_run(cycle_momentum=True)
    assert debug.counter_value("CompiledTrace") <= 3 and debug.counter_value("CompiledReplay") >= 3


@pytest.mark.filterwarnings("ignore:.*changed between calls:RuntimeWarning")
def test_float_learning_rate_schedule_stops_baking_after_one_more_compile():
    """Python numbers are compiled in as constants until two traces of one program differ in them; then
    they are inputs, so a float LR schedule compiles as many programs for 12 steps as for 4."""
    compiles = []
    for steps in (4, 12):
        debug.clear_caches()
        debug.clear_metrics()
        _adamw_lambda_lr_run(1e-2, steps=steps)  # matches eager, step by step
        assert debug.counter_value("CompiledScalarsLifted") == 1
        compiles.append(debug.counter_value("UncachedCompile"))
    assert compiles[0] == compiles[1]


def test_numbers_are_baked_into_a_stable_program():
    """A stable step's Python numbers (AdamW's betas, eps, lr) are constants of its program, not inputs."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 2)
    model = copy.deepcopy(ref).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    x = torch.randn(3, 4)
    xx = x.to("xla")

    step = _compiled_square_loss_step(model, opt)

    debug.clear_metrics()
    for _ in range(5):
        step(xx)
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    assert debug.counter_value("CompiledReplay") >= 2
    assert debug.counter_value("CompiledScalarsLifted") == 0
    (entry,) = step._entries.values()
    layout = entry.stable[-1].prog.layout
    assert layout.constants and not layout.groups  # baked numbers; no packed vector argument
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_module_attribute_changed_every_call_lifts_its_number():
    """A module attribute the program reads as a number, changed between calls: one more program, then
    every value reuses it (and each call computes with its own value)."""

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.s = 0.5

        def forward(self, x):
            return x * self.s

    m = Scale()
    f = spmdtorch.compile(lambda x: m(x))
    x = torch.arange(4.0)
    xx = x.to("xla")
    debug.clear_metrics()
    for i in range(8):
        m.s = 0.5 + i
        torch.testing.assert_close(f(xx).cpu(), x * m.s, rtol=0, atol=0)
    assert debug.counter_value("CompiledScalarsLifted") == 1
    assert debug.counter_value("UncachedCompile") == 3  # 0.5 and 1.5 baked, then one program for all


def _counted_step():
    """A compiled ``x * i + lr`` summed, with a parameter updated in place (and its eager twin)."""
    w = torch.zeros(3, device="xla")

    def body(x, i, lr):
        w.add_(x * i)
        return (w + lr).sum()

    return spmdtorch.compile(body), w


def test_a_number_argument_changing_every_call_warns_once_and_computes_each_value():
    """A step counter passed as a Python int is part of the signature (fn may branch
    on it), so each value compiles: say so once, with the fix, and never freeze it."""
    f, w = _counted_step()
    x = torch.ones(3, device="xla")
    total = 0.0
    with pytest.warns(
        RuntimeWarning, match=r"argument 1 \(int: 0, 1, 2, 3\).*torch.tensor\(step, device='xla'\)"
    ) as rec:
        for i in range(6):
            total += 3 * i
            assert f(x, i, 0.5).item() == pytest.approx(total + 1.5)
    assert sum("Python number arguments" in str(m.message) for m in rec) == 1
    torch.testing.assert_close(w.cpu(), torch.full((3,), total / 3))


def test_a_keyword_number_argument_is_named_by_its_leaf():
    f, _ = _counted_step()
    x = torch.ones(3, device="xla")
    with pytest.warns(RuntimeWarning, match=r"leaf 2 \(float: 0.0, 0.5, 1.0, 1.5\) of the flattened arguments"):
        for k in range(4):
            assert f(x, 1, lr=0.5 * k).item() == pytest.approx(3 * (k + 1) + 3 * 0.5 * k)


def test_the_fix_a_0d_tensor_argument_replays():
    f, w = _counted_step()
    x = torch.ones(3, device="xla")
    debug.clear_metrics()
    total = 0.0
    for i in range(6):
        total += 3 * i
        assert f(x, torch.tensor(float(i), device="xla"), 0.5).item() == pytest.approx(total + 1.5)
    assert debug.counter_value("CompiledReplay") >= 3
    assert debug.counter_value("CompiledTrace") <= 3


def test_a_number_argument_with_a_few_values_replays_each_without_a_warning(recwarn):
    """A flag or a mode passed as a number (two values, alternating) is what the signature is for."""
    f, _ = _counted_step()
    x = torch.ones(3, device="xla")
    debug.clear_metrics()
    for i in range(10):
        f(x, i % 2, 0.5)
    assert debug.counter_value("CompiledReplay") >= 6
    assert not [m for m in recwarn if "Python number arguments" in str(m.message)]


@pytest.fixture
def compile_cache_of_3(monkeypatch):
    from spmdtorch import config

    monkeypatch.setenv("SPMDTORCH_COMPILE_CACHE_SIZE", "3")
    config.reload()
    yield 3
    monkeypatch.delenv("SPMDTORCH_COMPILE_CACHE_SIZE")
    config.reload()


def test_input_signatures_kept_are_bounded_least_recently_used_first(compile_cache_of_3):
    """Each signature holds compiled programs: a number argument taking a new value
    every call must not keep them all. The least recently used goes first."""
    f, _ = _counted_step()
    x = torch.ones(3, device="xla")
    debug.clear_metrics()
    with pytest.warns(RuntimeWarning, match="Python number arguments"):
        for i in range(6):
            f(x, i, 0.5)
            f(x, 0, 0.5)  # kept in use
    assert len(f._entries) == 3
    assert debug.counter_value("CompiledSignatureEvictions") == 3
    sigs = [sig[-2][2] for sig in f._entries]  # each kept signature's value of i
    assert sorted(sigs) == [0, 4, 5]
