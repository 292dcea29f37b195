"""Float optimizer hyperparameters that a scheduler changes every step beside ``spmdtorch.compile``.

Issue 42, item 17: ``OneCycleLR`` with its defaults writes new Python floats
into AdamW's ``lr`` and ``betas`` (SGD's ``lr`` and ``momentum``) every step.
They are program inputs of the compiled step, guarded by type and by the
branches they decided, so the step settles and replays with each step's
values, and trains as eager PyTorch on the CPU does.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from training_helpers import compiled_beside_eager

import spmdtorch
from spmdtorch import debug

STEPS = 6


def _run(make_opt, make_sched, steps=STEPS, *, hook=None):
    """The compiled step beside its eager CPU twin; (compiled losses, eager losses, models)."""
    return compiled_beside_eager(make_opt, make_sched, steps, hook=hook)


def _one_cycle(opt):
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=20)  # cycle_momentum=True


def _check_equal(losses, ref_losses, model, ref):
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "make_opt",
    [
        pytest.param(lambda ps: torch.optim.AdamW(ps, lr=1e-3), id="adamw"),
        pytest.param(lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01), id="adam-l2"),
        pytest.param(lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9), id="sgd-momentum"),
    ],
)
def test_one_cycle_lr_defaults_replay_and_match_eager(make_opt):
    debug.clear_metrics()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no "changed between calls" warning either
        losses, ref_losses, model, ref = _run(make_opt, _one_cycle)
    # As with a tensor lr: AdamW's first step creates its state, two more settle the program.
    assert debug.counter_value("CompiledTrace") <= 3
    assert debug.counter_value("CompiledReplay") >= STEPS - 3
    _check_equal(losses, ref_losses, model, ref)


def test_hyperparameter_crossing_a_branch_traces_again():
    # Set by hand every step, weight_decay too (so it is an input as well),
    # until it is 0 for one step: AdamW then skips its decay (`if weight_decay
    # != 0`), a comparison the trace recorded as a guard, so that step is
    # traced again instead of replaying the decaying program; then it replays again.
    def make_opt(ps):
        return torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.01)

    def hook(i, opt, ref_opt):
        for o in (opt, ref_opt):
            g = o.param_groups[0]
            g["lr"] = 1e-3 * (i + 1)
            g["betas"] = (0.9 - 0.01 * i, 0.999)
            g["weight_decay"] = 0.0 if i == 5 else 0.01 * (i + 1)

    debug.clear_metrics()
    losses, ref_losses, model, ref = _run(make_opt, _constant_lr, 9, hook=hook)
    _check_equal(losses, ref_losses, model, ref)
    # Traced at steps 0-2 (state created, then settled), 5 (the branch), 6-7 (settled again).
    assert debug.counter_value("CompiledTrace") == 6
    assert debug.counter_value("CompiledReplay") == 3


def test_value_no_trace_saw_change_is_guarded_by_value():
    # beta2 stays fixed while the step settles, so it is not proven an input:
    # changing it later traces again (values equal eager).
    def hook(i, opt, ref_opt):
        for o in (opt, ref_opt):
            g = o.param_groups[0]
            g["lr"] = 1e-3 * (i + 1)
            g["betas"] = (0.9, 0.99 if i >= 4 else 0.999)

    debug.clear_metrics()
    losses, ref_losses, model, ref = _run(lambda ps: torch.optim.AdamW(ps, lr=1e-3), _constant_lr, 7, hook=hook)
    _check_equal(losses, ref_losses, model, ref)
    assert debug.counter_value("CompiledReplay") >= 2


def test_optimizer_outside_torch_optim_keeps_its_floats_guarded_by_value():
    # Only torch.optim's steps are known to use hyperparameters in arithmetic
    # and comparisons alone; another optimizer's step (here one branching on
    # its lr) is traced at every new value, and spmdtorch says why.
    class Clipped(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})

        @torch.no_grad()
        def step(self):
            for g in self.param_groups:
                scale = g["lr"] if g["lr"] < 5e-3 else 5e-3 + 0.1 * (g["lr"] - 5e-3)
                for p in g["params"]:
                    p.add_(p.grad, alpha=-scale)

    debug.clear_metrics()
    with pytest.warns(RuntimeWarning, match=r"Clipped hyperparameter 'lr' changed.*not torch.optim's"):
        losses, ref_losses, model, ref = _run(
            lambda ps: Clipped(ps, 1e-3), lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 + s), 8
        )
    _check_equal(losses, ref_losses, model, ref)
    assert debug.counter_value("CompiledReplay") == 0


def _constant_lr(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)


def test_number_equal_to_a_hyperparameter_by_coincidence_keeps_its_own_value():
    # The step also decays a running tensor by 0.999, the value of AdamW's
    # beta2 here: equal numbers of one op share one program input, and that
    # input is also what beta2 gave. beta2 never changes while the step
    # settles, so it is not proven an input: when it changes, the step is
    # traced again, and the decay keeps its 0.999.
    torch.manual_seed(0)
    ref = torch.nn.Linear(6, 2)
    model = copy.deepcopy(ref).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999))
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.999))
    run, ref_run = torch.ones(2, 6, device="xla"), torch.ones(2, 6)
    x = torch.randn(4, 6)
    xx = x.to("xla")

    @spmdtorch.compile
    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        run.mul_(0.999)
        return loss

    for i in range(7):
        for o in (opt, ref_opt):
            o.param_groups[0]["lr"] = 1e-3 * (i + 1)
            o.param_groups[0]["betas"] = (0.9 - 0.01 * i, 0.99 if i >= 4 else 0.999)
        step(xx)
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_run.mul_(0.999)
    torch.testing.assert_close(run.cpu(), ref_run)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_recorded_comparison_is_checked_against_new_values():
    # The guard machinery itself: a branch on a hyperparameter holds for values
    # on the same side only; arithmetic re-evaluates as Python computes it.
    from spmdtorch.programs import _hparam_inputs as hp

    rec = hp.Recording()
    leaf = ("hp", 1, 0, "lr", None)
    lr = hp.TracedFloat(1e-3, leaf, rec)
    scale = lr if lr < 5e-3 else 5e-3 + 0.1 * (lr - 5e-3)
    assert type(scale) is hp.TracedFloat and rec.recipe(1e-3) == leaf
    assert hp.guards_hold(rec.guards, {leaf: 4e-3}.__getitem__)
    assert not hp.guards_hold(rec.guards, {leaf: 6e-3}.__getitem__)
    y = 1 - lr * 0.01
    assert hp.evaluate(y.expr, {leaf: 0.3}.__getitem__) == 1 - 0.3 * 0.01
    int(lr)  # a conversion leaves the recording: lr can then never be proven
    assert rec.escaped == {leaf}
