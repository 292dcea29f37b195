"""The API guide's snippets (PyTorch on XLA Devices, README), as a PyTorch/XLA user writes them.

Numerics are compared with the same code run eagerly on the CPU.
"""

from __future__ import annotations

import copy
import time

import pytest
import torch
import torch.nn as nn
from _models import MNIST, assert_params_close, mnist_batches, train_eager


def test_creating_and_using_xla_tensors():
    import torch_xla
    import torch_xla.core.xla_model as xm

    t = torch.randn(2, 2, device=xm.xla_device())
    assert t.device == torch.device("xla", 0) == torch_xla.device()
    torch.manual_seed(1)
    a, b = torch.randn(2, 2), torch.randn(2, 2)
    t0, t1 = a.to(xm.xla_device()), b.to(xm.xla_device())
    torch.testing.assert_close((t0 + t1).cpu(), a + b)
    torch.testing.assert_close((t0.mm(t1)).cpu(), a.mm(b))
    l_in = torch.randn(10)
    linear = torch.nn.Linear(10, 20)
    expected = linear(l_in)
    l_out = copy.deepcopy(linear).to(xm.xla_device())(l_in.to(xm.xla_device()))
    torch.testing.assert_close(l_out.cpu(), expected, rtol=1e-5, atol=1e-6)


def test_running_on_a_single_xla_device_trains_as_eager_cpu():
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    cpu_model = MNIST().train()
    batches = mnist_batches()
    ref_model, ref_losses = train_eager(cpu_model, batches)

    device = xm.xla_device()
    model = copy.deepcopy(cpu_model).train().to(device)
    loss_fn = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    losses = []
    for data, target in batches:
        data = data.to(device)
        target = target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = loss_fn(output, target)
        loss.backward()
        optimizer.step()
        xm.mark_step()
        losses.append(loss)
    torch.testing.assert_close([x.item() for x in losses], ref_losses, rtol=1e-4, atol=1e-5)
    assert_params_close(model, ref_model)


def test_readme_single_process_loop_with_torch_xla_step_and_optimizer_step():
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    cpu_model = MNIST()
    batches = mnist_batches(3)
    ref_model, ref_losses = train_eager(cpu_model, batches)
    model = copy.deepcopy(cpu_model)
    model.to("xla")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    loss_fn = nn.NLLLoss()
    losses = []
    for inputs, labels in batches:
        with torch_xla.step():
            inputs, labels = inputs.to(torch_xla.device()), labels.to(torch_xla.device())
            optimizer.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            xm.optimizer_step(optimizer)  # no reduction needed in SPMD: the gradients are the batch's
            losses.append(loss)
    torch_xla.sync()
    torch.testing.assert_close([x.item() for x in losses], ref_losses, rtol=1e-4, atol=1e-5)
    assert_params_close(model, ref_model)


def test_torch_xla_compile_matches_eager():
    import torch_xla

    torch.manual_seed(0)
    cpu_model = MNIST()
    batches = mnist_batches(4)
    ref_model, ref_losses = train_eager(cpu_model, batches)
    model = copy.deepcopy(cpu_model).to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)

    @torch_xla.compile
    def step_fn(data, target):
        opt.zero_grad()
        loss = nn.NLLLoss()(model(data), target)
        loss.backward()
        opt.step()
        return loss

    losses = [step_fn(d.to("xla"), t.to("xla")).item() for d, t in batches]
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-5)
    assert_params_close(model, ref_model)
    assert callable(torch_xla.compile(full_graph=True)(lambda x: x + 1))


