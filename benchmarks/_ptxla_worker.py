"""``train_step.py``'s PyTorch/XLA worker: the same step under PyTorch/XLA's SPMD lazy tensors.

Run by the driver (``train_step.py --modes ...,ptxla --ptxla-python PY``) with
an interpreter that has torch_xla and the torch it was built for (PyTorch/XLA
2.9 needs torch 2.9, spmdtorch's environment has a newer torch), never by hand.
It builds the same model, weights and batch (``_train_setup.setup``), wraps it
the way PyTorch/XLA's documentation does (``SpmdFullyShardedDataParallel``, one
wrapper per decoder layer, on an 8-device ``"fsdp"`` mesh, the batch sharded on
its first dim), and trains it with ``torch.optim.AdamW``, one
``torch_xla.sync()`` per step: PyTorch/XLA's lazy mode, which spmdtorch's
``with spmdtorch.step():`` mode replaces.

On a machine without an accelerator it runs on PyTorch/XLA's CPU client with
as many devices as the other workers simulate (``CPU_NUM_DEVICES``).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import tempfile
import time

import _train_setup as ts

_CPU_DEVICES = 8  # as train_step.py's workers simulate


def _shard_numel(t, spec: str) -> int:
    """Elements of ``t`` one device holds, from PyTorch/XLA's sharding spec (``{devices=[8,1]0,1,...}``)."""
    m = re.search(r"devices=\[([\d,]+)\]", spec)
    if m is None:  # "{replicated}" or no sharding: the whole tensor on every device
        return t.numel()
    tiles = [int(x) for x in m.group(1).split(",")]
    if "last_tile_dim_replicate" in spec:
        tiles = tiles[:-1]
    return math.prod(-(-size // n) for size, n in zip(t.shape, tiles))


def session_ptxla(cfg_name: str, warmup: int, zero_grad_after: bool = False, dtype: str | None = None) -> ts.Session:
    # Before torch_xla's import, which picks the PJRT client from these; the
    # driver's environment simulates 8 CPU devices for JAX, CPU_NUM_DEVICES
    # is PyTorch/XLA's name for the same.
    if os.environ.get("PJRT_DEVICE", "CPU") == "CPU":
        os.environ["PJRT_DEVICE"] = "CPU"
        os.environ.setdefault("CPU_NUM_DEVICES", str(_CPU_DEVICES))
    import functools

    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.debug.profiler as xp
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    xr.use_spmd()
    n = xr.global_runtime_device_count()
    llama = ts.llama_module()
    cfg, model, tokens = ts.setup(cfg_name, n, dtype=dtype)
    device = torch_xla.device()
    mesh = xs.Mesh(np.arange(n), (n,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={llama.DecoderLayer})
    model = SpmdFullyShardedDataParallel(model.to(device), mesh=mesh, auto_wrap_policy=policy)
    opt = torch.optim.AdamW(model.parameters(), lr=ts.LR, betas=ts.BETAS, eps=ts.EPS, weight_decay=ts.WD)
    tok = tokens.to(device)
    xs.mark_sharding(tok, mesh, ("fsdp", None))

    train_step = ts.make_train_step(model, opt, zero_grad_after)

    def step():
        loss = train_step(tok)
        torch_xla.sync()
        return loss

    def compiles() -> int:
        data = met.metric_data("CompileTime")
        return 0 if data is None else int(data[0])

    t0 = time.perf_counter()
    losses = [step().item()]
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        losses.append(step().item())
    warm = time.perf_counter() - t0

    def run_block(steps):
        xm.wait_device_ops()
        for _ in range(steps):
            step()
        xm.wait_device_ops()

    def finish():
        host = []
        for _ in range(ts.HOST_STEPS):  # an idle device: tracing + graph hash + launch, no back-pressure
            xm.wait_device_ops()
            h = time.perf_counter()
            loss = step()
            host.append(time.perf_counter() - h)
        losses.append(loss.item())
        state = list(model.parameters()) + [
            v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.device == device
        ]
        per_device = sum(_shard_numel(t, torch_xla._XLAC._get_xla_sharding_spec(t)) * t.element_size() for t in state)
        total = sum(t.numel() * t.element_size() for t in state)
        hw = xm.xla_device_hw(device)
        # A trace of a few more steps (PyTorch/XLA's profiler writes the same
        # XSpace as JAX's): the driver reads the devices' idle share off it.
        trace_dir = tempfile.mkdtemp(prefix="ptxla-trace-")
        xp.start_trace(trace_dir)
        run_block(ts.TRACE_STEPS)
        xp.stop_trace()
        return {
            "host_ms": statistics.median(host) * 1e3,
            "trace_dir": trace_dir,
            "aten_ops": 0,  # not counted: PyTorch/XLA records in C++
            "per_device": per_device,
            "total": total,
            "args": None,  # PyTorch/XLA exposes no memory analysis of its compiled graph
            "temp": None,
            "compiles": compiles(),
            "devices": n,
            "device_kind": hw,
            "platform": hw.lower(),
            "peak_flops": None,
            "flops": ts.model_flops(cfg, *tokens.shape),
            "tokens": int(tokens.numel()),
        }

    return ts.Session(first, warm, losses, run_block, finish)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", choices=("ptxla",), required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--first-only", action="store_true")
    p.add_argument("--zero-grad-after", action="store_true")
    p.add_argument("--dtype", default=None)
    args = p.parse_args(argv)
    warmup = 1 if args.first_only else ts.WARMUP_STEPS
    ts.serve(session_ptxla(args.config, warmup, args.zero_grad_after, args.dtype), args.first_only)


if __name__ == "__main__":
    main()
