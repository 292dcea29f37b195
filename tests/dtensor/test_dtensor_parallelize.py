"""spmdtorch.dtensor.parallelize_module: torch's tensor-parallel styles as annotations, trained against eager CPU."""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
)

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import (
    DTensorError,
    UnsupportedStyleError,
    XlaDTensor,
    distribute_module,
    distribute_tensor,
    init_device_mesh,
    parallelize_module,
    spmd_mesh,
)
from spmdtorch.sharding import get_sharding_spec, mark_sharding


class SwiGLU(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # reshape with -1 (local heads/features): under one controller the "local" tensor is the global one
        h = F.silu(self.w1(x)) * self.w3(x)
        return self.w2(h.reshape(*x.shape[:-1], -1))


@pytest.fixture
def mesh2(devices8):
    return init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))


def _marked(mesh, shape, spec) -> str:
    return get_sharding_spec(mark_sharding(torch.zeros(shape, device="xla"), spmd_mesh(mesh), spec))


def test_tp_mlp_trains_like_eager(mesh2):
    torch.manual_seed(0)
    ref = SwiGLU()
    model = parallelize_module(
        copy.deepcopy(ref), mesh2["tp"], {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    )
    for name, placements, spec in [
        ("w1.weight", (Shard(0),), ("tp", None)),
        ("w1.bias", (Shard(0),), ("tp",)),
        ("w3.weight", (Shard(0),), ("tp", None)),
        ("w2.weight", (Shard(1),), (None, "tp")),
        ("w2.bias", (Replicate(),), (None,)),
    ]:
        p = model.get_parameter(name)
        assert isinstance(p, nn.Parameter) and isinstance(p, XlaDTensor) and p.placements == placements, name
        assert get_sharding_spec(p.to_local()) == _marked(mesh2, tuple(p.shape), spec), name
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(4, 6, 16)
        target = torch.randn(4, 6, 16)
        out = model(x.to("xla"))
        assert not isinstance(out, DTensor)  # use_local_output=True: the (global) tensor itself
        loss = F.mse_loss(out, target.to("xla"))
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = F.mse_loss(ref(x), target)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        spmdtorch.sync()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-5, msg=f"step {step}")
    for name, p in model.named_parameters():
        assert p.placements == ref_placements(name)
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), atol=1e-5, rtol=1e-5
        )


def ref_placements(name: str) -> tuple:
    return {"w1": (Shard(0),), "w3": (Shard(0),), "w2": (Shard(1),) if name.endswith("weight") else (Replicate(),)}[
        name.split(".")[0]
    ]


