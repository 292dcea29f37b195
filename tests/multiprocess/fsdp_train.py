"""FSDPv2 training of the tiny Llama, on one process or several.

Every process runs this same file; each loads only its part of every global
batch (``DistributedSampler`` + ``MpDeviceLoader(minibatch=True)``), so with
P processes each reads ``GLOBAL_BATCH / P`` rows and the step sees the same
global batch (the same rows; their order differs, which the mean loss
ignores up to float rounding).

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 tests/multiprocess/fsdp_train.py

prints ``RESULT {"losses": [...], ...}`` on every rank.
tests/multiprocess/test_multiprocess.py also imports it to run the same
training in the pytest process (1 process x 8 devices) and eagerly on CPU.
"""

from __future__ import annotations

import functools
import json

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STEPS = 3
GLOBAL_BATCH = 8
SEQ_LEN = 16
LR = 1e-2


def dataset() -> TensorDataset:
    """STEPS global batches of random tokens, the same in every process."""
    from spmdtorch.models.llama import LlamaConfig

    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randint(0, LlamaConfig.tiny().vocab_size, (STEPS * GLOBAL_BATCH, SEQ_LEN), generator=g))


def make_model() -> torch.nn.Module:
    from spmdtorch.models.llama import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig.tiny())


def train_spmd() -> list[float]:
    """FSDPv2 training over every device of the job; returns the loss per step."""
    import spmdtorch
    import spmdtorch.runtime as xr
    from spmdtorch.data import MpDeviceLoader
    from spmdtorch.mesh import Mesh
    from spmdtorch.models.llama import DecoderLayer, causal_lm_loss
    from spmdtorch.partition import FSDPv2, ShardingSpec, transformer_auto_wrap_policy

    n, procs = xr.global_runtime_device_count(), xr.process_count()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(make_model().to("xla"), mesh=mesh, auto_wrap_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    ds = dataset()
    sampler = DistributedSampler(ds, num_replicas=procs, rank=xr.process_index(), shuffle=False)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // procs, sampler=sampler)
    device_loader = MpDeviceLoader(
        loader, spmdtorch.device(), input_sharding=ShardingSpec(mesh, ("fsdp", None), minibatch=True)
    )
    losses = []
    for (tokens,) in device_loader:  # the loader syncs (mark_step) before each batch
        assert tokens.shape == (GLOBAL_BATCH, SEQ_LEN), tokens.shape
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        losses.append(loss)
    return [loss.item() for loss in losses]


def train_eager() -> list[float]:
    """The same training in eager CPU torch (the reference)."""
    from spmdtorch.models.llama import causal_lm_loss

    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens_all = dataset().tensors[0]
    losses = []
    for k in range(STEPS):
        tokens = tokens_all[k * GLOBAL_BATCH : (k + 1) * GLOBAL_BATCH]
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


if __name__ == "__main__":
    import spmdtorch.runtime as xr

    xr.initialize_distributed()
    result = {
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "devices": xr.global_runtime_device_count(),
        "local_devices": xr.addressable_runtime_device_count(),
        "losses": train_spmd(),
    }
    print("RESULT " + json.dumps(result), flush=True)
