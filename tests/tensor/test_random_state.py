"""The xla RNG state: torch.utils.checkpoint, fork_rng and get/set_rng_state replay xla draws."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

import spmdtorch
from spmdtorch import debug
from spmdtorch.tensor import random_state
from spmdtorch.tensor.random_state import XlaRngStateError


def test_torch_sees_the_xla_device_module(devices8):
    assert torch.get_device_module("xla") is random_state.device_module


def test_restoring_a_state_replays_the_draws(devices8):
    state = torch.xla.get_rng_state()
    a = torch.rand(5, device="xla")
    b = torch.randn(5, device="xla")
    torch.xla.set_rng_state(state)
    a2 = torch.rand(5, device="xla")
    b2 = torch.randn(5, device="xla")
    torch.testing.assert_close(a2.cpu(), a.cpu(), rtol=0, atol=0)
    torch.testing.assert_close(b2.cpu(), b.cpu(), rtol=0, atol=0)


def test_a_program_boundary_ends_the_restored_stream(devices8):
    """Documented: after sync() the device is back on program keys (fresh draws, same graph each step)."""
    state = torch.xla.get_rng_state()
    a = torch.rand(5, device="xla")
    torch.xla.set_rng_state(state)
    spmdtorch.sync()
    assert not torch.equal(torch.rand(5, device="xla").cpu(), a.cpu())


def test_a_state_replays_in_a_later_program(devices8):
    state = torch.xla.get_rng_state()
    a = torch.rand(5, device="xla").cpu()  # runs the program: the state's key is now concrete
    torch.xla.set_rng_state(state)
    torch.testing.assert_close(torch.rand(5, device="xla").cpu(), a, rtol=0, atol=0)


def test_fork_rng_restores_the_xla_state(devices8):
    torch.xla.get_rng_state()
    with torch.random.fork_rng(device_type="xla"):
        inside = torch.rand(4, device="xla")
    after = torch.rand(4, device="xla")
    torch.testing.assert_close(after.cpu(), inside.cpu(), rtol=0, atol=0)


def test_each_step_still_draws_fresh_numbers_and_compiles_once(devices8):
    draws = []
    compiles = debug.counter_value("UncachedCompile")
    for _ in range(3):
        with spmdtorch.step():
            state = torch.xla.get_rng_state()
            x = torch.rand(64, device="xla")
            torch.xla.set_rng_state(state)
            y = torch.rand(64, device="xla")
        torch.testing.assert_close(x.cpu(), y.cpu(), rtol=0, atol=0)
        draws.append(x.cpu())
    assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[1], draws[2])
    assert debug.counter_value("UncachedCompile") - compiles <= 1


def test_bad_state_is_a_named_error(devices8):
    with pytest.raises(XlaRngStateError, match="XlaRngState"):
        torch.xla.set_rng_state(torch.get_rng_state())


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("sync_between", [False, True])
def test_torch_utils_checkpoint_replays_dropout(devices8, reentrant, sync_between):
    """The recomputation draws the forward's mask: d sum(dropout(x*w)) / dw == sum(y / w)."""
    torch.manual_seed(0)
    w = torch.nn.Parameter((torch.rand(8) + 0.5).to("xla"))
    x = (torch.rand(64, 8) + 0.5).to("xla").requires_grad_(reentrant)  # reentrant needs a grad input
    y = tuc.checkpoint(lambda x: F.dropout(x * w, 0.5, training=True), x, use_reentrant=reentrant)
    if sync_between:
        y.sum().item()
    y.sum().backward()
    y = y.detach().cpu()
    assert 0.3 < (y == 0).float().mean() < 0.7
    torch.testing.assert_close(w.grad.cpu(), (y / w.detach().cpu()).sum(0), rtol=1e-5, atol=1e-5)
