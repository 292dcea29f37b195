"""Deferred upload: ``t.to("xla")`` keeps a private host copy until the value is first needed.

PyTorch/XLA's SPMD "virtual device" behaviour (``spmdtorch.tensor.transfer``):
``mark_sharding`` right after the move places each shard straight on its
device (one transfer, no reshard); an op, a read or a sync uploads the value
replicated. Every numerical case is compared with the same program on CPU
tensors; the transfer counters show when (and how often) data moved.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

import spmdtorch
from spmdtorch import config, debug
from spmdtorch.mesh import get_1d_mesh
from spmdtorch.sharding import clear_sharding, get_sharding_spec, local_shards, mark_sharding, tensor_sharding
from spmdtorch.tensor import transfer


@pytest.fixture(autouse=True)
def _defer(devices8, monkeypatch):
    """Every test starts with the default (deferred) setting and clean counters."""
    monkeypatch.delenv("SPMDTORCH_DEFER_UPLOAD", raising=False)
    config.reload()
    spmdtorch.sync()
    debug.clear_metrics()
    yield
    monkeypatch.delenv("SPMDTORCH_DEFER_UPLOAD", raising=False)
    config.reload()


def _uploads() -> int:
    return debug.counter_value("TransferToDevice")


def test_move_keeps_data_on_host_until_first_use():
    x = torch.randn(4, 6)
    xt = x.to("xla")
    assert transfer.host_shape(xt) == (4, 6)
    assert _uploads() == 0
    # Reading what the tensor is never uploads it.
    assert (tuple(xt.shape), xt.dtype, xt.numel(), xt.dim()) == ((4, 6), torch.float32, 24, 2)
    assert xt.untyped_storage().nbytes() == x.untyped_storage().nbytes()
    assert get_sharding_spec(xt) == ""
    assert tensor_sharding(xt) is None
    assert clear_sharding(xt) is xt
    assert _uploads() == 0
    torch.testing.assert_close((xt * 2 + 1).cpu(), x * 2 + 1)
    assert _uploads() == 1
    assert transfer.host_shape(xt) is None


def test_the_copy_is_taken_at_the_move():
    x = torch.arange(6.0)
    xt = x.to("xla")
    x.add_(100)  # after .to: the xla tensor is a copy, as on any device
    torch.testing.assert_close(xt.cpu(), torch.arange(6.0))


def test_mark_sharding_places_shards_directly():
    mesh = get_1d_mesh("data")
    x = torch.randn(16, 4)
    xt = x.to("xla")
    mark_sharding(xt, mesh, ("data", None))
    # One transfer of the tensor's bytes, straight to its sharded layout: no
    # replicated copy first, no reshard on the devices.
    assert _uploads() == 1
    assert debug.counter_value("OutboundBytes") == x.nbytes
    assert debug.counter_value("ReshardOnDevice") == 0
    shards = local_shards(xt)
    assert len(shards) == 8
    for s in shards:
        assert tuple(s.data.shape) == (2, 4)
        torch.testing.assert_close(s.data, x[s.indices])
    torch.testing.assert_close((xt @ xt.T).cpu(), x @ x.T)


def test_mark_sharding_uneven_pads_on_the_host():
    mesh = get_1d_mesh("data")
    x = torch.randn(10, 3)  # 10 rows over 8 devices: padded blocks
    xt = x.to("xla")
    mark_sharding(xt, mesh, ("data", None))
    assert _uploads() == 1
    assert debug.counter_value("ReshardOnDevice") == 0
    assert tuple(xt.shape) == (10, 3)
    torch.testing.assert_close(xt.cpu(), x)
    torch.testing.assert_close(xt.sum(0).cpu(), x.sum(0))


def test_the_immediate_path_reshards(monkeypatch):
    """SPMDTORCH_DEFER_UPLOAD=0: the same program uploads at the move, then reshards (the counters tell apart)."""
    monkeypatch.setenv("SPMDTORCH_DEFER_UPLOAD", "0")
    config.reload()
    x = torch.randn(16, 4)
    xt = x.to("xla")
    assert transfer.host_shape(xt) is None
    assert _uploads() == 1
    mark_sharding(xt, get_1d_mesh("data"), ("data", None))
    assert debug.counter_value("ReshardOnDevice") == 1
    torch.testing.assert_close(xt.cpu(), x)


def test_in_place_ops_on_a_tensor_still_on_host():
    x = torch.randn(3, 5)
    xt = x.to("xla")
    xt.add_(1).mul_(3)
    ref = (x + 1) * 3
    torch.testing.assert_close(xt.cpu(), ref)


def test_whole_overwrite_drops_the_host_copy_unsent():
    yt = torch.randn(3, 5).to("xla")
    src = torch.randn(3, 5)
    yt.copy_(src)  # replaces the whole value: only src is sent
    assert _uploads() == 1
    assert transfer.host_shape(yt) is None
    torch.testing.assert_close(yt.cpu(), src)
    zt = torch.randn(3, 5).to("xla")
    zt.zero_()
    torch.testing.assert_close(zt.cpu(), torch.zeros(3, 5))


def test_views_made_before_the_upload_follow_their_base():
    x = torch.randn(4, 6)
    xt = x.to("xla")
    row, tr, flat = xt[1], xt.t(), xt.view(-1)
    assert transfer.host_shape(row) is None  # a view holds no host data of its own
    assert _uploads() == 0
    row.mul_(10)  # through the view: the base changes
    x[1].mul_(10)
    torch.testing.assert_close(xt.cpu(), x)
    torch.testing.assert_close(tr.cpu(), x.t())
    torch.testing.assert_close(flat.cpu(), x.view(-1))
    # Storage identity is the same as before the upload and as on CPU.
    assert xt.untyped_storage().data_ptr() == row.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()


def test_storage_identity_before_the_upload():
    a = torch.randn(2, 2).to("xla")
    b = torch.randn(2, 2).to("xla")
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
    assert a.detach().untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert a.data.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert _uploads() == 0


def test_gradients_reach_the_cpu_leaf():
    w = torch.randn(3, 4, requires_grad=True)
    wc = w.detach().clone().requires_grad_(True)
    (w.to("xla") ** 2).sum().backward()
    (wc**2).sum().backward()
    assert w.grad is not None and w.grad.device.type == "cpu"
    torch.testing.assert_close(w.grad, wc.grad)


def test_module_to_xla_then_sharded_parameters():
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 16)
    ref = copy.deepcopy(lin)
    lin.to("xla")
    assert _uploads() == 0
    mark_sharding(lin.weight, get_1d_mesh("data"), ("data", None))
    assert _uploads() == 1 and debug.counter_value("ReshardOnDevice") == 0
    x = torch.randn(2, 8)
    torch.testing.assert_close(lin(x.to("xla")).cpu(), ref(x), rtol=1e-5, atol=1e-5)


def test_int64_overflow_is_raised_at_the_move():
    with pytest.raises(OverflowError):
        torch.tensor([2**40]).to("xla")


def test_factory_from_data_defers_and_keeps_dtypes():
    t = torch.tensor([[1, 2], [3, 4]], device="xla")
    b = torch.tensor([True, False], device="xla")
    assert _uploads() == 0
    assert t.dtype == torch.int64 and b.dtype == torch.bool
    torch.testing.assert_close((t * 3).cpu(), torch.tensor([[3, 6], [9, 12]]))
    assert b.cpu().tolist() == [True, False]


def test_sync_uploads_what_is_left_replicated():
    xt = torch.randn(8, 8).to("xla")
    spmdtorch.sync()
    assert transfer.host_shape(xt) is None
    assert _uploads() == 1
    assert get_sharding_spec(xt) == ""  # replicated: no annotation


def test_deepcopy_and_pickle_before_the_upload():
    x = torch.randn(3, 3)
    xt = x.to("xla")
    torch.testing.assert_close(copy.deepcopy(xt).cpu(), x)
    buf = io.BytesIO()
    torch.save(xt, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False).cpu(), x)
    torch.testing.assert_close(pickle.loads(pickle.dumps(xt.cpu())), x)


def test_compile_reads_a_deferred_tensor():
    w_cpu = torch.randn(4)
    w = w_cpu.clone().to("xla")

    @spmdtorch.compile
    def step(x):
        w.add_(x)
        return w.sum()

    ref = w_cpu.clone()
    for i in range(3):
        x = torch.full((4,), float(i))
        out = step(x.to("xla"))
        ref.add_(x)
        torch.testing.assert_close(out.cpu(), ref.sum())
    torch.testing.assert_close(w.cpu(), ref)


def test_fallback_results_wait_on_the_host():
    x = torch.tensor([0, 3, 0, 5, 7])
    xt = x.to("xla")
    nz = xt.nonzero()  # data-dependent shape: computed on CPU
    assert transfer.host_shape(nz) == (3, 1)
    torch.testing.assert_close((nz + 1).cpu(), x.nonzero() + 1)
