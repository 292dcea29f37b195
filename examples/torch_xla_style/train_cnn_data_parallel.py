"""A data-parallel CNN with ``MpDeviceLoader``, written as PyTorch/XLA's SPMD data-parallel example writes it.

Nothing here imports spmdtorch: run it unchanged under the compatibility layer,

    python -m spmdtorch.compat examples/torch_xla_style/train_cnn_data_parallel.py --epochs 2

The batch (images and labels) is split over the ``data`` mesh axis by the
loader; the parameters are replicated, and the partitioner all-reduces their
gradients, so ``optimizer.step()`` needs no ``xm.optimizer_step``-style
reduction (it is called anyway, as multiprocess scripts do).
"""

import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

xr.use_spmd()


class CNN(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    num_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.array(range(num_devices)), (num_devices, 1), ("data", "model"))
    device = torch_xla.device()

    # Learnable fake data: the label is the quadrant holding the brightest patch.
    images = torch.randn(args.samples, 1, 16, 16) * 0.1
    labels = torch.randint(0, 4, (args.samples,))
    for i, c in enumerate(labels.tolist()):
        r, q = divmod(c, 2)
        images[i, 0, r * 8 : r * 8 + 8, q * 8 : q * 8 + 8] += 1.0
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True, drop_last=True
    )
    # One spec applies to the tensors of its rank: the images; the labels stay replicated.
    train_loader = pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ("data", None, None, None)))

    model = CNN().to(device)
    loss_fn = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    epoch_losses = []
    for epoch in range(args.epochs):
        model.train()
        total = torch.zeros((), device=device)
        for data, target in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
            total += loss.detach()
        epoch_losses.append(total.item() / len(train_loader))
        xm.master_print(f"epoch {epoch} mean loss {epoch_losses[-1]:.4f}")

    model.eval()
    with torch.no_grad():
        correct = 0
        for data, target in train_loader:
            correct += (model(data).argmax(dim=1) == target).sum()
        accuracy = correct.item() / (len(loader) * args.batch_size)
    print(f"input sharding: {torch_xla._XLAC._get_xla_sharding_spec(data)}")
    print(f"first -> last loss: {epoch_losses[0]:.4f} -> {epoch_losses[-1]:.4f}")
    print(f"train accuracy: {accuracy:.3f}")
    print(f"compilations: {met.metric_data('CompileTime')[0]}")


if __name__ == "__main__":
    main()
