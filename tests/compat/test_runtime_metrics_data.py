"""Runtime names, metrics with PyTorch/XLA's shapes, data loading, profiler and checkpoint names."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from _models import MNIST, assert_params_close, mnist_batches, train_eager

import spmdtorch.checkpoint


def test_runtime_names_count_spmd_virtual_devices():
    import torch_xla.runtime as xr

    xr.use_spmd()
    assert xr.is_spmd()
    assert xr.world_size() == 1 and xr.global_ordinal() == 0 and xr.local_ordinal() == 0
    assert xr.local_process_count() == 1 and xr.local_device_count() == 1
    assert xr.addressable_device_count() == 1 and xr.global_device_count() == 1
    assert xr.global_runtime_device_count() == 8 and xr.addressable_runtime_device_count() == 8
    assert (xr.process_index(), xr.process_count(), xr.host_index()) == (0, 1, 0)
    assert xr.device_type() == "CPU" and xr.is_bf16_supported()
    try:
        xr.use_spmd(auto=True)  # spmdtorch's own auto-sharding (tests/test_auto_sharding.py)
        assert xr_runtime().auto_sharding_enabled()
    finally:
        xr_runtime().set_auto_sharding(False)


def xr_runtime():
    from spmdtorch import runtime

    return runtime


def test_runtime_names_follow_torchrun_locals(monkeypatch):
    import torch_xla.runtime as xr

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert xr.local_process_count() == 4 and xr.local_device_count() == 4 and xr.local_ordinal() == 3
    import torch_xla.core.xla_model as xm

    assert not xm.is_master_ordinal(local=True) and xm.is_master_ordinal(local=False)


def test_metrics_report_snippets_and_shapes():
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met

    met.clear_all()
    assert met.counter_names() == [] and met.metric_names() == []
    assert met.counter_value("MarkStep") is None and met.metric_data("CompileTime") is None
    t = torch.ones(8, device=xm.xla_device())
    for _ in range(3):
        t = t * 2
        xm.mark_step()
    assert met.counter_value("MarkStep") == 3
    assert t.sum().item() == 64.0
    total_samples, accumulator, samples = met.metric_data("ExecuteTime")
    assert total_samples == len(samples) >= 3
    assert all(isinstance(ts, float) and ts > 1e9 and v > 0 for ts, v in samples)  # (epoch seconds, ns)
    assert accumulator == pytest.approx(sum(v for _, v in samples))
    assert met.counter_value("CachedCompile") >= 1
    # For short report that only contains a few key metrics.
    short = met.short_metrics_report()
    assert "Metric: CompileTime" in short and "Counter: MarkStep" in short and "UncachedCompile" not in short
    assert met.short_metrics_report(["UncachedCompile"], ["ExecuteTime"]).split("\n")[0] == "Metric: ExecuteTime"
    # For full report that includes all metrics.
    assert "Counter: UncachedCompile" in met.metrics_report()
    met.clear_metrics()
    assert met.metric_names() == [] and met.counter_value("MarkStep") >= 3
    met.clear_counters()
    assert met.counter_names() == []
    xm.mark_step()
    met.clear_all()
    assert met.counter_names() == [] and met.metric_names() == []


def test_mp_device_loader_trains_as_eager_cpu():
    import torch_xla
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    torch.manual_seed(0)
    cpu_model = MNIST()
    batches = mnist_batches(4)
    ref_model, ref_losses = train_eager(cpu_model, batches)

    device = torch_xla.device()
    mesh = xs.Mesh(np.array(range(xr.global_runtime_device_count())), (8, 1), ("data", "model"))
    mp_device_loader = pl.MpDeviceLoader(
        batches, device, input_sharding=xs.ShardingSpec(mesh, ("data", None, None, None))
    )
    model = copy.deepcopy(cpu_model).train().to(device)
    loss_fn = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for data, target in mp_device_loader:
        assert torch_xla._XLAC._get_xla_sharding_spec(data) == "{devices=[8,1,1,1]0,1,2,3,4,5,6,7}"
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    torch.testing.assert_close([x.item() for x in losses], ref_losses, rtol=1e-4, atol=1e-5)
    assert_params_close(model, ref_model)


def test_parallel_loader_per_device_loader():
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.parallel_loader as pl

    device = xm.xla_device()
    cpu = [torch.full((4, 2), float(i)) for i in range(6)]
    loader = pl.ParallelLoader(cpu, [device], batches_per_execution=2, loader_prefetch_size=2, device_prefetch_size=1)
    met.clear_all()
    got = [b.cpu() for b in loader.per_device_loader(device)]
    for a, b in zip(got, cpu):
        torch.testing.assert_close(a, b)
    assert len(got) == 6 and met.counter_value("MarkStep") >= 3  # one barrier per 2 batches, as PyTorch/XLA


def test_profiler_trace_and_step_trace(tmp_path):
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.debug.profiler as xp

    logdir = tmp_path / "profile"
    server = xp.start_server(9012)  # as PyTorch/XLA's guide does before capturing
    assert server is not None
    try:
        thread = xp.trace_detached("localhost:9012", str(logdir), duration_ms=1500)
        time.sleep(0.3)
        met.clear_all()
        w = torch.ones(16, 16, device=xm.xla_device())
        for step in range(3):
            with xp.StepTrace("train_step", step_num=step):
                with xp.Trace("forward"):
                    w = w @ w * 0.1
        assert met.counter_value("MarkStep") == 3  # leaving a StepTrace is a barrier
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        xp.stop_server()  # a running server turns on annotations for the rest of the process
    traces = list(logdir.rglob("*.xplane.pb"))
    assert traces and traces[0].stat().st_size > 0


def test_distributed_checkpoint_names_map_to_spmdtorch_checkpoint():
    import torch_xla.experimental.distributed_checkpoint as xc

    from spmdtorch.checkpoint import distributed_checkpoint as native

    for name in ("SPMDSavePlanner", "SPMDLoadPlanner", "CheckpointManager", "prime_optimizer"):
        assert getattr(xc, name) is getattr(native, name)
    # PyTorch/XLA's manager signature, not spmdtorch's native one.
    assert xc.CheckpointManager is spmdtorch.checkpoint.XlaCheckpointManager


def test_experimental_assume_pure_and_scan_map_to_spmdtorch():
    import torch
    from torch_xla.experimental.assume_pure import assume_pure

    import spmdtorch

    assert assume_pure is spmdtorch.assume_pure
    pure = assume_pure(lambda a, b: a @ b + 1)
    a = torch.ones(2, 2, device="xla")
    assert [pure(a, a).cpu().tolist() for _ in range(2)][1] == [[3.0, 3.0], [3.0, 3.0]]
    assert pure.cache_size() == 1
    from torch_xla.experimental.scan import scan
    from torch_xla.experimental.scan_layers import scan_layers

    assert scan is spmdtorch.scan and scan_layers is spmdtorch.scan_layers