def test_save_and_load_tensors(tmp_path):
    import torch_xla.core.xla_model as xm

    device = xm.xla_device()
    t0 = torch.randn(2, 2, device=device)
    t1 = torch.randn(2, 2, device=device)
    tensors = (t0.cpu(), t1.cpu())
    torch.save(tensors, tmp_path / "tensors.pt")
    tensors = torch.load(tmp_path / "tensors.pt")
    t0b, t1b = tensors[0].to(device), tensors[1].to(device)
    torch.testing.assert_close(t0b.cpu(), t0.cpu())
    torch.testing.assert_close(t1b.cpu(), t1.cpu())

    model = nn.Linear(4, 3).to(device)
    xm.save(model.state_dict(), tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt")
    assert all(v.device.type == "cpu" for v in loaded.values())
    torch.testing.assert_close(loaded["weight"], model.weight.cpu())


def test_xser_streams_xla_tensors_in_pytorch_xla_layout(tmp_path):
    import torch_xla.core.xla_model as xm
    import torch_xla.utils.serialization as xser

    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).to(xm.xla_device())
    path = str(tmp_path / "ckpt.pt")
    state = {"model": model.state_dict(), "step": 7, "cpu": torch.ones(2)}
    xser.save(state, path)
    assert sorted(p.name for p in (tmp_path / "ckpt.pt.tensors").iterdir()) == [f"tensor_{i}.pt" for i in range(4)]
    state_dict = xser.load(path)
    assert state_dict["step"] == 7
    torch.testing.assert_close(state_dict["cpu"], torch.ones(2))
    for k, v in model.state_dict().items():
        assert state_dict["model"][k].device.type == "cpu"
        torch.testing.assert_close(state_dict["model"][k], v.cpu())
    fresh = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    fresh.load_state_dict(state_dict["model"])


def test_initialize_cache(tmp_path):
    import jax
    import torch_xla.runtime as xr

    try:
        xr.initialize_cache(str(tmp_path / "cache"), readonly=False)
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "cache")
    finally:
        jax.config.update("jax_enable_compilation_cache", False)


def test_device_names_follow_spmd_mode():
    import torch_xla
    import torch_xla.core.xla_model as xm

    assert torch_xla.devices() == [torch.device("xla", 0)]
    assert torch_xla.device_count() == 1
    assert xm.get_xla_supported_devices() == ["xla:0"]
    assert xm.xla_real_devices() == [f"CPU:{i}" for i in range(8)]
    assert xm.xla_device_hw(xm.xla_device()) == "CPU"
    assert xm.is_xla_tensor(torch.ones(1, device="xla")) and not xm.is_xla_tensor(torch.ones(1))


def test_add_step_closure_runs_after_the_barrier_in_order():
    import torch_xla.core.xla_model as xm

    seen = []
    w = torch.zeros(3, device=xm.xla_device())
    for i in range(3):
        w = w + 1
        xm.add_step_closure(lambda t, i=i: seen.append((i, t.cpu().tolist())), args=(w,))
        assert len(seen) == i  # not before the barrier
        xm.mark_step()
    assert seen == [(0, [1.0] * 3), (1, [2.0] * 3), (2, [3.0] * 3)]
    done = []
    xm.add_step_closure(lambda: done.append(1), run_async=True)
    xm.mark_step()
    deadline = time.monotonic() + 30  # run_async: on a background thread, soon after the barrier
    while not done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done == [1]


def test_rng_state_round_trips():
    import torch_xla.core.xla_model as xm

    xm.set_rng_state(1234)
    a = torch.randn(5, device=xm.xla_device()).cpu()
    xm.set_rng_state(1234)
    torch.testing.assert_close(torch.randn(5, device=xm.xla_device()).cpu(), a)
    state = xm.get_rng_state()
    assert isinstance(state, int)
    b = torch.rand(4, device=xm.xla_device()).cpu()
    xm.set_rng_state(state)
    torch.testing.assert_close(torch.rand(4, device=xm.xla_device()).cpu(), b)


def test_memory_info_and_stablehlo():
    import torch_xla.core.xla_model as xm

    x = torch.ones(256, 256, device=xm.xla_device())
    info = xm.get_memory_info(xm.xla_device())
    assert set(info) == {"bytes_used", "bytes_limit", "peak_bytes_used"}
    assert info["bytes_limit"] > info["bytes_used"] > 0
    y = x @ x + 1
    text = xm.get_stablehlo([y])
    assert "stablehlo.dot" in text or "dot_general" in text
    assert xm.get_stablehlo().startswith("module")  # the whole pending graph
    assert xm.get_stablehlo_bytecode([y])[:4] == b"ML\xefR"
    xm.mark_step()
    assert y[0, 0].item() == 257.0


def test_rendezvous_and_mesh_reduce_in_a_job_of_one():
    import torch_xla.core.xla_model as xm

    assert xm.rendezvous("init", b"payload") == [b"payload"]
    assert xm.mesh_reduce("loss", torch.tensor(2.5, device="xla"), lambda xs: sum(x.item() for x in xs)) == 2.5
    assert xm.is_master_ordinal() and xm.is_master_ordinal(local=False)
    assert (xm.xrt_world_size(), xm.get_ordinal(), xm.get_local_ordinal()) == (1, 0, 0)


