"""``torch_xla._XLAC`` calls and ``torch_xla.debug.metrics`` names, as PyTorch/XLA's test suite and Hugging Face use them."""

from __future__ import annotations

import numpy as np
import pytest
import torch


@pytest.fixture
def xla():
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    return torch_xla, xs, met


def _mesh(xs, shape):
    return xs.Mesh(np.arange(int(np.prod(shape))), shape)


# --- _XLAC -----------------------------------------------------------------------------------------------------


def test_debug_info_of_computed_pending_and_sharded_tensors(xla):
    torch_xla, xs, _ = xla
    X = torch_xla._XLAC
    t = torch.randn(8, 32).to("xla")
    torch_xla.sync()  # uploads it (before, it is still on the host: test_virtual_device_debug_info.py)
    info = X._get_xla_tensor_debug_info(t)
    for field in ("XLATensor {", "Device: SPMD:0", "XLA Shape: f32[8,32]", "ShardingSpec: None", "xla::device_data"):
        assert field in info
    assert "NumShards: 8" in info and "OpSharding: {replicated}" in info and "Tensor on host: None" in info

    xs.mark_sharding(t, _mesh(xs, (1, 8)), (0, 1))
    u = t / 0.5
    pending = X._get_xla_tensor_debug_info(u)
    assert "IR: [] aten::div" in pending and "XLAData: None" in pending
    torch_xla.sync(wait=True)
    done = X._get_xla_tensor_debug_info(u)
    assert "aten::div" not in done and "XLAShardedData" in done
    spec = X._get_xla_sharding_spec(t)
    assert spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    assert f"OpSharding: {spec}" in X._get_xla_tensor_debug_info(t)
    assert X._get_xla_tensor_debug_info(torch.ones(2)) == "Not a XLATensor\n"


def test_tensor_id_is_stable_per_tensor_and_shared_by_tied_weights(xla):
    torch_xla, _, _ = xla
    from transformers.pytorch_utils import id_tensor_storage

    X = torch_xla._XLAC
    a = torch.ones(4, device="xla")
    b = torch.ones(4, device="xla")
    assert X._xla_get_tensor_id(a) == X._xla_get_tensor_id(a)
    assert X._xla_get_tensor_id(a) != X._xla_get_tensor_id(b)
    emb = torch.nn.Embedding(4, 3).to("xla")
    head = torch.nn.Linear(3, 4, bias=False).to("xla")
    head.weight = emb.weight  # tied, as a language model's input and output embeddings
    other = torch.nn.Linear(3, 4, bias=False).to("xla")
    # transformers' shared-tensor detection (save_pretrained) goes through _xla_get_tensor_id on xla
    assert id_tensor_storage(head.weight) == id_tensor_storage(emb.weight)
    assert id_tensor_storage(other.weight) != id_tensor_storage(emb.weight)
    with pytest.raises(TypeError, match="expected a tensor on the xla device"):
        X._xla_get_tensor_id(torch.ones(2))


def test_sharding_spec_and_type(xla):
    torch_xla, xs, _ = xla
    X = torch_xla._XLAC
    plain = torch.zeros(8, 8, device="xla")
    assert X._get_xla_sharding_spec(plain) == "" and X._get_xla_sharding_type(plain) is None
    replicated = torch.zeros(8, 8, device="xla")
    xs.mark_sharding(replicated, _mesh(xs, (1, 8)), (None, None))
    assert X._get_xla_sharding_spec(replicated) == "{replicated}"
    assert X._get_xla_sharding_type(replicated) == int(xs.ShardingType.REPLICATED)
    tiled = torch.zeros(8, 8, device="xla")
    xs.mark_sharding(tiled, _mesh(xs, (8, 1)), (0, 1))
    assert X._get_xla_sharding_type(tiled) == int(xs.ShardingType.TILED)


def test_graph_hash_follows_the_graph(xla):
    torch_xla, xs, _ = xla
    X = torch_xla._XLAC
    a = torch.ones(8, 8, device="xla")
    b = torch.ones(8, 8, device="xla")
    assert X._get_graph_hash([a + 1]) == X._get_graph_hash([b + 1])
    assert X._get_graph_hash([a + 1]) != X._get_graph_hash([a * 2])
    xs.mark_sharding(b, _mesh(xs, (8, 1)), (0, 1))
    assert X._get_graph_hash([a + 1]) != X._get_graph_hash([b + 1])  # the sharding is part of the graph
    assert len(X._get_graph_hash([a + 1])) == 16


