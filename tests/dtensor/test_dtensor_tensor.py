"""spmdtorch.dtensor DTensors: torch's placements as GSPMD annotations; values compared with eager CPU torch."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

import spmdtorch
from spmdtorch.dtensor import (
    InplaceGradError,
    LocalTensorError,
    PlacementError,
    UnsupportedPlacementError,
    XlaDTensor,
    distribute_tensor,
    from_local,
    init_device_mesh,
    spmd_mesh,
)
from spmdtorch.sharding import get_sharding_spec, mark_sharding


@pytest.fixture
def mesh2(devices8):
    return init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))


def _spec_of(t: torch.Tensor) -> str:
    return get_sharding_spec(t.to_local() if isinstance(t, DTensor) else t)


def _marked(mesh, values: torch.Tensor, spec: tuple) -> str:
    """The sharding string spmdtorch's own mark_sharding gives `spec` (written by hand) on the root mesh."""
    return get_sharding_spec(mark_sharding(values.to("xla"), spmd_mesh(mesh), spec))


@pytest.mark.parametrize(
    ("shape", "names", "sub", "placements", "spec"),
    [
        ((8,), ("x",), None, [Shard(0)], ("x", None)),
        ((8,), ("x",), None, [Shard(1)], (None, "x")),
        ((2, 4), ("dp", "tp"), None, [Shard(0), Replicate()], ("dp", None)),
        ((2, 4), ("dp", "tp"), None, [Replicate(), Shard(1)], (None, "tp")),
        ((2, 4), ("dp", "tp"), None, [Shard(1), Shard(0)], ("tp", "dp")),
        ((2, 4), ("dp", "tp"), None, [Shard(0), Shard(0)], (("dp", "tp"), None)),
        ((2, 4), ("dp", "tp"), ("tp",), [Shard(0)], ("tp", None)),
        ((2, 2, 2), ("a", "b", "c"), None, [Shard(1), Replicate(), Shard(0)], ("c", "a")),
        ((2, 2, 2), ("a", "b", "c"), ("a", "c"), [Replicate(), Shard(1)], (None, "c")),
    ],
)
def test_distribute_tensor_is_the_equivalent_annotation(devices8, shape, names, sub, placements, spec):
    mesh = init_device_mesh("xla", shape, mesh_dim_names=names)
    target = mesh if sub is None else mesh[sub if len(sub) > 1 else sub[0]]
    x = torch.randn(8, 8)
    d = distribute_tensor(x, target, placements)
    assert isinstance(d, DTensor) and isinstance(d, XlaDTensor)
    assert d.placements == tuple(placements) and d.device_mesh == target
    assert d.shape == x.shape and d.dtype == x.dtype and d.device.type == "xla"
    assert _spec_of(d) == _marked(mesh, x, spec)
    assert torch.equal(d.full_tensor().cpu(), x)


def test_uneven_shards(mesh2):
    x = torch.randn(7, 5)
    d = distribute_tensor(x, mesh2, [Shard(1), Shard(0)])
    assert _spec_of(d) == _marked(mesh2, x, ("tp", "dp"))
    assert torch.equal(d.full_tensor().cpu(), x)
    y = (d * 3).sum(0)
    torch.testing.assert_close(y.full_tensor().cpu(), (x * 3).sum(0))


def test_ops_follow_torch_placement_rules_and_equal_eager(mesh2):
    x, w1, w2 = torch.randn(8, 6), torch.randn(6, 16), torch.randn(16, 6)
    dx = distribute_tensor(x, mesh2, [Shard(0), Replicate()])
    dw1 = distribute_tensor(w1, mesh2, [Replicate(), Shard(1)])  # column-wise
    dw2 = distribute_tensor(w2, mesh2, [Replicate(), Shard(0)])  # row-wise
    h = torch.relu(dx @ dw1)
    assert h.placements == (Shard(0), Shard(1))
    assert _spec_of(h) == _marked(mesh2, torch.zeros(8, 16), ("dp", "tp"))
    out = h @ dw2
    # Row-wise: each tp device holds a partial sum; here the global tensor holds the reduced value.
    assert out.placements == (Shard(0), Partial())
    assert _spec_of(out) == _marked(mesh2, torch.zeros(8, 6), ("dp", None))
    torch.testing.assert_close(out.full_tensor().cpu(), torch.relu(x @ w1) @ w2)
    r = out.redistribute(mesh2, [Shard(0), Replicate()])
    assert r.placements == (Shard(0), Replicate())
    torch.testing.assert_close(r.to_local().cpu(), torch.relu(x @ w1) @ w2)
    total = out.sum()
    assert total.placements == (Partial(), Partial())
    torch.testing.assert_close(total.full_tensor().cpu(), (torch.relu(x @ w1) @ w2).sum())