def test_replica_collectives_are_identities_in_a_job_of_one():
    import torch_xla.core.xla_model as xm

    t = torch.arange(4.0, device="xla")
    torch.testing.assert_close(xm.all_reduce(xm.REDUCE_SUM, t).cpu(), torch.arange(4.0))
    torch.testing.assert_close(xm.all_reduce(xm.REDUCE_SUM, t, scale=0.5).cpu(), torch.arange(4.0) * 0.5)
    torch.testing.assert_close(xm.all_gather(t).cpu(), torch.arange(4.0))


def test_replica_collectives_refuse_groups_naming_replicas_that_do_not_exist():
    # Issue 42 item 5: groups over device ordinals used to return the input
    # unchanged, where the collective meant (a psum over device pairs) gives 2x.
    import torch_xla.core.xla_model as xm

    from spmdtorch.compat.errors import ReplicaGroupsError

    t = torch.arange(4.0, device="xla")
    pairs = [[0, 1], [2, 3], [4, 5], [6, 7]]
    for call in (
        lambda: xm.all_reduce(xm.REDUCE_SUM, t, groups=pairs),
        lambda: xm.all_gather(t, groups=pairs),
        lambda: xm.reduce_scatter(xm.REDUCE_SUM, t, 1.0, 0, 1, groups=pairs),
        lambda: xm.collective_broadcast([t], groups=pairs),
    ):
        with pytest.raises(ReplicaGroupsError, match=r"groups=\[\[0, 1\].*shard_map") as e:
            call()
        assert isinstance(e.value, ValueError)
    with pytest.raises(ReplicaGroupsError, match="list of lists of replica ordinals"):
        xm.all_reduce(xm.REDUCE_SUM, t, groups=[0, 1])
    # The one group a one-replica job has is accepted: the identity, as without groups.
    torch.testing.assert_close(xm.all_reduce(xm.REDUCE_SUM, t, groups=[[0]]).cpu(), torch.arange(4.0))
    torch.testing.assert_close(xm.all_gather(t, groups=[]).cpu(), torch.arange(4.0))


def test_debugging_calls_from_the_troubleshooting_guide():
    import torch_xla
    import torch_xla.core.xla_model as xm

    a = torch.randn(4, 4, device=xm.xla_device())
    res = a @ a + 2
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([res])
    text = torch_xla._XLAC._get_xla_tensors_text([res])
    assert hlo.startswith("HloModule") and "dot(" in hlo
    assert text.startswith("module")
    xm.mark_step()
    # Materialised: its graph is its device data, a parameter (no dot any more), as in PyTorch/XLA.
    done = torch_xla._XLAC._get_xla_tensors_hlo([res])
    assert "parameter(0)" in done and "dot(" not in done


@pytest.mark.parametrize("use_function", [False, True])
def test_utils_checkpoint_gradients_match_eager(use_function):
    import torch_xla.utils.checkpoint as xcp

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    block(x).square().sum().backward()
    expected = [p.grad.clone() for p in block.parameters()]
    xblock = copy.deepcopy(block).to("xla")
    xblock.zero_grad()
    xx = x.to("xla").requires_grad_()
    if use_function:
        out = xcp.checkpoint(lambda t: xblock(t), xx, use_reentrant=False)
    else:
        out = xcp.checkpoint(xblock.__call__, xx)  # how Hugging Face's gradient checkpointing calls it
    out.square().sum().backward()
    for p, g in zip(xblock.parameters(), expected):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-4, atol=1e-5)


def test_amp_autocast_and_syncfree_optimizers_match_torch_autocast():
    import torch_xla.amp as amp
    import torch_xla.amp.syncfree as syncfree
    import torch_xla.core.xla_model as xm

    torch.manual_seed(0)
    lin = nn.Linear(8, 4)
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = lin(x)
    xlin = copy.deepcopy(lin).to(xm.xla_device())
    with amp.autocast(xm.xla_device()):
        out = xlin(x.to(xm.xla_device()))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-2, atol=1e-2)
    opt = syncfree.AdamW(xlin.parameters(), lr=0.1)
    assert isinstance(opt, torch.optim.AdamW)
