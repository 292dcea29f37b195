"""Helpers shared by the training-parity tests (importable: tests/ is on sys.path)."""


def train_eager(model, opt, batches, loss_fn):
    """Train ``model`` eagerly on CPU; return the loss of every step as floats."""
    losses = []
    for b in batches:
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def assert_adamw_params_close(got, ref_model, *, lr, steps, atol=3e-4, rtol=1e-5):
    """Every parameter of ``ref_model`` as ``got[name]`` after ``steps`` AdamW steps.

    ``got`` maps each of ``ref_model``'s parameter names to the trained tensor
    (on any device). Adam divides by sqrt(v): for an element whose gradient is
    near zero, a float32 rounding difference in that gradient (XLA's CPU
    kernels vs torch's, or a partitioned matmul summing in another order;
    both round differently on different CPUs) changes m/sqrt(v) itself, by up
    to ~1 per step, so such an element may end up to ``lr`` per step away
    while every other one agrees to ~1e-5. A wrong update (learning rate, bias
    correction, weight decay, a missed step) moves most elements, so: at most
    0.1% of each parameter's elements beyond ``atol + rtol * |eager|``, none
    beyond ``lr * steps``.
    """
    ref_params = dict(ref_model.named_parameters())
    assert set(got) == set(ref_params), f"names differ: {sorted(set(got) ^ set(ref_params))}"
    for name, q in ref_params.items():
        have, want = got[name].detach().cpu(), q.detach()
        diff = (have - want).abs()
        off = int((diff > atol + rtol * want.abs()).sum())
        assert off <= diff.numel() // 1000, (
            f"{name}: {off} of {diff.numel()} elements differ from eager by more than {atol} "
            f"(largest {diff.max().item():.3g})"
        )
        assert diff.max().item() <= lr * steps, f"{name}: an element is {diff.max().item():.3g} away from eager"


def compiled_beside_eager(make_opt, make_sched, steps, *, make_ref_opt=None, hook=None, zero_grad_first=False):
    """A small model trained by a ``spmdtorch.compile``d step beside its eager CPU twin.

    Args:
        make_opt: parameters -> the xla model's optimizer.
        make_sched: optimizer -> its scheduler (stepped after every step, on both sides).
        steps: training steps.
        make_ref_opt: parameters -> the CPU twin's optimizer (default ``make_opt``; differs
            where the xla side takes a tensor hyperparameter the CPU side takes as a float).
        hook: called as ``hook(step_index, opt, ref_opt)`` before each step.
        zero_grad_first: the compiled step starts with ``opt.zero_grad()`` instead of ending with it.

    Returns:
        (compiled losses, eager losses, xla model, CPU model).
    """
    import copy

    import torch

    import spmdtorch

    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model = copy.deepcopy(ref).to("xla")
    opt, ref_opt = make_opt(model.parameters()), (make_ref_opt or make_opt)(ref.parameters())
    sched, ref_sched = make_sched(opt), make_sched(ref_opt)
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    xx, yy = x.to("xla"), y.to("xla")

    @spmdtorch.compile
    def step(x, y):
        if zero_grad_first:
            opt.zero_grad()
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        opt.step()
        if not zero_grad_first:
            opt.zero_grad()
        return loss

    losses, ref_losses = [], []
    for i in range(steps):
        if hook is not None:
            hook(i, opt, ref_opt)
        losses.append(step(xx, yy).item())
        sched.step()
        loss = (ref(x) - y).pow(2).mean()
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_sched.step()
        ref_losses.append(loss.item())
    return losses, ref_losses, model, ref
