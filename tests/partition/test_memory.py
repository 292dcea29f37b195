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
from spmdtorch.partition import (
    MemoryBudgetError,
    MemoryPlanError,
    ShardingError,
    compiled_memory,
    get_sharding_spec,
    mark_sharding,
    memory_plan,
)
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
    state = [
        v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.device.type == "xla"
    ]
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


# -- memory_plan ---------------------------------------------------------------------


def meta_mlp():
    with torch.device("meta"):
        return torch.nn.Sequential(
            torch.nn.Linear(64, 100), torch.nn.Linear(100, 64, bias=False), torch.nn.BatchNorm1d(64)
        )


def test_memory_plan_shard_shapes_and_bytes(devices8):
    mesh = Mesh(np.arange(8), (2, 4), ("fsdp", "tp"))
    plan = memory_plan(meta_mlp(), mesh, rules={"0.weight": ("tp", "fsdp"), "1.weight": ("fsdp", None)})
    by = {t.name: t for t in plan.tensors}
    # 100 rows over 4 devices: 25 each; 64 columns over 2: 32 each.
    assert by["0.weight"].shard_shape == (25, 32) and by["0.weight"].bytes_per_device == 25 * 32 * 4
    assert by["0.weight"].spec == ("tp", "fsdp") and by["0.weight"].global_bytes == 100 * 64 * 4
    assert by["1.weight"].shard_shape == (32, 100)
    assert by["0.bias"].shard_shape == (100,) and by["0.bias"].spec == (None,)  # no rule: replicated
    # Buffers: int64 num_batches_tracked is stored as int32 on the device.
    assert by["2.num_batches_tracked"].kind == "buffer" and by["2.num_batches_tracked"].bytes_per_device == 4
    assert plan.buffer_bytes == 2 * 64 * 4 + 4
    assert plan.parameter_bytes == (25 * 32 + 32 * 100 + 100 + 64 + 64) * 4
    assert plan.gradient_bytes == plan.parameter_bytes and plan.optimizer_bytes == 0
    # Uneven: 100 rows over 8 devices are stored padded to 13 each.
    mesh8 = Mesh(np.arange(8), (8,), ("fsdp",))
    assert {t.name: t.shard_shape for t in memory_plan(meta_mlp(), mesh8, rules="fsdp").tensors}["0.weight"] == (13, 64)


def test_memory_plan_reads_existing_annotations_and_agrees_with_the_data(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    model = meta_mlp()
    spmdtorch.materialize(model, mesh, {"0.weight": ("fsdp", None), "1.weight": (None, "fsdp")})
    plan = memory_plan(model)
    for t in plan.tensors:
        p = model.get_parameter(t.name) if t.kind != "buffer" else model.get_buffer(t.name)
        arr = p._st.value
        assert t.shard_shape == tuple(arr.addressable_shards[0].data.shape), t.name
    assert {t.name: t.spec for t in plan.tensors}["1.weight"] == (None, "fsdp")
    # A state dict plans the same (floating tensors count as parameters).
    sd = memory_plan(model.state_dict())
    assert sd.parameter_bytes + sd.buffer_bytes == plan.parameter_bytes + plan.buffer_bytes


@pytest.mark.parametrize(
    "opt,expected",
    [
        ("sgd", 0),
        (torch.optim.SGD, 1),
        ("adam", 2),
        (torch.optim.AdamW, 3),
    ],
)
def test_memory_plan_optimizer_state(devices8, opt, expected):
    model = torch.nn.Linear(8, 8)
    if opt is torch.optim.SGD:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    elif opt is torch.optim.AdamW:
        opt = torch.optim.AdamW(model.parameters(), amsgrad=True)
    plan = memory_plan(model, optimizer=opt)
    step = 2 * 4 if expected >= 2 else 0  # Adam-family keep a step counter per parameter
    assert plan.optimizer_bytes == expected * plan.parameter_bytes + step


def test_memory_budget_names_the_largest_tensors(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Embedding(4096, 256), torch.nn.Linear(256, 256))
    replicated = memory_plan(model, mesh, optimizer="adamw")
    with pytest.raises(
        MemoryBudgetError, match=r"budget is 4\.00 MiB.*0\.weight \(4096, 256\) spec \(None, None\): 4\.00 MiB"
    ):
        memory_plan(model, mesh, optimizer="adamw", budget_bytes=4 * 2**20)
    sharded = memory_plan(model, mesh, rules="fsdp", optimizer="adamw", budget_bytes=4 * 2**20)
    assert sharded.total_bytes <= 4 * 2**20 < replicated.total_bytes
    text = str(sharded)
    assert "0.weight" in text and "(fsdp, None)" in text and "optimizer state (adamw)" in text


def test_memory_plan_bad_inputs(devices8):
    mesh = Mesh(np.arange(8), (8,), ("data",))
    with pytest.raises(MemoryPlanError, match="does not know.*'lion'"):
        memory_plan(torch.nn.Linear(2, 2), optimizer="lion")
    with pytest.raises(MemoryPlanError, match="'fsdp'.*'data'"):
        memory_plan(torch.nn.Linear(2, 2), mesh, rules="fsdp")
    with pytest.raises(ShardingError, match="matches no parameter"):
        memory_plan(torch.nn.Linear(2, 2), mesh, rules={"nope*": ("data", None)})
    with pytest.raises(MemoryPlanError, match="nn.Module or a state dict"):
        memory_plan([torch.zeros(2)])
    with pytest.raises(MemoryPlanError, match="has not been called yet"):
        compiled_memory(spmdtorch.compile(lambda x: x + 1))


def test_memory_plan_adds_the_compiled_steps_analysis(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    model = make_mlp().to("xla")
    for layer in model[::2]:
        mark_sharding(layer.weight, mesh, ("fsdp", None))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(BATCH, DIM)

    @spmdtorch.compile
    def step(x):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        return loss

    step(x)
    plan = memory_plan(model, optimizer=opt, compiled=step)
    xla = compiled_memory(step)
    assert plan.activation_bytes == xla.temp_bytes > 0
    assert plan.total_bytes == plan.state_bytes + xla.temp_bytes
    # The step's arguments are the parameters, the batch and the buffers the
    # gradients it keeps are written into (sharded like their parameters).
    assert plan.gradient_bytes == plan.parameter_bytes
    expected = plan.parameter_bytes + plan.gradient_bytes + BATCH * DIM * F32
    assert abs(xla.argument_bytes - expected) <= SCALAR_SLACK
    # The gradients are written into those buffers, the parameters into theirs.
    assert xla.alias_bytes == plan.parameter_bytes + plan.gradient_bytes
    assert "activations + temporaries (XLA)" in str(plan)


@pytest.mark.parametrize("name", ["spmdtorch.plan._memory", "spmdtorch.plan._materialize", "spmdtorch.plan._planner"])
def test_doctests(devices8, name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
