"""spmdtorch.compile over gradient-accumulation steps: they replay, with eager CPU's values (issue 43).

``accumulate_gradients`` builds a wrapper module around the model on every
call; ``compile`` guards the modules a trace called, and found that wrapper
dead at the next call, so every step traced again ("replayed 0 of 6").
These tests count traces and replays of accumulation steps over FSDP2 + tensor
parallel DTensors (``spmdtorch.dtensor``), torch's own accumulation loop with
``set_requires_gradient_sync``, and FSDPv2, whose compiled step over 4
micro-batches must also keep the gradient reductions of one.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import fully_shard, init_device_mesh, parallelize_module
from spmdtorch.fsdp import FSDPv2, accumulate_gradients
from spmdtorch.mesh import Mesh


class _Block(nn.Module):
    """A pre-norm residual feed-forward block."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.w1 = nn.Linear(16, 32)
        self.w2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(model(x), y)


def _batches(n: int, seed: int, shape: tuple[int, ...]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)) for _ in range(n)]


def _eager_step(ref: nn.Module, opt: torch.optim.Optimizer, batches) -> torch.Tensor:
    loss = sum(_loss(ref, x, y) / len(batches) for x, y in batches)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


class _Counts:
    """Traces and replays of compiled functions since it was made."""

    def __init__(self) -> None:
        self.start = {k: debug.counter_value(k) or 0 for k in ("CompiledTrace", "CompiledReplay")}

    def __call__(self) -> tuple[int, int]:
        return tuple((debug.counter_value(k) or 0) - v for k, v in self.start.items())  # type: ignore[return-value]


@pytest.mark.parametrize("accumulation", ["accumulate_gradients", "set_requires_gradient_sync"])
def test_fsdp2_tensor_parallel_accumulation_step_replays_with_eager_values(devices8, accumulation):
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(7)
    ref = nn.Sequential(_Block(), _Block())
    model = copy.deepcopy(ref)
    for block in model:
        parallelize_module(block, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)

    @spmdtorch.compile
    def step(batches):
        if accumulation == "accumulate_gradients":
            loss = accumulate_gradients(model, _loss, batches)
        else:  # torch's FSDP2 recipe: no gradient sync but on the last micro-batch
            loss = 0
            for i, (x, y) in enumerate(batches):
                model.set_requires_gradient_sync(i == len(batches) - 1)
                micro = _loss(model, x, y) / len(batches)
                micro.backward()
                loss = loss + micro.detach()
        opt.step()
        opt.zero_grad()
        return loss

    steps = 5
    counts = _Counts()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "set_requires_gradient_sync", UserWarning)
        for i in range(steps):
            batches = _batches(2, seed=100 + i, shape=(8, 4, 16))
            loss = step([(x.to("xla"), y.to("xla")) for x, y in batches])
            ref_loss = _eager_step(ref, opt_ref, batches)
            torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6, msg=f"step {i}")
    # As a 1-micro-batch step: the first call makes AdamW's state, the next two agree, the rest replay.
    # Before the fix every call traced (accumulate_gradients' per-call wrapper failed the module guard).
    assert counts() == (3, steps - 3), counts()
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), rtol=1e-4, atol=1e-5, msg=name
        )


# (result shape) of every all-reduce / reduce-scatter of an optimized HLO module, the root instruction included.
_REDUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = (.+?) (?:all-reduce|reduce-scatter)(?:-start)?\(", re.M)


def test_fsdpv2_accumulation_step_replays_and_reduces_one_micro_batch(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    torch.manual_seed(8)
    ref = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
    reductions = {}
    for n in (1, 4):
        eager = copy.deepcopy(ref)
        model = FSDPv2(copy.deepcopy(ref), mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt_ref = torch.optim.AdamW(eager.parameters(), lr=1e-2)

        @spmdtorch.compile
        def step(batches, model=model, opt=opt):
            loss = accumulate_gradients(model, _loss, batches)
            opt.step()
            opt.zero_grad()
            return loss

        steps = 4
        counts = _Counts()
        for i in range(steps):
            # Rows: weights smaller than a micro-batch's activations, so GSPMD reduces weight gradients.
            batches = _batches(n, seed=200 + i, shape=(256, 32))
            loss = step([(x.to("xla"), y.to("xla")) for x, y in batches])
            ref_loss = _eager_step(eager, opt_ref, batches)
            torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-5, atol=1e-6, msg=f"{n} micro-batches, step {i}")
        assert counts() == (3, steps - 3), (n, counts())
        for name, p in model.module.named_parameters():
            torch.testing.assert_close(
                p.detach().cpu(), eager.get_parameter(name).detach(), rtol=1e-4, atol=1e-5, msg=name
            )
        reductions[n] = sorted(_REDUCTION.findall(step.executable().as_text()))
    grad_bytes = 4 * sum(p.numel() for p in ref.parameters())
    reduced = sum(
        4 * int(np.prod([int(d) for d in dims.split(",") if d]))
        for shapes in reductions[1]
        for dims in re.findall(r"f32\[([\d,]*)\]", shapes)
    )
    # Every gradient is reduced (at least its bytes), and 4 micro-batches reduce exactly what one does.
    assert reduced >= grad_bytes, (reduced, grad_bytes, reductions)
    assert reductions[4] == reductions[1], reductions


def test_the_retrace_log_names_a_module_built_on_every_call(devices8, caplog):
    # What kept accumulation steps tracing, said by SPMDTORCH_LOG_RECOMPILES (it logged nothing before).
    ref = nn.Linear(4, 4)
    lin = copy.deepcopy(ref).to("xla")

    @spmdtorch.compile
    def step(x):
        return nn.Sequential(lin)(x)  # a new container on every call: the guard finds the traced one freed

    caplog.set_level(logging.INFO, logger="spmdtorch.compile")
    x = torch.ones(8, 4)
    for _ in range(3):
        out = step(x.to("xla"))
    torch.testing.assert_close(out.cpu(), ref(x).detach())
    assert "traced again (a module the trace called was freed" in caplog.text, caplog.text
