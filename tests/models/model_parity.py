"""Helpers of the model parity tests: train on xla (lazy or compiled), compare with eager.

Importable as a top-level module: pytest puts each test file's folder on sys.path.
"""

from __future__ import annotations

import copy

import torch
from training_helpers import train_eager

import spmdtorch


def train_xla(model, opt, batches, loss_fn, mode, prepare=None):
    """Train ``model`` (already on xla) one step per batch; the losses as floats.

    Args:
        model: the xla model.
        opt: its optimizer.
        batches: tuples of CPU tensors.
        loss_fn: ``loss_fn(model, batch) -> loss``.
        mode: ``"lazy"`` (one ``spmdtorch.step()`` per batch) or ``"compiled"``
            (the step under ``spmdtorch.compile``).
        prepare: moves a CPU batch to xla (default: ``.to("xla")`` each tensor),
            e.g. to shard it.
    """
    prepare = prepare or (lambda b: tuple(t.to("xla") for t in b))

    def step(*b):
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        return loss

    run = spmdtorch.compile(step) if mode == "compiled" else step
    losses = []
    for b in batches:
        b = prepare(b)
        with spmdtorch.step():
            losses.append(run(*b))
    return [float(loss.item()) for loss in losses]


def check_training_parity(
    make_model,
    make_opt,
    batches,
    loss_fn,
    mode,
    *,
    wrap=None,
    prepare=None,
    loss_rtol=1e-5,
    param_rtol=1e-5,
    param_atol=1e-5,
):
    """Train a model eagerly on CPU and on xla from the same init; assert equal numbers.

    Compares the per-step losses, then every parameter and buffer (batch-norm
    running statistics included) after the last step.

    Args:
        make_model: builds the CPU model (seeded inside).
        make_opt: ``make_opt(params) -> optimizer``.
        batches: tuples of CPU tensors, one per step.
        loss_fn: ``loss_fn(model, batch) -> loss``.
        mode: ``"lazy"`` or ``"compiled"``.
        wrap: turns the CPU copy into the xla model (default ``.to("xla")``),
            e.g. FSDPv2.
        prepare: see ``train_xla``.
        loss_rtol, param_rtol, param_atol: tolerances (defaults: float32 rounding).

    Returns:
        ``(ref, model)``: the trained CPU and xla models.
    """
    ref = make_model()
    model = (wrap or (lambda m: m.to("xla")))(copy.deepcopy(ref))
    ref_losses = train_eager(ref, make_opt(ref.parameters()), batches, loss_fn)
    losses = train_xla(model, make_opt(model.parameters()), batches, loss_fn, mode, prepare)
    torch.testing.assert_close(
        torch.tensor(losses),
        torch.tensor(ref_losses),
        rtol=loss_rtol,
        atol=1e-6,
        msg=lambda m: f"losses {losses} vs eager {ref_losses}: {m}",
    )
    ours = dict(model.named_parameters())
    ours.update(model.named_buffers())
    theirs = dict(ref.named_parameters())
    theirs.update(ref.named_buffers())
    # FSDPv2 prefixes names with ``_orig_module.``; match on the plain name.
    ours = {k.replace("_orig_module.", ""): v for k, v in ours.items()}
    assert sorted(ours) == sorted(theirs), f"parameter names differ: {sorted(set(ours) ^ set(theirs))}"
    for name, ref_t in theirs.items():
        torch.testing.assert_close(
            ours[name].detach().cpu(),
            ref_t.detach(),
            rtol=param_rtol,
            atol=param_atol,
            msg=lambda m, name=name: f"{name}: {m}",
        )
    return ref, model
