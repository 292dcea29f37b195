"""spmdtorch.fsdp.accumulate_gradients: gradient accumulation with one gradient reduction per step.

Values against eager CPU's accumulation loop, and the collectives of the
optimized step program (pytorch/xla#5760): a plain step over 4 micro-batches
reduces 4x the gradient bytes of a 1-micro-batch step; the helper's step has
the gradient reduction of one micro-batch whatever their number.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import spmdtorch
from spmdtorch import debug
from spmdtorch.fsdp import AccumulateGradientsError, FSDPv2, accumulate_gradients
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import get_sharding_spec, mark_sharding

# One line per collective of an optimized HLO module (the root instruction included).
_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(",
    re.M,
)
_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "s32": 4, "f64": 8, "pred": 1}


def _collectives(hlo: str) -> dict[str, tuple[int, int]]:
    """``kind -> (count, bytes)`` of the collectives of an optimized HLO module."""
    out: dict[str, tuple[int, int]] = {}
    for shape, kind in _COLLECTIVE.findall(hlo):
        size = 0
        for dtype, dims in re.findall(r"(f32|bf16|f16|s32|f64|pred)\[([\d,]*)\]", shape):
            size += _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
        count, total = out.get(kind, (0, 0))
        out[kind] = (count + 1, total + size)
    return out


def _reductions(hlo: str) -> tuple[int, int]:
    """(count, bytes) of the gradient reductions: all-reduces and reduce-scatters."""
    found = _collectives(hlo)
    pairs = [found.get(k, (0, 0)) for k in ("all-reduce", "reduce-scatter")]
    return sum(c for c, _ in pairs), sum(b for _, b in pairs)


def _mlp() -> nn.Module:
    # Weights smaller than a micro-batch's activations (256 rows), as in training: GSPMD then reduces
    # weight gradients (with tiny batches it may all-gather the activations instead).
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


@pytest.fixture
def fsdp_mesh(devices8):
    return Mesh(np.arange(8), (8,), ("fsdp",))


def _batches(n: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(256, 32, generator=g), torch.randn(256, 32, generator=g)) for _ in range(n)]


def _eager_accumulate(ref: nn.Module, batches) -> torch.Tensor:
    total = torch.zeros(())
    for x, y in batches:
        loss = _loss(ref, x, y) / len(batches)
        loss.backward()
        total += loss.detach()
    return total


def test_values_equal_eager_and_gradients_keep_the_parameter_layout(fsdp_mesh):
    torch.manual_seed(0)
    ref = _mlp()
    model = FSDPv2(copy.deepcopy(ref), mesh=fsdp_mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(2):
        batches = _batches(4, seed=step)
        loss = accumulate_gradients(model, _loss, [(x.to("xla"), y.to("xla")) for x, y in batches])
        for name, p in model.module.named_parameters():
            assert get_sharding_spec(p.grad) == get_sharding_spec(p), name
        opt.step()
        opt.zero_grad()
        ref_loss = _eager_accumulate(ref, batches)
        opt_ref.step()
        opt_ref.zero_grad()
        spmdtorch.sync()
        torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6, msg=f"step {step}")
    for name, p in model.module.named_parameters():
        torch.testing.assert_close(p.detach().cpu(), ref.get_parameter(name).detach(), rtol=1e-4, atol=1e-5)


def _plain_step_hlo(model: FSDPv2, mesh: Mesh, batches) -> str:
    for x, y in batches:
        x = mark_sharding(x.to("xla"), mesh, ("fsdp", None))
        y = mark_sharding(y.to("xla"), mesh, ("fsdp", None))
        (_loss(model, x, y) / len(batches)).backward()
    hlo = debug.get_hlo_text([p.grad for p in model.parameters()], optimized=True)
    spmdtorch.sync()
    model.zero_grad(set_to_none=True)
    return hlo


def _helper_step_hlo(model: FSDPv2, batches) -> str:
    accumulate_gradients(model, _loss, [(x.to("xla"), y.to("xla")) for x, y in batches])
    hlo = debug.get_hlo_text([p.grad for p in model.parameters()], optimized=True)
    spmdtorch.sync()
    model.zero_grad(set_to_none=True)
    return hlo


def test_four_micro_batches_reduce_the_gradients_of_one(fsdp_mesh):
    model = FSDPv2(_mlp(), mesh=fsdp_mesh)
    grad_bytes = 4 * sum(p.numel() for p in model.parameters())  # 16,768 bytes of float32 gradients
    plain = {n: _reductions(_plain_step_hlo(model, fsdp_mesh, _batches(n, seed=1))) for n in (1, 4)}
    helper = {n: _reductions(_helper_step_hlo(model, _batches(n, seed=1))) for n in (1, 4)}
    # Measured on XLA:CPU (jax 0.10): the plain 1-micro-batch step reduces every gradient once (one
    # combined all-reduce, 16,768 bytes); 4 micro-batches reduce 4x those bytes: the problem.
    assert plain[1][1] == grad_bytes, plain
    assert plain[4][1] == 4 * plain[1][1], plain
    # The helper: one reduction of every gradient per step, whatever the number of micro-batches.
    assert helper[4] == helper[1], helper
    assert helper[4][1] == plain[1][1], (helper, plain)


def test_compiled_step_on_a_hybrid_mesh_equals_eager(devices8):
    # A model annotated with mark_sharding (no wrapper), batch over ("data", "fsdp"), in a compiled step.
    mesh = Mesh(np.arange(8), (2, 4), ("data", "fsdp"))
    torch.manual_seed(1)
    ref = _mlp()
    model = copy.deepcopy(ref).to("xla")
    mark_sharding(model[0].weight, mesh, ("fsdp", None))
    mark_sharding(model[2].weight, mesh, (None, "fsdp"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)

    @spmdtorch.compile
    def step(batches):
        loss = accumulate_gradients(model, _loss, batches, mesh=mesh)
        opt.step()
        opt.zero_grad()
        return loss

    for i in range(3):
        batches = _batches(2, seed=10 + i)
        loss = step([(x.to("xla"), y.to("xla")) for x, y in batches])
        ref_loss = _eager_accumulate(ref, batches)
        opt_ref.step()
        opt_ref.zero_grad()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss, rtol=1e-5, atol=1e-6, msg=f"step {i}")
    assert get_sharding_spec(model[0].weight) == get_sharding_spec(
        mark_sharding(torch.zeros(64, 32, device="xla"), mesh, ("fsdp", None))
    )
    torch.testing.assert_close(model[2].weight.detach().cpu(), ref[2].weight.detach(), rtol=1e-4, atol=1e-5)


def test_bad_arguments_are_named_errors(fsdp_mesh):
    model = FSDPv2(_mlp(), mesh=fsdp_mesh)
    x = torch.randn(8, 32, device="xla")
    with pytest.raises(AccumulateGradientsError, match="micro_batches"):
        accumulate_gradients(model, lambda m, t: m(t).mean(), [])
    with pytest.raises(AccumulateGradientsError, match=r"micro_batches\[0\]\[0\].*multiple of 8"):
        accumulate_gradients(model, lambda m, t: m(t).mean(), [torch.randn(6, 32, device="xla")])
    with pytest.raises(AccumulateGradientsError, match=r"micro_batches\[0\]\[0\] is on cpu"):
        accumulate_gradients(model, lambda m, t: m(t).mean(), [torch.randn(8, 32)])
    with pytest.raises(AccumulateGradientsError, match="scalar"):
        accumulate_gradients(model, lambda m, t: m(t), [x])
    with pytest.raises(AccumulateGradientsError, match="mesh"):
        accumulate_gradients(_mlp().to("xla"), lambda m, t: m(t).mean(), [x])
