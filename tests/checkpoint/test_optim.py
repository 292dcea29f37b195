"""init_optimizer_state: state entries for a fresh optimizer, parameters untouched."""

from __future__ import annotations

import pytest
import torch

from spmdtorch.checkpoint import init_optimizer_state


def test_creates_state_without_changing_parameters():
    model = torch.nn.Linear(3, 2).to("xla")
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5)
    init_optimizer_state(opt)
    assert sorted(opt.state_dict()["state"]) == [0, 1]
    assert opt.param_groups[0]["lr"] == 0.1 and all(p.grad is None for p in model.parameters())
    for k, v in model.state_dict().items():
        assert torch.equal(v.cpu(), before[k]), k


def test_refuses_existing_gradients():
    model = torch.nn.Linear(3, 2).to("xla")
    model.weight.grad = torch.ones(2, 3, device="xla")
    with pytest.raises(ValueError, match=r"shape \(2, 3\).*zero_grad"):
        init_optimizer_state(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
