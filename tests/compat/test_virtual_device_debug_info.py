"""``torch_xla._XLAC._get_xla_tensor_debug_info`` through a deferred upload (PyTorch/XLA's SPMD virtual device).

A tensor moved with ``.to("xla")`` stays on the host until first needed; the
summary says so in PyTorch/XLA's form (``IR: None``, ``XLAData: None``,
``Tensor on host: with size [..]``) and asking never uploads it. After
``mark_sharding`` the data is on the devices, sharded; after an op reading it
or a sync, replicated. Values are checked against eager CPU.
"""

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
    torch_xla.sync()
    met.clear_all()
    return torch_xla, xs, met


def _mesh(xs, shape):
    return xs.Mesh(np.arange(int(np.prod(shape))), shape)


def _info(torch_xla, t) -> str:
    out: str = torch_xla._XLAC._get_xla_tensor_debug_info(t)
    return out


def test_on_host_form_and_asking_uploads_nothing(xla):
    torch_xla, _, met = xla
    cpu = torch.randn(5, 3)
    t = cpu.to("xla")
    info = _info(torch_xla, t)
    lines = info.splitlines()
    assert lines[0] == "XLATensor {" and lines[-1] == "}"
    assert "Device: SPMD:0" in lines and "XLA Shape: f32[5,3]" in lines and "ShardingSpec: None" in lines
    assert lines[-4:-1] == ["IR: None", "XLAData: None", "Tensor on host: with size [5, 3]"]
    assert _info(torch_xla, t) == info  # asking twice: still on the host
    assert "TransferToDeviceTime" not in met.metric_names()
    assert not met.counter_value("VirtualDeviceUsage")
    torch.testing.assert_close(t.cpu(), cpu)


def test_shapes_of_other_ranks_and_dtypes(xla):
    torch_xla, _, _ = xla
    assert "Tensor on host: with size [7]\n" in _info(torch_xla, torch.arange(7).to("xla"))
    assert "Tensor on host: with size []\n" in _info(torch_xla, torch.tensor(2.5).to("xla"))
    info = _info(torch_xla, torch.ones(2, 3, 4, dtype=torch.bfloat16).to("xla"))
    assert "XLA Shape: bf16[2,3,4]" in info and "Tensor on host: with size [2, 3, 4]" in info


def test_mark_sharding_uploads_sharded(xla):
    torch_xla, xs, met = xla
    cpu = torch.randn(8, 8)
    t = cpu.to("xla")
    xs.mark_sharding(t, _mesh(xs, (1, 8)), (0, 1))
    info = _info(torch_xla, t)
    assert "Tensor on host: None" in info and "xla::device_data" in info
    assert "XLAShardedData" in info and "OpSharding: {devices=[1,8]0,1,2,3,4,5,6,7}" in info
    assert "NumShards: 8" in info
    # One transfer of the tensor's bytes, straight to its shards.
    count, nbytes, _ = met.metric_data("OutboundData")
    assert (count, nbytes) == (1, cpu.nelement() * cpu.element_size())
    torch.testing.assert_close((t * 2).cpu(), cpu * 2)


def test_an_op_uploads_replicated(xla):
    torch_xla, _, met = xla
    cpu = torch.randn(8, 8)
    t = cpu.to("xla")
    u = t + t
    info = _info(torch_xla, t)
    assert "Tensor on host: None" in info and "xla::device_data" in info and "OpSharding: {replicated}" in info
    assert "TransferToDeviceTime" in met.metric_names()
    assert "IR: [] aten::add" in _info(torch_xla, u)
    torch.testing.assert_close(u.cpu(), cpu + cpu)


def test_sync_uploads_replicated(xla):
    torch_xla, _, _ = xla
    t = torch.randn(4, 2).to("xla")
    torch_xla.sync()
    info = _info(torch_xla, t)
    assert "Tensor on host: None" in info
    assert "Data Shape: f32[4,2]\n  OpSharding: {replicated}" in info


def test_a_cpu_fallback_result_waits_on_the_host(xla):
    """PyTorch/XLA keeps a CPU fallback's result on the host until a sync or a use."""
    torch_xla, _, _ = xla
    cpu = torch.tensor([[0, 1], [2, 0], [3, 4]])
    nz = cpu.to("xla").nonzero()
    info = _info(torch_xla, nz)
    assert "ShardingSpec: None" in info and "Tensor on host: with size [4, 2]" in info
    torch_xla.sync()
    assert "Data Shape: s64[4,2]\n  OpSharding: {replicated}" in _info(torch_xla, nz)
    torch.testing.assert_close(nz.cpu(), cpu.nonzero())


def test_a_view_of_a_tensor_on_host_has_no_host_data_of_its_own(xla):
    torch_xla, _, _ = xla
    cpu = torch.randn(4, 4)
    t = cpu.to("xla")
    row = t[1]
    assert "Tensor on host: None" in _info(torch_xla, row)
    torch.testing.assert_close(row.cpu(), cpu[1])
