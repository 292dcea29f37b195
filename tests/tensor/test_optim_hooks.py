"""torch optimizers take the foreach path on xla (spmdtorch.tensor.optim_hooks) and
``_foreach_*`` ops expand to the right per-tensor ops (dispatch._foreach)."""

import collections
import copy

import pytest
import torch

import spmdtorch
from spmdtorch.tensor import dispatch, optim_hooks, xla_tensor

OPTIMIZERS = {
    "sgd": lambda p, **kw: torch.optim.SGD(p, lr=0.05, momentum=0.9, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=1e-2, **kw),
    "adam_amsgrad": lambda p, **kw: torch.optim.Adam(p, lr=1e-2, amsgrad=True, **kw),
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, **kw),
    "rmsprop": lambda p, **kw: torch.optim.RMSprop(p, lr=1e-2, momentum=0.5, **kw),
}


@pytest.fixture
def counted():
    """Counts the top-level ATen calls that reach XlaTensor.__torch_dispatch__, by packet name."""
    names = collections.Counter()
    inner = xla_tensor.dispatch

    def counting(func, args, kwargs):
        names[func._schema.name.split("::")[-1]] += 1
        return inner(func, args, kwargs)

    xla_tensor.dispatch = counting  # what XlaTensor.__torch_dispatch__ calls
    try:
        yield names
    finally:
        xla_tensor.dispatch = inner


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(model, opt, steps, device):
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 6, generator=g).to(device)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        if device == "xla":
            spmdtorch.sync()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_default_step_on_xla_uses_foreach_and_matches_eager(name, counted):
    cpu = _model()
    xla = copy.deepcopy(cpu).to("xla")
    opt_cpu = OPTIMIZERS[name](cpu.parameters())
    opt_xla = OPTIMIZERS[name](xla.parameters())
    _train(cpu, opt_cpu, 4, "cpu")
    counted.clear()
    _train(xla, opt_xla, 4, "xla")

    foreach = sum(v for k, v in counted.items() if k.startswith("_foreach_"))
    assert foreach > 0, dict(counted)
    # The per-parameter loop's in-place updates never reach the dispatcher one by one.
    assert counted["addcdiv_"] + counted["add_"] + counted["lerp_"] == 0, dict(counted)
    for p_cpu, p_xla in zip(cpu.parameters(), xla.parameters()):
        torch.testing.assert_close(p_xla.detach().cpu(), p_cpu.detach(), rtol=1e-5, atol=1e-6)
    # The user's choice (None) is what the optimizer shows afterwards.
    assert [g["foreach"] for g in opt_xla.param_groups] == [None]
    assert opt_xla.state_dict()["param_groups"][0]["foreach"] is None


def test_explicit_foreach_false_keeps_the_loop(counted):
    xla = _model().to("xla")
    opt = torch.optim.Adam(xla.parameters(), lr=1e-2, foreach=False)
    _train(xla, opt, 2, "xla")
    assert not any(k.startswith("_foreach_") for k in counted), dict(counted)
    assert counted["addcdiv_"] == 2 * len(list(xla.parameters()))
    assert opt.param_groups[0]["foreach"] is False


def test_cpu_optimizer_is_left_alone(counted):
    cpu = _model()
    opt = torch.optim.Adam(cpu.parameters(), lr=1e-2)
    before = copy.deepcopy(opt.param_groups[0]["foreach"])
    _train(cpu, opt, 1, "cpu")
    assert opt.param_groups[0]["foreach"] is before is None
    assert not counted


def test_failed_step_does_not_leave_foreach_switched_on():
    p = torch.nn.Parameter(torch.ones(3, device="xla"))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.ones(3, device="xla")
    opt.param_groups[0]["lr"] = "not a number"  # the step raises inside torch's update
    with pytest.raises(TypeError):
        opt.step()
    assert opt.param_groups[0]["foreach"] is True  # the post-hook did not run
    opt.param_groups[0]["lr"] = 0.1
    opt.step()  # the next step's pre-hook restores what the failed one switched
    assert opt.param_groups[0]["foreach"] is None
    torch.testing.assert_close(p.detach().cpu(), torch.full((3,), 0.9))


def test_hooks_can_be_turned_off(counted, monkeypatch):
    monkeypatch.setattr(optim_hooks, "foreach_by_default", False)
    xla = _model().to("xla")
    _train(xla, torch.optim.SGD(xla.parameters(), lr=0.1), 1, "xla")
    assert not any(k.startswith("_foreach_") for k in counted), dict(counted)


# -- _foreach_* expansion -----------------------------------------------------------------


