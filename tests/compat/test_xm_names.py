"""The ``xm``/``xr`` names Hugging Face and PyTorch/XLA's own code call, in SPMD mode's meaning.

Return forms follow PyTorch/XLA 2.9 in SPMD mode (one virtual device
``xla:0`` per process); numerics are checked against eager CPU.
"""

from __future__ import annotations

import os

import pytest
import torch

import spmdtorch
from spmdtorch import ArgumentError


def test_set_replication_accepts_what_accelerate_passes():
    import torch_xla.core.xla_model as xm

    # accelerate's PartialState, on every XLA run
    assert xm.set_replication(xm.xla_device(), xm.get_xla_supported_devices()) is None
    assert xm.set_replication("xla:0", []) is None
    with pytest.raises(ArgumentError, match="must be an xla device"):
        xm.set_replication("cpu", ["xla:0"])
    with pytest.raises(ArgumentError, match="cannot replicate over 2 devices"):
        xm.set_replication("xla:0", ["xla:0", "xla:1"])


def test_real_and_replication_devices_of_the_virtual_device():
    import torch_xla
    import torch_xla.core.xla_model as xm

    device = torch_xla.device()
    assert xm.xla_real_devices([device]) == ["CPU:0"]
    assert xm.xla_replication_devices([device]) == ["CPU:0"]
    assert xm.xla_device_hw(device) == "CPU"
    assert xm.xla_device_kind() == "cpu"
    with pytest.raises(ArgumentError, match="must be an xla device"):
        xm.xla_real_devices(["cpu"])


def test_send_cpu_data_to_device_moves_cpu_tensors_only():
    import torch_xla.core.xla_model as xm

    t = torch.arange(6.0).reshape(2, 3)
    out = xm.send_cpu_data_to_device(t, xm.xla_device())
    assert isinstance(out, list) and len(out) == 1  # a bare tensor comes back in a list, as in PyTorch/XLA
    assert out[0].device.type == "xla"
    torch.testing.assert_close(out[0].cpu(), t)
    state = {"step": 3, "m": [t, torch.ones(2)], "name": "adam"}
    moved = xm.send_cpu_data_to_device(state, "xla:0")
    assert moved["step"] == 3 and moved["name"] == "adam"
    assert [m.device.type for m in moved["m"]] == ["xla", "xla"]
    torch.testing.assert_close(moved["m"][0].cpu(), t)


def test_send_cpu_data_to_device_with_input_sharding():
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(list(range(8)), (8, 1), ("data", "model"))
    t = torch.arange(32.0).reshape(8, 4)
    met.clear_all()
    (x,) = xm.send_cpu_data_to_device([t], xm.xla_device(), input_sharding=xs.ShardingSpec(mesh, ("data", None)))
    assert met.metric_data("OutboundData")[:2] == (1, t.nbytes)  # (count, bytes), as PyTorch/XLA counts
    torch.testing.assert_close(x.cpu(), t)
    assert spmdtorch.sharding.get_sharding_spec(x) == spmdtorch.sharding.get_sharding_spec(
        xs.mark_sharding(t.to("xla"), mesh, ("data", None))
    )


def test_fetch_gradients_are_the_grads_in_place():
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)).to("xla")
    model[0].bias.requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3, device="xla")).sum().backward()
    grads = xm._fetch_gradients(opt)
    expected = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(expected) == 3
    for g, e in zip(grads, expected):
        assert g.untyped_storage().data_ptr() == e.untyped_storage().data_ptr()  # the same storage, not copies
    # accelerate scales them in place through all_reduce; the step then uses the scaled grads
    xm.all_reduce(xm.REDUCE_SUM, grads, scale=0.5)
    torch.testing.assert_close(model[1].bias.grad.cpu(), torch.full((2,), 1.0))


