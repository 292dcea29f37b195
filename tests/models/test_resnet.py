"""A ResNet-style CNN trains on xla with the same numbers as eager CPU torch.

torchvision is not a dependency (its wheels pin one torch release each), so
the network is the torchvision ``BasicBlock`` design written out: 3x3 conv,
batch norm, ReLU, a residual add, a strided 1x1-conv downsample where the
shape changes, adaptive average pooling and a linear head. Training mode
exercises batch norm's batch statistics and running-statistics updates (the
buffers are compared too), SGD with momentum and weight decay.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from model_parity import check_training_parity
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    """Stem (conv, bn, relu, max pool), two stages of BasicBlocks, pool, fc.

    One block per stage: XLA's CPU compile time grows with every convolution
    (forward and two backward), and one identity block plus one downsampling
    block cover every code path of a deeper ResNet.
    """

    def __init__(self, num_classes=5, width=8):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        self.layer1 = BasicBlock(width, width)
        self.layer2 = BasicBlock(width, 2 * width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def make_resnet():
    torch.manual_seed(0)
    return ResNet()


def batches(steps=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 3, 16, 16, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(steps)]


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


# Lazily in the slow tier (10 s): the lowerings are the same in both modes.
@pytest.mark.parametrize("mode", [pytest.param("lazy", marks=pytest.mark.slow), "compiled"])
def test_resnet_trains_like_eager(mode):
    ref, model = check_training_parity(
        make_resnet,
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
        batches(),
        loss_fn,
        mode,
    )
    # Eval mode normalises with the running statistics the training updated.
    ref.eval()
    model.eval()
    x = batches(5)[4][0]
    with torch.no_grad():
        torch.testing.assert_close(model(x.to("xla")).cpu(), ref(x), rtol=1e-5, atol=1e-5)


def test_first_conv_backward_without_input_gradient():
    # The stem's input needs no gradient, so autograd asks convolution_backward
    # for the weight gradient only (output_mask [False, True, False]); the
    # engine once crashed pairing the lowering's None outputs with torch's.
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
    x = torch.randn(2, 3, 8, 8)
    conv(x).square().sum().backward()
    xconv = nn.Conv2d(3, 4, 3, padding=1, bias=False).to("xla")
    xconv.load_state_dict({"weight": conv.weight.detach().to("xla")})
    xconv(x.to("xla")).square().sum().backward()
    torch.testing.assert_close(xconv.weight.grad.cpu(), conv.weight.grad, rtol=1e-5, atol=1e-5)
