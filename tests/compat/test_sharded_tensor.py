"""``xs.mark_sharding`` returns an ``XLAShardedTensor``; the names of ``torch_xla.distributed.spmd``.

Return forms follow PyTorch/XLA 2.9 (``global_tensor``, ``local_shards`` with
padded data and ``slice(start, stop, 1)`` / ``...`` indices, ``sharding_spec``
strings, ``sharding_type``); numbers are compared with eager CPU torch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard


@pytest.fixture
def xs():
    import torch_xla.distributed.spmd as xs

    return xs


def _mesh(xs, shape, names=None):
    return xs.Mesh(np.arange(8), shape, names)


def test_mark_sharding_returns_sharded_tensor_wrapping_the_tensor(xs):
    t = torch.arange(16.0).reshape(2, 8)
    xt = t.to("xla")
    xst = xs.mark_sharding(xt, _mesh(xs, (1, 8)), (0, 1))
    assert isinstance(xst, xs.XLAShardedTensor) and isinstance(xst, DTensor)
    assert xst.global_tensor is xt
    assert xst.mesh_shape == (1, 8) and xst.partition_spec == (0, 1)
    assert xst.sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    assert xst.sharding_type == xs.ShardingType.TILED
    assert xst.device.type == "xla" and xst.shape == t.shape
    torch.testing.assert_close(xst.cpu(), t)
    assert repr(xst).startswith("XLAShardedTensor(")


def test_sharding_spec_and_type_forms(xs):
    mesh = _mesh(xs, (4, 2))
    rep = xs.mark_sharding(torch.zeros(4, 4, device="xla"), mesh, (None, None))
    assert rep.sharding_spec == "{replicated}" and rep.sharding_type == xs.ShardingType.REPLICATED
    part = xs.mark_sharding(torch.zeros(16, 16, device="xla"), mesh, (None, 1))
    assert part.sharding_type == xs.ShardingType.PARTIAL
    assert part.sharding_spec.endswith("last_tile_dim_replicate}")


def test_local_shards_tiled(xs):
    t = torch.arange(8.0)
    xt = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (0,))
    shards = xt.local_shards
    assert len(shards) == 8
    for i, s in enumerate(shards):
        assert s.data.device == torch.device("cpu")
        assert s.indices == [slice(i, i + 1, 1)]
        assert s.replica_id == 0
        assert s.shard_device.endswith(f":{i}")
        torch.testing.assert_close(s.data, t[tuple(s.indices)])


def test_local_shards_padded_when_uneven(xs):
    t = torch.arange(9.0)
    shards = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (0,)).local_shards
    assert all(s.data.shape == (2,) for s in shards)  # ceil(9 / 8) rows each, zero-padded
    last = shards[4]
    assert last.indices == [slice(8, 9, 1)]
    torch.testing.assert_close(last.data, torch.tensor([8.0, 0.0]))
    torch.testing.assert_close(last.unpadded_data, t[8:9])
    assert shards[7].indices == [slice(9, 9, 1)] and shards[7].unpadded_data.numel() == 0


def test_local_shards_replicated_and_partial(xs):
    t = torch.arange(8.0)
    rep = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (None,)).local_shards
    assert [s.replica_id for s in rep] == list(range(8))
    assert all(s.indices is Ellipsis for s in rep)
    torch.testing.assert_close(rep[3].data, t)
    m = torch.arange(256.0).reshape(16, 16)
    part = xs.mark_sharding(m.to("xla"), _mesh(xs, (4, 2)), (None, 1)).local_shards
    for i, s in enumerate(part):
        assert s.indices == [slice(0, 16, 1), slice((i % 2) * 8, (i % 2 + 1) * 8, 1)]
        assert s.replica_id == i // 2
        torch.testing.assert_close(s.data, m[tuple(s.indices)])


def test_load_local_shards(xs):
    t = torch.arange(9.0) + 1
    xt = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (0,))
    shards = xt.local_shards
    for s in shards:
        s.data *= -1
    xt.load_local_shards_(shards)
    torch.testing.assert_close(xt.cpu(), -t)
    torch.testing.assert_close(xt.global_tensor.cpu(), -t)


def test_load_local_shards_errors(xs):
    from spmdtorch.compat._sharded_tensor import ShardLoadError

    t = torch.arange(8.0)
    xt = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (0,))
    shards = xt.local_shards
    with pytest.raises(ShardLoadError, match="got 7 shards"):
        xt.load_local_shards_(shards[:-1])
    bad = [xs.XLAShard(torch.zeros(2), s.indices, s.shard_device, s.replica_id) for s in shards]
    with pytest.raises(RuntimeError, match=r"shape \(2,\)"):
        xt.load_local_shards_(bad)
    rt = xs.mark_sharding(t.to("xla"), _mesh(xs, (8,)), (None,))
    with pytest.raises(ShardLoadError, match="REPLICATED"):
        rt.load_local_shards_(rt.local_shards)


def test_ops_on_sharded_tensor_match_cpu_and_return_sharded_tensors(xs):
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    x = torch.randn(8, 16)
    expected = model(x)
    xmodel = nn.Linear(16, 4).to("xla")
    xmodel.load_state_dict(model.state_dict())
    xst = xs.mark_sharding(x.to("xla"), _mesh(xs, (8, 1)), (0, None))
    out = xmodel(xst)
    assert isinstance(out, xs.XLAShardedTensor) and out.mesh_shape is None
    assert "XLAShardedTensor" in str(out)
    assert not isinstance(xmodel(x.to("xla")), xs.XLAShardedTensor)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close((xst * 2 + 1).cpu(), x * 2 + 1)


def test_wrapper_of_parameter_is_a_leaf_and_op_results_keep_autograd(xs):
    torch.manual_seed(0)
    lin = nn.Linear(16, 4)
    x = torch.randn(8, 16)
    lin(x).square().sum().backward()
    xlin = nn.Linear(16, 4).to("xla")
    xlin.load_state_dict(lin.state_dict())
    wrapped = xs.mark_sharding(xlin.weight, _mesh(xs, (4, 2)), (0, 1))
    assert wrapped.is_leaf and not wrapped.requires_grad and wrapped.global_tensor is xlin.weight
    out = xlin(xs.mark_sharding(x.to("xla"), _mesh(xs, (8, 1)), (0, None)))
    assert isinstance(out, xs.XLAShardedTensor) and out.requires_grad
    out.square().sum().backward()
    torch.testing.assert_close(xlin.weight.grad.cpu(), lin.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(xlin.bias.grad.cpu(), lin.bias.grad, rtol=1e-4, atol=1e-5)


def test_leaf_wrapper_with_requires_grad(xs):
    xt = torch.randn(4, 4).to("xla")
    leaf = xs.XLAShardedTensor(xt, requires_grad=True)
    leaf.sum().backward()
    assert leaf.grad is not None
    torch.testing.assert_close(leaf.grad.cpu(), torch.ones(4, 4))
    assert not leaf.global_tensor.requires_grad


def test_inplace_and_optimizer_on_wrapped_parameter_update_the_parameter(xs):
    p = nn.Parameter(torch.zeros(8, device="xla"))
    wrapped = xs.mark_sharding(p, xs.get_1d_mesh(), (0,))
    with torch.no_grad():
        wrapped.add_(3.0)
    torch.testing.assert_close(p.detach().cpu(), torch.full((8,), 3.0))
    opt = torch.optim.SGD([p], lr=0.5)
    (p * 2).sum().backward()
    opt.step()
    torch.testing.assert_close(p.detach().cpu(), torch.full((8,), 2.0))
    assert wrapped.sharding_spec == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_wrap_helpers(xs):
    from torch_xla.distributed.spmd.xla_sharding import unwrap_sharded_tensor, wrap_as_sharded_tensor

    plain = torch.zeros(8, device="xla")
    assert xs.wrap_if_sharded(plain) is plain
    cpu = torch.zeros(2)
    assert xs.wrap_if_sharded(cpu) is cpu
    xs.mark_sharding(plain, xs.get_1d_mesh(), (0,))
    wrapped = xs.wrap_if_sharded(plain)
    assert isinstance(wrapped, xs.XLAShardedTensor) and wrapped.global_tensor is plain
    same = wrap_as_sharded_tensor(wrapped, mesh_shape=(8,), partition_spec=(0,))
    assert same is wrapped and same.placements == (Shard(0),)
    assert unwrap_sharded_tensor(wrapped) is plain and unwrap_sharded_tensor(plain) is plain
    bare = xs.XLAShardedTensor(torch.zeros(2, device="xla"))
    with pytest.raises(ValueError, match="Placements not available"):
        _ = bare.placements
    from spmdtorch.compat._sharded_tensor import ShardedTensorTypeError

    with pytest.raises(ShardedTensorTypeError, match="got list"):
        xs.XLAShardedTensor([1.0, 2.0])
    host = torch.arange(4.0)
    moved = xs.XLAShardedTensor(host)
    assert moved.device.type == "xla" and moved.global_tensor.device.type == "xla"
    torch.testing.assert_close(moved.cpu(), host)


def test_redistribute_and_placements(xs):
    mesh = _mesh(xs, (2, 4))
    xst = xs.mark_sharding(torch.arange(32.0).reshape(8, 4).to("xla"), mesh, (0, None))
    assert xst.placements == (Shard(0), Replicate())
    moved = xst.redistribute(mesh, [Replicate(), Shard(1)])
    assert moved.partition_spec == (None, 1)
    assert moved.sharding_spec.startswith("{devices=[1,4,2]")
    torch.testing.assert_close(moved.cpu(), torch.arange(32.0).reshape(8, 4))


def test_clear_sharding_returns_the_tensor(xs):
    xt = torch.zeros(8, 2, device="xla")
    xst = xs.mark_sharding(xt, xs.get_1d_mesh(), (0, None))
    assert xs.clear_sharding(xst) is xt
    assert xst.sharding_spec == ""


def test_replicated_annotation_can_be_replaced(xs):
    xt = torch.randn(2, 8).to("xla")
    mesh = _mesh(xs, (1, 8))
    xs.mark_sharding(xt, mesh, (None, None))
    assert xs.mark_sharding(xt, mesh, (0, 1)).sharding_spec == "{devices=[1,8]0,1,2,3,4,5,6,7}"


def test_conflicting_mark_is_a_runtime_error(xs):
    xt = torch.zeros(2, 8, device="xla")
    xs.mark_sharding(xt, _mesh(xs, (1, 8)), (0, 1))
    with pytest.raises(RuntimeError, match="clear_sharding"):
        xs.mark_sharding(xt, _mesh(xs, (8, 1)), (0, 1))
    with pytest.raises(xs.MarkShardingError, match=r"Partition spec length \(1\)"):
        xs.mark_sharding(xt, _mesh(xs, (8, 1)), (0,))


def test_annotate_custom_sharding_replaces_the_layout(xs):
    t = torch.randn(2, 8)
    xt = t.to("xla")
    xs.mark_sharding(xt, _mesh(xs, (1, 8)), (0, 1))
    out = xs.annotate_custom_sharding(xt, _mesh(xs, (2, 4)), (0, 1))
    assert out.partition_spec == (0, 1) and out.mesh_shape == (2, 4)
    assert out.sharding_spec == "{devices=[2,4]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(xt.cpu(), t)


@pytest.mark.parametrize(
    ("ids", "shape", "names", "message"),
    [
        (np.arange(8), (1, 8), ("a", "b", "c"), "Number of axis names .* must match mesh dimensions"),
        (np.arange(8), (1, 8), ("a", "a"), "Axis names must be unique"),
        (np.arange(8), (2, 8), None, "Number of device IDs .* must match mesh size"),
        (np.zeros(8, dtype=int), (1, 8), None, "Device IDs must be unique"),
        (np.arange(9, 17), (1, 8), None, "Device IDs must be less than mesh size"),
        (np.arange(4), (4,), None, "must match the global number of devices"),
    ],
)
def test_mesh_validation_errors(xs, ids, shape, names, message):
    from spmdtorch.mesh import MeshError

    with pytest.raises(AssertionError, match=message) as err:
        xs.Mesh(ids, shape, names)
    assert isinstance(err.value, MeshError)


def test_mesh_extras(xs):
    import spmdtorch.mesh

    mesh = _mesh(xs, (2, 4), ("x", "y"))
    assert xs.Mesh.from_str(str(mesh)) == mesh
    assert xs.Mesh.from_str("not a mesh") is None
    assert isinstance(spmdtorch.mesh.get_1d_mesh("d"), xs.Mesh)
    assert isinstance(xs.get_1d_mesh(), xs.Mesh) and xs.get_1d_mesh().axis_names is None
    op = mesh.get_op_sharding(("x", None))
    assert op.sharding == mesh.named_sharding(("x", None))


def test_mark_sharding_function_shards_value_and_gradient(xs):
    torch.manual_seed(0)
    x = torch.randn(8, 8)
    xx = x.to("xla").requires_grad_(True)
    z = xx @ xx
    z.retain_grad()
    y = xs.MarkShardingFunction.apply(z, _mesh(xs, (1, 8)), (0, 1))
    import torch_xla

    assert torch_xla._XLAC._get_xla_sharding_spec(y) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    (y * y).sum().backward()
    assert torch_xla._XLAC._get_xla_sharding_spec(z.grad) == "{devices=[1,8]0,1,2,3,4,5,6,7}"
    xc = x.clone().requires_grad_(True)
    zc = xc @ xc
    (zc * zc).sum().backward()
    torch.testing.assert_close(xx.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    w = xs.mark_sharding_with_gradients(xx, _mesh(xs, (8, 1)), (0, None))
    assert w is not xx and torch_xla._XLAC._get_xla_sharding_spec(xx) == ""


def test_xla_patched_linear_matches_f_linear(xs):
    torch.manual_seed(0)
    x0, w0, b0 = torch.randn(2, 5, 3), torch.randn(4, 3), torch.randn(4)
    cpu = [t.clone().requires_grad_() for t in (x0, w0, b0)]
    F_out = nn.functional.linear(*cpu)
    F_out.sum().backward()
    xla = [t.to("xla").requires_grad_() for t in (x0, w0, b0)]
    out = xs.XLAPatchedLinear.apply(*xla)
    out.sum().backward()
    torch.testing.assert_close(out.cpu(), F_out, rtol=1e-5, atol=1e-5)
    for a, b in zip(xla, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)
    lin = nn.Linear(3, 4)
    torch.testing.assert_close(xs.xla_patched_nn_linear_forward(lin, x0), lin(x0))
    seq = xs.apply_xla_patch_to_nn_linear(nn.Sequential(lin))
    assert isinstance(seq[0], xs.EinsumLinear)
    torch.testing.assert_close(seq(x0), nn.functional.linear(x0, lin.weight, lin.bias))


def test_backward_optimization_barrier_keeps_gradients(xs):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1))
    x = torch.randn(2, 8)
    model(x).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    xmodel = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 1)).to("xla")
    xmodel.load_state_dict(model.state_dict())
    xs.apply_backward_optimization_barrier(xmodel[2])
    xmodel(x.to("xla")).sum().backward()
    for p, g in zip(xmodel.parameters(), expected):
        torch.testing.assert_close(p.grad.cpu(), g, rtol=1e-5, atol=1e-5)


def test_shard_as_gives_the_unannotated_side_the_sharding(xs):
    import torch_xla

    x = xs.mark_sharding_with_gradients(torch.arange(8.0, device="xla"), xs.get_1d_mesh(), (0,))
    y = torch.arange(8.0, device="xla")
    a, b = xs.shard_as({"t": x}, {"t": y})
    assert torch_xla._XLAC._get_xla_sharding_spec(b["t"]) == torch_xla._XLAC._get_xla_sharding_spec(x)
    torch.testing.assert_close(b["t"].cpu(), torch.arange(8.0))
    with pytest.raises(xs.MarkShardingError, match="same structure"):
        xs.shard_as([x], (y,))


def test_manual_sharding_returns_sharded_tensors(xs):
    mesh = _mesh(xs, (8,), ("d",))
    t = torch.arange(16.0)
    local = xs.enable_manual_sharding(t.to("xla"), ("d",), mesh=mesh)
    assert isinstance(local, xs.XLAShardedTensor) and tuple(local.shape) == (2,)
    full = xs.disable_manual_sharding(local * 2, ("d",), (16,), mesh=mesh)
    assert isinstance(full, xs.XLAShardedTensor)
    torch.testing.assert_close(full.cpu(), t * 2)


def test_sharding_spec_apply_returns_sharded_tensor(xs):
    spec = xs.ShardingSpec(_mesh(xs, (8, 1)), (0, None))
    t = torch.zeros(8, 2, device="xla")
    assert spec.can_apply(t) and not spec.can_apply(torch.zeros(8))
    assert isinstance(spec.apply(t), xs.XLAShardedTensor)


def test_fsdpv2_unknown_extra_axis_uses_pytorch_xla_wording(xs):
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

    mesh = _mesh(xs, (2, 4, 1), ("data", "fsdp", "tensor"))
    with pytest.raises(ValueError, match="The provided ddp axis is not in the mesh."):
        SpmdFullyShardedDataParallel(nn.Linear(4, 4).to("xla"), mesh, extra_data_axis="ddp")


def test_hybrid_mesh_lays_tpu_devices_out_by_coordinates_and_slice(xs, monkeypatch):
    import torch_xla.runtime as xr

    # Two slices of four chips in a row; names (ordinals) deliberately out of coordinate order.
    x_of = {0: 2, 1: 0, 2: 3, 3: 1, 4: 1, 5: 3, 6: 0, 7: 2}
    attrs = [
        {"name": f"TPU:{i}", "coords": [x_of[i], 0, 0], "core_on_chip": 0, "slice_index": i // 4} for i in range(8)
    ]
    monkeypatch.setattr(xr, "global_runtime_device_attributes", lambda: attrs)
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "model"))
    by_x = [sorted(range(s * 4, s * 4 + 4), key=lambda i: x_of[i]) for s in range(2)]
    assert mesh.get_logical_mesh().tolist() == by_x
    assert mesh.ici_mesh_shape == (1, 4) and mesh.dcn_mesh_shape == (2, 1)
    assert isinstance(mesh, xs.Mesh)


def test_hybrid_mesh_without_coordinates_follows_spmdtorch(xs):
    import spmdtorch.mesh

    mesh = xs.HybridMesh(ici_mesh_shape=(2, 4), axis_names=("a", "b"))
    native = spmdtorch.mesh.HybridMesh(ici_mesh_shape=(2, 4), axis_names=("a", "b"))
    assert mesh.get_logical_mesh().tolist() == native.get_logical_mesh().tolist()
    with pytest.raises(spmdtorch.mesh.HybridMeshError):
        xs.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1))


def test_sharded_tensor_works_where_the_tensor_did(xs):
    import copy
    import io

    import torch_xla
    import torch_xla.core.xla_model as xm

    t = torch.arange(8.0)
    xst = xs.mark_sharding(t.to("xla"), xs.get_1d_mesh(), (0,))
    dup = copy.deepcopy(xst)
    assert torch_xla._XLAC._get_xla_sharding_spec(dup) == xst.sharding_spec
    xm.mark_step()
    assert xst.sum().item() == t.sum().item()
    buf = io.BytesIO()
    torch.save(xst, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False).cpu(), t)
    torch.testing.assert_close(xst[2:4].cpu(), t[2:4])
    assert xst.to("cpu").device.type == "cpu"


def test_spmd_package_exposes_the_dtensor_bridge_names(xs):
    from torch_xla.distributed.spmd import api

    for name in ("xla_distribute_tensor", "xla_distribute_module", "auto_policy"):
        assert getattr(xs, name) is getattr(api, name)
    from torch_xla.distributed.spmd.xla_sharded_tensor import XLAShard, XLAShardedTensor

    assert XLAShardedTensor is xs.XLAShardedTensor and XLAShard is xs.XLAShard


def test_op_shardings_are_cached_and_counted(xs):
    import torch_xla.debug.metrics as met

    met.clear_all()
    mesh = _mesh(xs, (1, 8))
    xs.mark_sharding(torch.zeros(1, 8, device="xla"), mesh, (0, 1))
    assert met.counter_value("CreateOpSharding") == 1
    xs.mark_sharding(torch.zeros(1, 8, device="xla"), mesh, (0, 1))
    assert met.counter_value("CreateOpSharding") == 1
    assert mesh.get_op_sharding((0, 1)) is mesh.get_op_sharding([0, 1])
    xs.mark_sharding(torch.zeros(1, 8, device="xla"), mesh, (0, None))
    assert met.counter_value("CreateOpSharding") == 2
