"""spmdtorch.compile: a replayed step writes the gradients it keeps into their old buffers.

``opt.zero_grad()`` inside the step drops last step's gradients and backward
makes new ones; on a replay the program takes the old gradient arrays as
donated, unused arguments and writes the new values into them instead of
allocating new buffers (``executor.Recycled``). These tests check that the
buffers really are reused, that the values stay those of eager CPU torch, and
that an old gradient that is shared, passed in, or re-placed between calls is
never donated.
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