def test_maybe_convert_to_cpu_copies_plain_xla_tensors():
    import torch_xla.core.xla_model as xm

    model = torch.nn.Linear(3, 2).to("xla")
    with torch.no_grad():
        model.weight.add_(1)  # pending until the conversion computes it
    sd = xm._maybe_convert_to_cpu({"model": model.state_dict(), "epoch": 2, "cpu": torch.ones(1)})
    assert sd["epoch"] == 2 and sd["cpu"].device.type == "cpu"
    assert all(v.device.type == "cpu" for v in sd["model"].values())
    torch.testing.assert_close(sd["model"]["weight"], model.weight.detach().cpu())
    # Parameters stay (PyTorch/XLA converts plain tensors only), and convert=False only computes
    p = model.weight
    assert xm._maybe_convert_to_cpu([p])[0] is p
    kept = xm._maybe_convert_to_cpu({"w": model.weight.detach()}, convert=False)
    assert kept["w"].device.type == "xla"


def test_rate_tracker_counts_items_per_second(monkeypatch):
    import torch_xla.core.xla_model as xm

    clock = [100.0]
    monkeypatch.setattr("time.time", lambda: clock[0])
    tracker = xm.RateTracker(smooth_factor=0.5)
    tracker.add(10)
    clock[0] += 2.0
    assert tracker.rate() == pytest.approx(5.0)
    tracker.add(30)
    clock[0] += 2.0
    assert tracker.rate() == pytest.approx(0.5 * 15.0 + 0.5 * 5.0)  # smoothed with the previous rate
    assert tracker.global_rate() == pytest.approx(40 / 4.0)


def test_collective_broadcast_and_rendezvous_in_a_one_process_job():
    import torch_xla.core.xla_model as xm

    t = torch.arange(4.0, device="xla")
    assert xm.collective_broadcast([t]) is None
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    with pytest.raises(ArgumentError, match="root_ordinal"):
        xm.collective_broadcast([t], root_ordinal=1)
    assert xm.xla_rendezvous(b"hi") == [b"hi"]


def test_point_to_point_names_raise_named_errors():
    import torch_xla.core.xla_model as xm

    from spmdtorch.compat.errors import MultiprocessNotSupportedError

    t = torch.ones(2, device="xla")
    for call in (lambda: xm.send(t, 0), lambda: xm.recv(t, 0), lambda: xm.collective_permute(t, [(0, 0)])):
        with pytest.raises(MultiprocessNotSupportedError, match="shard_map"):
            call()


def test_fork_rng_restores_the_stream():
    import torch_xla.core.xla_model as xm

    torch.manual_seed(3)
    with xm.fork_rng():
        torch.rand(5, device="xla").cpu()
    after = torch.rand(5, device="xla").cpu()
    torch.manual_seed(3)
    torch.testing.assert_close(after, torch.rand(5, device="xla").cpu())


def test_optimization_barrier_keeps_values_and_gradients():
    import torch_xla.core.xla_model as xm

    x = torch.arange(4.0, device="xla", requires_grad=True)
    y = x * 2
    z = y + 1
    xm.optimization_barrier_([y, z])
    (y * z).sum().backward()
    eager = torch.arange(4.0, requires_grad=True)
    ye = eager * 2
    (ye * (ye + 1)).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), eager.grad)


def test_use_spmd_sets_the_environment_variable(monkeypatch):
    import torch_xla.runtime as xr

    from spmdtorch.compat import _runtime

    monkeypatch.setattr(_runtime, "_USE_SPMD_CALLED", [False])
    monkeypatch.delenv("XLA_USE_SPMD", raising=False)
    assert xr.is_spmd()  # spmdtorch always runs SPMD programs
    xr.use_spmd()
    assert os.environ["XLA_USE_SPMD"] == "1"
    assert xr.is_spmd()
    del os.environ["XLA_USE_SPMD"]  # what PyTorch/XLA's code does to leave SPMD mode, then reads back
    assert not xr.is_spmd()
    xr.use_spmd()
    assert xr.is_spmd()
    try:
        xr.use_spmd(auto=True)  # spmdtorch's own auto-sharding (tests/test_auto_sharding.py)
        assert spmdtorch.runtime.auto_sharding_enabled()
    finally:
        spmdtorch.runtime.set_auto_sharding(False)


def test_global_runtime_device_attributes():
    import torch_xla.runtime as xr

    attrs = xr.global_runtime_device_attributes()
    assert [a["name"] for a in attrs] == [f"CPU:{i}" for i in range(xr.global_runtime_device_count())]
    assert xr.runtime_device_attributes("CPU:3") == attrs[3]
    with pytest.raises(ArgumentError, match="CPU:0"):
        xr.runtime_device_attributes("TPU:9")
