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