def test_gradients_keep_parameter_placements(mesh2):
    # A model already on xla: its parameters are annotated where they are (w3 stays a plain xla tensor).
    model = parallelize_module(SwiGLU().to("xla"), mesh2["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    model(torch.randn(2, 16, device="xla")).sum().backward()
    g = model.w1.weight.grad
    assert isinstance(g, XlaDTensor) and g.placements == (Shard(0),)
    assert get_sharding_spec(g.to_local()) == _marked(mesh2, (32, 16), ("tp", None))
    assert model.w2.weight.grad.placements == (Shard(1),)


def test_output_layouts_and_dtensor_outputs(mesh2):
    torch.manual_seed(1)
    ref = SwiGLU()
    model = parallelize_module(
        copy.deepcopy(ref),
        mesh2["tp"],
        {
            "w1": ColwiseParallel(use_local_output=False),
            "w3": ColwiseParallel(use_local_output=False),
            "w2": RowwiseParallel(output_layouts=Shard(0), use_local_output=False),
        },
    )
    x = torch.randn(8, 16)
    out = model(x.to("xla"))
    assert isinstance(out, XlaDTensor) and out.placements == (Shard(0),)
    torch.testing.assert_close(out.full_tensor().detach().cpu(), ref(x).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("style", "placements"), [(ColwiseParallel(), (Shard(1),)), (RowwiseParallel(), (Shard(0),))])
def test_embedding(mesh2, style, placements):
    torch.manual_seed(2)
    ref = nn.Embedding(16, 8)
    emb = parallelize_module(copy.deepcopy(ref), mesh2["tp"], style)
    assert emb.weight.placements == placements
    ids = torch.randint(0, 16, (3, 5))
    torch.testing.assert_close(emb(ids.to("xla")).detach().cpu(), ref(ids).detach())


def test_sequence_parallel_and_prepare_input_output(mesh2):
    torch.manual_seed(3)
    norm_ref = nn.LayerNorm(8)
    norm = parallelize_module(copy.deepcopy(norm_ref), mesh2["tp"], SequenceParallel())
    assert norm.weight.placements == (Replicate(),)
    x = torch.randn(2, 8, 8)
    out = norm(x.to("xla"))
    torch.testing.assert_close(out.detach().cpu(), norm_ref(x).detach(), atol=1e-5, rtol=1e-5)

    class Two(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a * 2, b + 1

    seen = {}

    def grab(_m, inputs):
        seen["a"], seen["b"] = inputs

    two = Two()
    parallelize_module(
        two,
        mesh2["tp"],
        PrepareModuleInput(
            input_layouts=(Shard(0), None), desired_input_layouts=(Replicate(), None), use_local_output=False
        ),
    )
    two.register_forward_pre_hook(grab)
    parallelize_module(
        two,
        mesh2["tp"],
        PrepareModuleOutput(
            output_layouts=(Replicate(), None), desired_output_layouts=(Shard(1), None), use_local_output=False
        ),
    )
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    oa, ob = two(a.to("xla"), b.to("xla"))
    assert isinstance(seen["a"], XlaDTensor) and seen["a"].placements == (Replicate(),)
    assert not isinstance(seen["b"], DTensor)
    assert isinstance(oa, XlaDTensor) and oa.placements == (Shard(1),) and not isinstance(ob, DTensor)
    torch.testing.assert_close(oa.full_tensor().cpu(), a * 2)
    torch.testing.assert_close(ob.cpu(), b + 1)


def test_distribute_module_hooks(mesh2):
    lin = nn.Linear(8, 8)

    def partition(name, mod, mesh):
        if isinstance(mod, nn.Linear):
            mod.weight = nn.Parameter(distribute_tensor(mod.weight.data, mesh, [Replicate(), Shard(0)]))

    calls = []
    distribute_module(
        lin,
        mesh2,
        partition,
        input_fn=lambda mod, inputs, mesh: calls.append(("in", mesh)),
        output_fn=lambda mod, outputs, mesh: calls.append(("out", mesh)),
    )
    assert lin.weight.placements == (Replicate(), Shard(0))
    assert lin.bias.placements == (Replicate(), Replicate())  # left plain by partition_fn: replicated
    lin(torch.randn(2, 8, device="xla"))
    assert [c[0] for c in calls] == ["in", "out"] and calls[0][1] == mesh2


def test_distribute_module_hook_arity(mesh2):
    # torch's contract: a two-argument hook (outputs, mesh) still works, with torch's FutureWarning.
    lin = nn.Linear(4, 4)
    want = lin(torch.ones(2, 4)) + 1
    with pytest.warns(FutureWarning, match="distribute_module: Deprecating output_fn that takes two arguments"):
        distribute_module(lin, mesh2, output_fn=lambda outputs, mesh: outputs + 1)
    torch.testing.assert_close(lin(torch.ones(2, 4, device="xla")).cpu(), want.detach())
    # Any other arity is refused before a hook is registered (the valid input_fn is not left behind).
    other = nn.Linear(4, 4)
    with pytest.raises(DTensorError, match=r"output_fn should take in 3 arguments .* but got 1 arguments"):
        distribute_module(other, mesh2, input_fn=lambda mod, inputs, mesh: None, output_fn=lambda outputs: outputs)
    assert not other._forward_pre_hooks and not other._forward_hooks


class _MyStyle(ParallelStyle):
    def _apply(self, module, device_mesh):
        return module


def test_styles_without_a_plan_are_named_errors(mesh2):
    with pytest.raises(UnsupportedStyleError, match="nn.Linear and nn.Embedding"):
        parallelize_module(nn.Conv1d(2, 2, 1), mesh2["tp"], ColwiseParallel())
    with pytest.raises(UnsupportedStyleError, match="_MyStyle"):
        parallelize_module(nn.Linear(2, 2), mesh2["tp"], _MyStyle())


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(.*?"
    r"replica_groups=(\S+?),",
    re.M,
)


def _collectives(hlo: str) -> list[tuple[str, str, str]]:
    """(result shape, kind, replica groups) of every collective in an optimized HLO module (its root too), sorted."""
    return sorted(_COLLECTIVE.findall(hlo))


def _tp_step_hlo(model: nn.Module, mesh, batch_axes: tuple[str, ...]) -> str:
    # One step: the batch split over `batch_axes` (mark_sharding), the MLP's weights over tp.
    m = spmd_mesh(mesh)
    batch = batch_axes if len(batch_axes) > 1 else batch_axes[0]
    x = mark_sharding(torch.randn(8, 6, 16).to("xla"), m, (batch, None, None))
    target = mark_sharding(torch.randn(8, 6, 16).to("xla"), m, (batch, None, None))
    F.mse_loss(model(x), target).backward()
    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in model.parameters()]
    hlo = debug.get_hlo_text(grads, optimized=True)
    spmdtorch.sync()
    return hlo


@pytest.mark.parametrize(
    ("shape", "names", "batch_axes"),
    [((2, 4), ("dp", "tp"), ("dp",)), ((2, 2, 2), ("dp", "cp", "tp"), ("dp", "cp"))],
)
def test_tp_step_has_the_collectives_of_the_mark_sharding_program(devices8, shape, names, batch_axes):
    mesh = init_device_mesh("xla", shape, mesh_dim_names=names)
    torch.manual_seed(4)
    ref = SwiGLU()
    plan = {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    dtensor_hlo = _tp_step_hlo(parallelize_module(copy.deepcopy(ref), mesh["tp"], plan), mesh, batch_axes)
    marked = copy.deepcopy(ref).to("xla")
    for name, spec in [("w1.weight", ("tp", None)), ("w1.bias", ("tp",)), ("w3.weight", ("tp", None))]:
        mark_sharding(marked.get_parameter(name), spmd_mesh(mesh), spec)
    mark_sharding(marked.w2.weight, spmd_mesh(mesh), (None, "tp"))
    marked_hlo = _tp_step_hlo(marked, mesh, batch_axes)
    found = _collectives(dtensor_hlo)
    assert found, "the tensor-parallel step has no collective (the row-wise all-reduce is missing)"
    assert found == _collectives(marked_hlo)


def test_tp_step_in_compiled_mode_equals_eager(mesh2):
    torch.manual_seed(5)
    ref = SwiGLU()
    plan = {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    model = parallelize_module(copy.deepcopy(ref), mesh2["tp"], plan)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)

    @spmdtorch.compile
    def step(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    replays = debug.counter_value("CompiledReplay") or 0
    for i in range(4):
        x, t = torch.randn(8, 16), torch.randn(8, 16)
        loss = step(x.to("xla"), t.to("xla"))
        ref_loss = F.mse_loss(ref(x), t)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), atol=1e-5, rtol=1e-5, msg=f"step {i}")
    # Traced until two traces agree, then replayed: nothing made inside the step outlives it.
    assert (debug.counter_value("CompiledReplay") or 0) - replays >= 2
    assert model.w1.weight.placements == (Shard(0),)
    torch.testing.assert_close(
        model.w2.weight.full_tensor().detach().cpu(), ref.w2.weight.detach(), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("use_loss_parallel", [True, False])
def test_loss_parallel_on_sharded_logits(mesh2, use_loss_parallel):
    torch.manual_seed(6)
    ref = nn.Linear(8, 12)
    head = parallelize_module(copy.deepcopy(ref), mesh2["tp"], ColwiseParallel(use_local_output=False))
    x, y = torch.randn(6, 8), torch.randint(0, 12, (6,))
    logits = head(x.to("xla"))
    assert logits.placements == (Shard(1),)  # vocabulary split over tp, as loss_parallel expects
    with loss_parallel() if use_loss_parallel else contextlib.nullcontext():
        loss = F.cross_entropy(logits, y.to("xla"))
        loss.backward()
    ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    torch.testing.assert_close(loss.full_tensor().detach().cpu(), ref_loss.detach())
    torch.testing.assert_close(head.weight.grad.full_tensor().cpu(), ref.weight.grad, atol=1e-6, rtol=1e-5)


def test_clip_grad_norm_over_dtensor_gradients(mesh2):
    torch.manual_seed(7)
    ref = SwiGLU()
    plan = {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()}
    model = parallelize_module(copy.deepcopy(ref), mesh2["tp"], plan)
    x = torch.randn(4, 16)
    model(x.to("xla")).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    ref_norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
    torch.testing.assert_close(norm.full_tensor().cpu(), ref_norm, rtol=1e-5, atol=1e-5)
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.grad.full_tensor().cpu(), ref.get_parameter(name).grad, rtol=1e-5, atol=1e-6, msg=name
        )