@pytest.mark.parametrize("spec, global_shape", [((None,), None), ((0,), (32,))])
def test_global_tensor_from_cpu_shards(xla, spec, global_shape):
    torch_xla, xs, _ = xla
    mesh = _mesh(xs, (8,))
    if global_shape is None:
        shards = [torch.arange(4.0)] * 8
        expected = shards[0]
    else:
        shards = [torch.arange(4.0) + 10 * i for i in range(8)]
        expected = torch.cat(shards)
    t = torch_xla._XLAC._global_tensor_from_cpu_shards(shards, mesh.get_op_sharding(spec), global_shape)
    torch.testing.assert_close(t.cpu(), expected)
    want = "{replicated}" if global_shape is None else "{devices=[8]0,1,2,3,4,5,6,7}"
    assert torch_xla._XLAC._get_xla_sharding_spec(t) == want
    with pytest.raises(TypeError, match="OpSharding of mesh.get_op_sharding"):
        torch_xla._XLAC._global_tensor_from_cpu_shards(shards, "not a sharding")


def test_small_xlac_calls(xla):
    torch_xla, _, _ = xla
    from spmdtorch import runtime

    X = torch_xla._XLAC
    before = runtime.is_distributed_initialized()
    assert X._ensure_xla_coordinator_initialized(0, 1, "localhost") is None  # one process: nothing to join
    assert runtime.is_distributed_initialized() == before
    assert X._xla_get_auto_sharding() is False
    assert X._is_placecholder(torch.ones(2, device="xla")) is False
    assert "Counter:" in X._xla_metrics_report() or X._xla_metrics_report() == ""


# --- metrics under PyTorch/XLA's names -------------------------------------------------------------------------


def test_execute_replicated_counts_programs(xla):
    torch_xla, _, met = xla
    t = torch.ones(4, device="xla")
    torch_xla.sync(wait=True)
    met.clear_all()
    assert met.counter_value("ExecuteReplicated") is None and "ExecuteReplicated" not in met.counter_names()
    t += 1
    torch_xla.sync(wait=True)
    assert met.counter_value("ExecuteReplicated") == 1
    assert "ExecuteReplicated" in met.counter_names()
    assert met.counter_value("ExecuteComputation") is None  # SPMD: never the single-device path
    count, total_ns, samples = met.metric_data("ExecuteReplicatedTime")
    assert count == 1 and total_ns > 0 and len(samples) == 1
    assert "ExecuteReplicatedTime" in met.metric_names()
    assert "Counter: ExecuteReplicated\n  Value: 1" in met.metrics_report()
    assert "Metric: ExecuteReplicatedTime" in met.short_metrics_report()


def test_transfers_count_as_virtual_device_usage_and_data_metrics(xla):
    torch_xla, _, met = xla
    met.clear_all()
    assert met.metric_data("OutboundData") is None
    cpu = torch.randn(8, 8)
    t = cpu.to("xla")
    assert not met.counter_value("VirtualDeviceUsage")  # still on the host until first used
    torch_xla.sync()  # a sync uploads it
    assert met.counter_value("VirtualDeviceUsage") == 1
    count, nbytes, _ = met.metric_data("OutboundData")
    assert (count, nbytes) == (1, cpu.nelement() * cpu.element_size())
    assert "TransferToDeviceTime" in met.metric_names() and "OutboundData" in met.metric_names()
    back = (t * 2).cpu()
    torch.testing.assert_close(back, cpu * 2)
    count, nbytes, _ = met.metric_data("InboundData")
    assert count >= 1 and nbytes >= back.nelement() * back.element_size()
    met.clear_metrics()  # data metrics are metrics: cleared; the counters stay
    assert met.metric_data("OutboundData") is None and "InboundData" not in met.metric_names()
    assert met.counter_value("VirtualDeviceUsage") == 1
    (t + 1).cpu()
    assert met.metric_data("InboundData")[0] == 1


def test_executed_fallback_ops_names_the_cpu_ops(xla):
    torch_xla, _, met = xla
    met.clear_all()
    assert met.executed_fallback_ops() == []
    x = torch.arange(6, device="xla")
    got = torch.nonzero(x > 2).cpu()
    torch.testing.assert_close(got, torch.nonzero(torch.arange(6) > 2))
    assert met.executed_fallback_ops() == ["aten::nonzero"]
    assert torch_xla._XLAC._get_executed_fallback_ops() == ["aten::nonzero"]


def test_top_level_real_devices_and_logger(xla):
    import logging

    import torch_xla.core.xla_model as xm

    torch_xla, _, _ = xla
    assert torch_xla.real_devices() == xm.xla_real_devices()
    assert isinstance(torch_xla.logger, logging.Logger) and torch_xla.logger.name == "torch_xla"


def test_preemption_sync_point_after_sigterm(xla):
    import os
    import signal
    import time

    torch_xla, _, _ = xla
    X = torch_xla._XLAC
    with pytest.raises(RuntimeError, match="_activate_preemption_sync_manager"):
        X._sync_point_reached(0)
    before = signal.getsignal(signal.SIGTERM)
    X._activate_preemption_sync_manager()
    try:
        assert not any(X._sync_point_reached(step) for step in range(5))
        os.kill(os.getpid(), signal.SIGTERM)  # the preemption notice; the handler only sets a flag
        deadline = time.monotonic() + 5
        while not X._sync_point_reached(5) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert X._sync_point_reached(5)
    finally:
        X._deactivate_preemption_sync_manager()
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back
