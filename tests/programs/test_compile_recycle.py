"""spmdtorch.compile: a replayed step writes what it keeps into the old buffers.

``opt.zero_grad()`` inside the step drops last step's gradients and backward
makes new ones; on a replay the program takes the old gradient arrays as
donated, unused arguments and writes the new values into them instead of
allocating new buffers (``executor.Recycled``); so does state the step
overwrites without reading it (``copy_``). These tests check that the
buffers really are reused, that the values stay those of eager CPU torch, and
that an old gradient that is passed in or re-placed between calls is never
donated.
"""

import copy

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.partition import FSDPv2, mark_sharding


class RMSNorm(torch.nn.Module):
    """A norm whose weight's gradient is a view of a ``[1, 1, n]`` sum (the case ``_base_sharding`` maps)."""

    def __init__(self, dim):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.Tanh(), RMSNorm(32), torch.nn.Linear(32, 8, bias=False)
    )


def _setup(fsdp: bool):
    ref = _model()
    model = copy.deepcopy(ref).to("xla")
    if fsdp:
        model = FSDPv2(model, mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 2, 16)

    @spmdtorch.compile
    def step(inp):
        opt.zero_grad()
        loss = model(inp).square().mean()
        loss.backward()
        opt.step()
        return loss

    return ref, model, x, step


def _eager(ref, x, steps):
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = ref(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _grad_arrays(model):
    return [p.grad._st.value for p in model.parameters()]


def _assert_matches_eager(model, ref, losses, ref_losses):
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=name)
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=f"{name}.grad")


@pytest.mark.parametrize("fsdp", [False, True], ids=["default", "fsdp8"])
def test_replayed_step_writes_gradients_into_their_old_buffers(request, fsdp):
    if fsdp:
        request.getfixturevalue("devices8")
    ref, model, x, step = _setup(fsdp)
    xx = x.to("xla")
    losses = [step(xx).item() for _ in range(3)]
    debug.clear_metrics()
    for _ in range(3):
        old = _grad_arrays(model)
        losses.append(step(xx).item())
        assert all(a.is_deleted() for a in old), "a gradient's old buffer was not reused"
    assert debug.counter_value("CompiledReplay") == 3
    assert debug.counter_value("CompiledTrace") in (0, None)
    _assert_matches_eager(model, ref, losses, _eager(ref, x, 6))


def test_an_old_gradient_passed_in_and_read_is_not_donated():
    ref, model, x, _ = _setup(fsdp=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = model[0].weight

    @spmdtorch.compile
    def step(inp, prev):
        seen = prev.sum() * 1.0  # reads last step's gradient, which this step then replaces
        opt.zero_grad()
        model(inp).square().mean().backward()
        opt.step()
        return seen

    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    xx = x.to("xla")
    first.grad = torch.zeros_like(first)
    prev_ref = torch.zeros_like(ref[0].weight)
    for i in range(6):
        seen = step(xx, first.grad)
        torch.testing.assert_close(seen.cpu(), prev_ref.sum(), rtol=1e-5, atol=1e-6, msg=f"call {i}")
        ref_opt.zero_grad()
        ref(x).square().mean().backward()
        ref_opt.step()
        prev_ref = ref[0].weight.grad.clone()
    assert debug.counter_value("CompiledReplay") > 0
    torch.testing.assert_close(first.grad.cpu(), prev_ref, rtol=1e-5, atol=1e-6)


def test_a_gradient_placed_elsewhere_between_calls_is_not_donated(devices8):
    """The old value no longer fits the program's buffer: a new buffer is used and the step stays right."""
    ref, model, x, step = _setup(fsdp=False)
    xx = x.to("xla")
    losses = [step(xx).item() for _ in range(3)]
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    w = model[0].weight
    mark_sharding(w.grad, mesh, ("fsdp", None))
    spmdtorch.sync()
    moved = w.grad._st.value
    kept = w.grad.cpu()
    losses.append(step(xx).item())
    assert not moved.is_deleted()
    torch.testing.assert_close(torch.from_numpy(np.array(moved)), kept)
    losses += [step(xx).item() for _ in range(2)]
    _assert_matches_eager(model, ref, losses, _eager(ref, x, 6))


def test_a_step_that_draws_random_numbers_reuses_gradient_buffers_too():
    """The random key is an argument after the leaves; the recycled buffers come after it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Dropout(0.5), torch.nn.Linear(32, 4)).to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16).to("xla")

    @spmdtorch.compile
    def step(inp):
        opt.zero_grad()
        model(inp).square().mean().backward()
        opt.step()
        return model[1](torch.ones(4, 8, device="xla"))  # a fresh draw each call

    masks = []
    for _ in range(3):
        masks.append(step(x).cpu())
    for _ in range(3):
        old = _grad_arrays(model)
        masks.append(step(x).cpu())
        assert all(a.is_deleted() for a in old)
    assert debug.counter_value("CompiledReplay") >= 3
    assert len({tuple(m.flatten().tolist()) for m in masks}) == len(masks)  # every call drew anew
    assert all(set(m.unique().tolist()) <= {0.0, 2.0} for m in masks)


def test_zero_grad_without_set_to_none_keeps_gradient_buffers():
    """zero_grad(set_to_none=False) keeps the gradient tensors; a replay still allocates no new ones."""
    ref = _model()
    model = copy.deepcopy(ref).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(8, 2, 16)

    @spmdtorch.compile
    def step(inp):
        opt.zero_grad(set_to_none=False)
        loss = model(inp).square().mean()
        loss.backward()
        opt.step()
        return loss

    xx = x.to("xla")
    losses = [step(xx).item() for _ in range(3)]
    for _ in range(3):
        old = _grad_arrays(model)
        losses.append(step(xx).item())
        assert all(a.is_deleted() for a in old), "a gradient's old buffer was not reused"
    assert debug.counter_value("CompiledReplay") >= 3
    _assert_matches_eager(model, ref, losses, _eager(ref, x, 6))


def test_state_overwritten_without_being_read_reuses_its_buffer():
    """A buffer the step overwrites (``copy_``) and never reads: its old array takes the new value."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 8)
    ref_lin = copy.deepcopy(lin)
    lin = lin.to("xla")
    last = torch.zeros(4, 8, device="xla")
    spmdtorch.sync()

    @spmdtorch.compile
    def step(inp):
        out = lin(inp)
        last.copy_(out.detach() * 2)
        return out.sum()

    xs = [torch.randn(4, 16) for _ in range(6)]
    for i, x in enumerate(xs):
        old = last._st.value
        total = step(x.to("xla"))
        want = ref_lin(x)
        torch.testing.assert_close(total.cpu(), want.sum().detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(last.cpu(), want.detach() * 2, rtol=1e-5, atol=1e-5)
        assert old.is_deleted(), f"call {i}: the old buffer was not reused"
    assert debug.counter_value("CompiledReplay") >= 3