def _pair(*shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    cpu = [torch.randn(s, generator=g) for s in shapes]
    return cpu, [t.to("xla") for t in cpu]


SHAPES = ((3, 4), (5,), ())


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.5),
        lambda a, b, c: torch._foreach_add_(a, 2.0),
        lambda a, b, c: torch._foreach_mul_(a, [1.5, -2.0, 3.0]),
        lambda a, b, c: torch._foreach_lerp_(a, b, 0.25),
        lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.3),
        lambda a, b, c: torch._foreach_addcdiv_(a, b, [t.abs() + 1 for t in c], [0.1, 0.2, 0.3]),
        lambda a, b, c: torch._foreach_addcmul_(a, b, c, torch.tensor([0.5, -1.0, 2.0])),
        lambda a, b, c: torch._foreach_maximum_(a, b),
        lambda a, b, c: torch._foreach_div_(a, [2.0, 4.0, 8.0]),
        lambda a, b, c: torch._foreach_sqrt_([t.abs() for t in a]),
    ],
)
def test_foreach_inplace_matches_cpu(call):
    a, xa = _pair(*SHAPES, seed=0)
    b, xb = _pair(*SHAPES, seed=1)
    c, xc = _pair(*SHAPES, seed=2)
    call(a, b, c)
    call(xa, xb, xc)
    for t_cpu, t_xla in zip(a, xa):
        torch.testing.assert_close(t_xla.cpu(), t_cpu)


@pytest.mark.parametrize(
    "call",
    [
        lambda a, b: torch._foreach_add(a, b),
        lambda a, b: torch._foreach_pow(0.9, [t.abs() for t in b]),
        lambda a, b: torch._foreach_sqrt([t.abs() for t in a]),
        lambda a, b: torch._foreach_norm(a),
        lambda a, b: torch._foreach_norm(a, 1.0),
        lambda a, b: torch._foreach_maximum(a, 0.1),
        lambda a, b: torch._foreach_neg(a),
    ],
)
def test_foreach_out_of_place_matches_cpu(call):
    a, xa = _pair(*SHAPES, seed=3)
    b, xb = _pair(*SHAPES, seed=4)
    out_cpu = call(a, b)
    out_xla = call(xa, xb)
    assert len(out_xla) == len(out_cpu)
    assert len({id(_node(t)) for t in out_xla}) == 1  # one node for the three results
    for t_cpu, t_xla in zip(out_cpu, out_xla):
        assert t_xla.device.type == "xla"
        torch.testing.assert_close(t_xla.cpu(), t_cpu)


def test_foreach_length_mismatch_raises():
    _, xa = _pair((2,), (3,))
    with pytest.raises(dispatch.ForeachError, match="same length"):
        dispatch.dispatch(torch.ops.aten._foreach_mul_.ScalarList, (xa, [1.0, 2.0, 3.0]), {})


def _node(t):
    from spmdtorch.tensor.dispatch import read_value

    return read_value(t).node


def test_inplace_foreach_over_independent_tensors_is_one_node():
    a, xa = _pair(*SHAPES, seed=5)
    b, xb = _pair(*SHAPES, seed=6)
    torch._foreach_addcmul_(a, b, b, 0.5)
    torch._foreach_addcmul_(xa, xb, xb, 0.5)
    assert len({id(_node(t)) for t in xa}) == 1  # one node for the three updates
    for t_cpu, t_xla in zip(a, xa):
        torch.testing.assert_close(t_xla.cpu(), t_cpu)


@pytest.mark.parametrize(
    "make",
    [
        lambda ts: ([ts[0], ts[0]], [ts[1], ts[2][0]]),  # one tensor twice: written twice, in order
        lambda ts: ([ts[0], ts[1]], [ts[1], ts[0]]),  # each reads the other's self: order matters
        lambda ts: ([ts[2][0], ts[2][1]], [ts[0][:1], ts[1][:1]]),  # two views of one storage
    ],
    ids=["repeated", "cross-read", "views"],
)
def test_inplace_foreach_with_aliasing_keeps_sequential_order(make):
    cpu, xla = _pair((2, 3), (2, 3), (2, 1, 3), seed=7)
    cpu_self, cpu_other = make(cpu)
    xla_self, xla_other = make(xla)
    torch._foreach_add_(cpu_self, cpu_other, alpha=2.0)
    torch._foreach_add_(xla_self, xla_other, alpha=2.0)
    for t_cpu, t_xla in zip(cpu, xla):
        torch.testing.assert_close(t_xla.cpu(), t_cpu)


def test_equal_updates_of_equal_fresh_values_stay_mergeable():
    """AdamW's per-parameter step counters: equal values updated alike stay one buffer, not one per parameter."""
    steps = [torch.zeros((), device="xla") for _ in range(4)]  # pending, made alike
    torch._foreach_add_(steps, 1.0)
    assert len({id(_node(t)) for t in steps}) == 4  # separate nodes, which the plan merges
    spmdtorch.sync()
    assert len({id(t._st.value) for t in steps}) == 1 and steps[0].item() == 1.0