def test_redistribute_is_a_reannotated_copy(mesh2):
    x = torch.randn(8, 8)
    d = distribute_tensor(x, mesh2, [Shard(0), Replicate()])
    r = d.redistribute(mesh2, [Replicate(), Shard(1)])
    assert r.placements == (Replicate(), Shard(1)) and d.placements == (Shard(0), Replicate())
    assert _spec_of(r) == _marked(mesh2, x, (None, "tp"))
    assert _spec_of(d) == _marked(mesh2, x, ("dp", None))  # the source keeps its layout
    assert torch.equal(r.full_tensor().cpu(), x)
    half = d.redistribute(placements=[Shard(0), Shard(1)], forward_dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and torch.equal(half.full_tensor().cpu(), x.to(torch.bfloat16))
    with pytest.raises(PlacementError, match="Partial"):
        d.redistribute(mesh2, [Partial(), Replicate()])
    with pytest.raises(PlacementError, match="required"):
        d.redistribute(mesh2)


def test_to_local_and_from_local_are_the_global_tensor(mesh2):
    x = torch.randn(8, 4)
    d = distribute_tensor(x, mesh2, [Shard(0), Shard(1)])
    local = d.to_local()
    assert not isinstance(local, DTensor) and local.shape == x.shape
    assert torch.equal(local.cpu(), x)
    back = XlaDTensor.from_local(local, mesh2, d.placements)
    assert back.placements == d.placements and _spec_of(back) == _spec_of(d)
    e = from_local(x, mesh2["tp"], [Shard(1)])
    assert e.shape == x.shape and torch.equal(e.full_tensor().cpu(), x)
    with pytest.raises(LocalTensorError, match="global tensor"):
        from_local(x, mesh2, [Shard(0), Replicate()], shape=(16, 4))
    with pytest.raises(LocalTensorError, match="reduce first"):
        from_local(x, mesh2, [Partial(), Replicate()])


def test_gradients_and_optimizer_equal_eager(mesh2):
    torch.manual_seed(0)
    w_ref = torch.randn(6, 16, requires_grad=True)
    x = torch.randn(8, 6)
    w = distribute_tensor(w_ref.detach().clone(), mesh2, [Replicate(), Shard(1)])
    w.requires_grad_(True)
    assert w.is_leaf and w.requires_grad
    dx = distribute_tensor(x, mesh2, [Shard(0), Replicate()])
    loss = torch.tanh(dx @ w).pow(2).mean()
    loss.backward()
    ref = torch.tanh(x @ w_ref).pow(2).mean()
    ref.backward()
    torch.testing.assert_close(loss.full_tensor().cpu(), ref.detach())
    assert isinstance(w.grad, XlaDTensor) and w.grad.placements == (Replicate(), Shard(1))
    assert _spec_of(w.grad) == _marked(mesh2, torch.zeros(6, 16), (None, "tp"))
    torch.testing.assert_close(w.grad.full_tensor().cpu(), w_ref.grad)
    # torch's optimizer updates the DTensor parameter in place; it keeps its placements and layout.
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    opt_ref = torch.optim.SGD([w_ref], lr=0.1, momentum=0.9)
    opt.step()
    opt_ref.step()
    spmdtorch.sync()
    assert w.placements == (Replicate(), Shard(1))
    assert _spec_of(w) == _marked(mesh2, torch.zeros(6, 16), (None, "tp"))
    torch.testing.assert_close(w.full_tensor().cpu(), w_ref.detach())


def test_parameter_of_a_dtensor(mesh2):
    p = torch.nn.Parameter(distribute_tensor(torch.randn(4, 8), mesh2, [Replicate(), Shard(0)]))
    assert isinstance(p, torch.nn.Parameter) and isinstance(p, XlaDTensor) and p.requires_grad
    assert p.placements == (Replicate(), Shard(0))


def test_inplace_on_grad_dtensor_is_a_named_error(mesh2):
    d = distribute_tensor(torch.randn(8, 4), mesh2, [Shard(0), Replicate()])
    h = d.requires_grad_(True) * 2
    with pytest.raises(InplaceGradError, match="out of place"):
        h.relu_()
    with pytest.raises(InplaceGradError, match="in-place op"):
        h += 1
    # Reading dunders (__int__, __index__...) are not writes, on a DTensor that requires grad too.
    total = h.sum()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's own note on reading a tensor that needs grad
        assert int(total) == int(float(total.detach()))
    with torch.no_grad():
        before = d.full_tensor().cpu()
        assert d.add_(1) is d
    assert torch.equal(d.full_tensor().detach().cpu(), before + 1)


class _Custom(Placement):
    pass


def test_placements_without_gspmd_meaning(mesh2):
    x = torch.randn(8, 8)
    with pytest.raises(UnsupportedPlacementError, match="_Custom"):
        distribute_tensor(x, mesh2, [_Custom(), Replicate()])
    with pytest.raises(UnsupportedPlacementError, match="two Shard"):
        distribute_tensor(x, mesh2, [_StridedShard(0, split_factor=2), Shard(0)])
    with pytest.raises(PlacementError, match="2-dim mesh"):
        distribute_tensor(x, mesh2, [Shard(0)])
    with pytest.raises(PlacementError, match="Shard\\(2\\)"):
        distribute_tensor(x, mesh2, [Shard(2), Replicate()])


def test_sub_mesh_placements_leave_the_other_axes_to_gspmd(mesh2):
    # A batch split over dp; a placement on mesh["tp"] says nothing about dp (each dp group
    # has its own data in multi-controller DTensor), so it must not gather the batch.
    m = spmd_mesh(mesh2)
    x = mark_sharding(torch.randn(8, 4).to("xla"), m, ("dp", None))
    before = get_sharding_spec(x)
    d = from_local(x, mesh2["tp"], [Replicate()])
    assert get_sharding_spec(d.to_local()) == before
    y = d * 2
    assert y.placements == (Replicate(),)
    torch.testing.assert_close(y.full_tensor().cpu(), x.cpu() * 2)
    # Parameters made on the sub-mesh are laid out there, replicated over dp (as torch's are).
    w = distribute_tensor(torch.randn(8, 4), mesh2["tp"], [Shard(0)])
    assert _spec_of(w) == _marked(mesh2, torch.zeros(8, 4), ("tp", None))
    # On a mesh spanning every root axis the placement is the whole layout.
    e = from_local(torch.randn(8, 4).to("xla"), mesh2, [Replicate(), Shard(0)])
    assert _spec_of(e) == _marked(mesh2, torch.zeros(8, 4), ("tp", None))


def test_partial_results_redistribute_to_any_layout(mesh2):
    # Row-wise products are Partial over tp; turning them into Shard is DTensor's reduce-scatter.
    a, b = torch.randn(8, 8), torch.randn(8, 6)
    da = distribute_tensor(a, mesh2, [Replicate(), Shard(1)])
    db = distribute_tensor(b, mesh2, [Replicate(), Shard(0)])
    p = da @ db
    assert p.placements == (Replicate(), Partial())
    s = p.redistribute(mesh2, [Replicate(), Shard(0)])
    assert s.placements == (Replicate(), Shard(0))
    assert _spec_of(s) == _marked(mesh2, torch.zeros(8, 6), ("tp", None))
    torch.testing.assert_close(s.full_tensor().cpu(), a @ b)
    # to another mesh over the same devices (the tp sub-mesh): a layout change like any other
    t = s.redistribute(mesh2["tp"], [Shard(1)])
    assert t.device_mesh == mesh2["tp"] and t.placements == (Shard(1),)
    torch.testing.assert_close(t.full_tensor().cpu(), a @ b)


def test_gradient_through_to_local_with_grad_placements(mesh2):
    x = torch.randn(8, 4)
    d = distribute_tensor(x, mesh2, [Shard(0), Replicate()]).requires_grad_(True)
    local = d.to_local(grad_placements=[Replicate(), Replicate()])
    (local * 3).sum().backward()
    assert d.grad.placements == (Replicate(), Replicate())
    torch.testing.assert_close(d.grad.full_tensor().cpu(), torch.full((8, 4), 3.0))
