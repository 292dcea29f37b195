"""Models trained on xla (lazy and compiled) equal eager CPU torch step by step."""

import copy

import pytest
import torch
import torch.nn.functional as F
from training_helpers import assert_adamw_params_close, train_eager

import spmdtorch
from spmdtorch import debug
from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM, causal_lm_loss

STEPS = 20


def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.LayerNorm(32),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


def mlp_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]


def mlp_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def make_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig.tiny())


def llama_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 256, (2, 16), generator=g),) for _ in range(STEPS)]


def llama_loss(model, batch):
    (tokens,) = batch
    return causal_lm_loss(model(tokens), tokens)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def train_lazy(model, opt, batches, loss_fn):
    losses = []
    for b in batches:
        b = tuple(t.to("xla") for t in b)
        with spmdtorch.step():
            opt.zero_grad()
            loss = loss_fn(model, b)
            loss.backward()
            opt.step()
        losses.append(loss)
    return [l.item() for l in losses]


def train_compiled(model, opt, batches, loss_fn):
    @spmdtorch.compile
    def train_step(*b):
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        return loss

    return [train_step(*(t.to("xla") for t in b)).item() for b in batches]


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
@pytest.mark.parametrize(
    "model_name,opt_name",
    [
        ("mlp", "sgd"),
        ("mlp", "adam"),
        ("mlp", "adamw"),
        pytest.param("llama", "sgd", marks=pytest.mark.slow),  # SGD: the MLP cases; the decoder: AdamW
        ("llama", "adamw"),
    ],
)
def test_training_matches_eager(model_name, opt_name, mode):
    make, batches, loss_fn = {
        "mlp": (make_mlp, mlp_batches, mlp_loss),
        "llama": (make_llama, llama_batches, llama_loss),
    }[model_name]
    data = batches()
    ref = make()
    model = copy.deepcopy(ref).to("xla")
    ref_losses = train_eager(ref, OPTIMIZERS[opt_name](ref.parameters()), data, loss_fn)
    opt = OPTIMIZERS[opt_name](model.parameters())
    before = debug.counter_value("UncachedCompile")
    run = train_lazy if mode == "lazy" else train_compiled
    losses = run(model, opt, data, loss_fn)
    compiles = debug.counter_value("UncachedCompile") - before

    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    # Gradients agree with eager to float32 rounding (~6e-7 relative). The
    # decoder's AdamW case takes the budgeted check (why: its docstring; an
    # Intel Xeon saw 1 of 16384 embedding elements beyond 3e-4); the MLP
    # holds to 1e-5 elementwise.
    if (model_name, opt_name) == ("llama", "adamw"):
        assert_adamw_params_close(dict(model.named_parameters()), ref, lr=1e-2, steps=STEPS)
    else:
        for (name, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
            torch.testing.assert_close(
                p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
            )
    # "A training loop compiles at most twice": the first step (which creates
    # optimizer state) and the steady step.
    assert compiles <= 2, f"{compiles} compilations for {STEPS} steps"


def test_compiled_step_stops_tracing():
    model = make_mlp().to("xla")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    traced = []

    @spmdtorch.compile
    def train_step(x, y):
        traced.append(1)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for x, y in mlp_batches():
        train_step(x.to("xla"), y.to("xla"))
    # traces until two consecutive traces agree, then replays
    assert len(traced) <= 3
    assert debug.counter_value("CompiledReplay") >= STEPS - 3


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_zero_grad_after_step_keeps_gradients_inside_the_program(mode):
    """A step that ends with ``opt.zero_grad()`` (Hugging Face Trainer's order) trains like
    eager and leaves no gradient behind; compiled, its program returns one array per
    parameter fewer than the step that starts with ``zero_grad()``: the gradients die inside it."""
    data = mlp_batches()
    ref = make_mlp()
    model = copy.deepcopy(ref).to("xla")
    ref_losses = train_eager(ref, OPTIMIZERS["adamw"](ref.parameters()), data, mlp_loss)
    opt = OPTIMIZERS["adamw"](model.parameters())

    def step(*b):
        loss = mlp_loss(model, b)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    replays = debug.counter_value("CompiledReplay")
    run = spmdtorch.compile(step) if mode == "compiled" else None
    losses = []
    for b in data:
        b = tuple(t.to("xla") for t in b)
        if run is not None:
            losses.append(run(*b))
        else:
            with spmdtorch.step():
                losses.append(step(*b))
        assert all(p.grad is None for p in model.parameters())
    losses = [loss.item() for loss in losses]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), model.named_parameters()):
        torch.testing.assert_close(
            p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )
    if run is None:
        return
    assert debug.counter_value("CompiledReplay") - replays >= STEPS - 3

    # The same step with zero_grad() first returns the gradients (torch keeps them in p.grad).
    model2 = copy.deepcopy(ref).to("xla")
    opt2 = OPTIMIZERS["adamw"](model2.parameters())

    @spmdtorch.compile
    def step_first(*b):
        opt2.zero_grad()
        loss = mlp_loss(model2, b)
        loss.backward()
        opt2.step()
        return loss

    for b in data[:4]:
        step_first(*(t.to("xla") for t in b))
    n_params = len(list(model.parameters()))
    outs_after = run.executable().out_tree.num_leaves
    outs_first = step_first.executable().out_tree.num_leaves
    assert outs_first - outs_after == n_params, (outs_first, outs_after, n_params)
