"""Sharding weights really divides per-device memory: XLA's memory analysis.

An MLP's training step is built lazily (forward, backward, optimizer update),
then lowered and compiled the way the executor would
(``executor.lower(...).compile()``), and XLA's ``memory_analysis()`` gives the
bytes of the program's arguments *per device*. With the weights sharded
FSDP-style (dim 0 over all 8 devices) each device must hold about 1/8 of what
it holds when they are replicated; the biases, the batch and the optimizer's
Python scalars stay replicated and are allowed for as a small constant.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch.lazy import executor
from spmdtorch.mesh import Mesh
from spmdtorch.partition import get_sharding_spec, mark_sharding
from spmdtorch.tensor.dispatch import read_value

DIM = 512
LAYERS = 3
BATCH = 16
F32 = 4

WEIGHT_BYTES = LAYERS * DIM * DIM * F32
BIAS_BYTES = LAYERS * DIM * F32
BATCH_BYTES = 2 * BATCH * DIM * F32  # inputs and targets
SCALAR_SLACK = 4096  # learning rate, betas, step counters... and alignment


def make_mlp():
    torch.manual_seed(0)
    layers = []
    for i in range(LAYERS):
        layers.append(torch.nn.Linear(DIM, DIM))
        if i < LAYERS - 1:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


def build_step(model, opt, x, y):
    """Record one training step (pending, not run); returns its outputs."""
    opt.zero_grad()
    loss = F.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    # (step counters of a non-capturable optimizer stay on the CPU)
    state = [v for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor) and v.device.type == "xla"]
    return [loss, *model.parameters(), *state]


def argument_bytes(outputs):
    lowered = executor.lower([read_value(t) for t in outputs])
    stats = lowered.compile().memory_analysis()
    assert stats is not None, "XLA gave no memory analysis for this backend"
    return stats


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_fsdp_sharded_weights_take_an_eighth_of_the_memory(devices8, opt_name):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    make_opt = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3),
    }[opt_name]
    g = torch.Generator().manual_seed(1)
    x_cpu = torch.randn(BATCH, DIM, generator=g)
    y_cpu = torch.randn(BATCH, DIM, generator=g)
    ref = make_mlp()

    results = {}
    for kind in ("replicated", "sharded"):
        model = copy.deepcopy(ref).to("xla")
        if kind == "sharded":
            for layer in model[::2]:
                mark_sharding(layer.weight, mesh, ("fsdp", None))
            assert get_sharding_spec(model[0].weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
        opt = make_opt(model.parameters())
        x, y = x_cpu.to("xla"), y_cpu.to("xla")
        if opt_name == "adamw":
            # Run one step so that the optimizer state exists and is an
            # argument of the step being measured.
            build_step(model, opt, x, y)
            spmdtorch.sync()
        outputs = build_step(model, opt, x, y)
        stats = argument_bytes(outputs)
        spmdtorch.sync()  # run the recorded step, so nothing stays pending
        results[kind] = stats
        print(
            f"{opt_name} {kind}: argument {stats.argument_size_in_bytes} B, "
            f"output {stats.output_size_in_bytes} B, temp {stats.temp_size_in_bytes} B per device"
        )

    # With Adam, exp_avg and exp_avg_sq are weight-sized arguments too.
    weight_like = WEIGHT_BYTES * (3 if opt_name == "adamw" else 1)
    bias_like = BIAS_BYTES * (3 if opt_name == "adamw" else 1)
    const = bias_like + BATCH_BYTES + SCALAR_SLACK
    rep = results["replicated"].argument_size_in_bytes
    shd = results["sharded"].argument_size_in_bytes
    print(f"{opt_name}: replicated {rep} B, sharded {shd} B, ratio {shd / rep:.3f}")
    # Replicated: every device holds every weight.
    assert rep >= weight_like, (rep, weight_like)
    # Sharded: about an eighth, plus the replicated small things.
    assert shd <= weight_like / 8 * 1.3 + const, (shd, weight_like / 8, const)
    assert shd >= weight_like / 8, (shd, weight_like / 8)
