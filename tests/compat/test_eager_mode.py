"""``torch_xla.experimental.eager_mode`` and friends: accepted, remembered, and the numbers equal eager CPU torch's."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from spmdtorch.compat._eager import EagerModeTypeError


def test_flag_and_context_restore():
    import torch_xla.experimental as exp
    from torch_xla.experimental.eager import eager_mode_context, is_eager_mode

    assert exp.is_eager_mode is is_eager_mode
    exp.eager_mode(False)
    with eager_mode_context(True) as before:
        assert before is False and is_eager_mode()
        with eager_mode_context(False) as inner_before:
            assert inner_before is True and not is_eager_mode()
        assert is_eager_mode()
    assert not is_eager_mode()
    with pytest.raises(EagerModeTypeError, match="enable must be a bool, got str"):
        exp.eager_mode("yes")


def test_training_in_eager_mode_matches_eager_cpu(devices8):
    """PyTorch/XLA's examples/eager pattern: eager_mode(True), an uncompiled and a compiled step."""
    import torch_xla
    import torch_xla.experimental as exp

    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    xla = copy.deepcopy(cpu).to("xla")
    opt_c, opt_x = (torch.optim.Adam(m.parameters(), lr=0.01) for m in (cpu, xla))

    def step(model, opt, x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss

    compiled = torch_xla.compile(lambda x, y: step(xla, opt_x, x, y))
    with exp.eager_mode_context(True):
        for i in range(4):
            x, y = torch.randn(3, 4), torch.randn(3, 2)
            ref = step(cpu, opt_c, x, y)
            got = step(xla, opt_x, x.to("xla"), y.to("xla")) if i % 2 else compiled(x.to("xla"), y.to("xla"))
            torch.testing.assert_close(got.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    for p, q in zip(xla.parameters(), cpu.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
