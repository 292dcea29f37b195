"""Small models and an eager-CPU reference trainer shared by the compat tests."""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F


class MNIST(nn.Module):
    """The API guide's ``MNIST()``: a small conv net on 1x12x12 images."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.fc1 = nn.Linear(4 * 5 * 5, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def mnist_batches(n=4, batch=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 12, 12, generator=g), torch.randint(0, 10, (batch,), generator=g)) for _ in range(n)]


def train_eager(model, batches, lr=0.05, momentum=0.5):
    """The guide's loop on CPU, eagerly: the reference every xla run is compared with."""
    model = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for data, target in batches:
        opt.zero_grad()
        loss = nn.NLLLoss()(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def assert_params_close(xla_model, cpu_model, rtol=1e-4, atol=1e-5):
    for (name, p), q in zip(xla_model.named_parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=rtol, atol=atol, msg=name)
