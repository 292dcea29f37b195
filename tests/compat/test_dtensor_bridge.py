"""The DTensor bridge (``torch_xla.distributed.spmd.api``) under compat, on 8 simulated devices.

``torch.distributed.tensor.distribute_tensor``/``distribute_module`` with an
``xla`` ``DeviceMesh`` reach these functions. Layouts are checked against
``mark_sharding`` with the equivalent partition spec; numerics against eager
CPU torch.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from torch.distributed.tensor import (
    DeviceMesh,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    init_device_mesh,
)

from spmdtorch.compat import _placements


def _spec(t: torch.Tensor) -> str:
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(getattr(t, "global_tensor", t))


def _reference_spec(shape, mesh_shape, partition_spec, device_ids=None) -> str:
    """The sharding string mark_sharding gives a fresh tensor for the same layout."""
    import torch_xla.distributed.spmd as xs

    ids = np.arange(8) if device_ids is None else np.asarray(device_ids)
    t = torch.zeros(shape, device="xla")
    xs.mark_sharding(t, xs.Mesh(ids, mesh_shape), partition_spec)
    return _spec(t)


# --- convert_to_xla_mesh -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "names"),
    [
        (list(range(8)), None),
        (torch.arange(8).reshape(2, 4), None),
        (torch.arange(8).flip(0).reshape(4, 2), ("data", "model")),
    ],
)
def test_convert_to_xla_mesh_keeps_order_shape_and_names(ids, names):
    from torch_xla.distributed.spmd import Mesh
    from torch_xla.distributed.spmd.api import convert_to_xla_mesh

    dt_mesh = DeviceMesh("xla", ids, mesh_dim_names=names)
    mesh = convert_to_xla_mesh(dt_mesh)
    assert isinstance(mesh, Mesh)
    assert list(mesh.device_ids) == dt_mesh.mesh.flatten().tolist()
    assert mesh.mesh_shape == tuple(dt_mesh.mesh.shape)
    assert mesh.axis_names == dt_mesh.mesh_dim_names


def test_convert_to_xla_mesh_from_init_device_mesh():
    from torch_xla.distributed.spmd.api import convert_to_xla_mesh

    mesh = convert_to_xla_mesh(init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp")))
    assert (mesh.mesh_shape, mesh.axis_names) == ((2, 4), ("dp", "tp"))


def test_convert_to_xla_mesh_refuses_a_partial_mesh_and_non_meshes():
    from torch_xla.distributed.spmd.api import convert_to_xla_mesh

    with pytest.raises(AssertionError, match=r"7 devices but the runtime has 8") as info:
        convert_to_xla_mesh(DeviceMesh("xla", list(range(7))))
    assert isinstance(info.value, _placements.DeviceMeshMismatchError)
    with pytest.raises(TypeError, match="must be a torch.distributed DeviceMesh, got list"):
        convert_to_xla_mesh(list(range(8)))


# --- placements <-> partition specs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("placements", "ndim", "expected"),
    [
        ([Replicate(), Shard(0)], 3, (1, None, None)),
        ([Shard(1), Shard(0)], 2, (1, 0)),
        ([Shard(-1)], 2, (None, 0)),
        ([Shard(0), Shard(0)], 2, ((0, 1), None)),
        ([Replicate(), Replicate()], 2, (None, None)),
    ],
)
def test_convert_to_xla_partition_spec(placements, ndim, expected):
    from torch_xla.distributed.spmd.api import convert_to_xla_partition_spec

    assert convert_to_xla_partition_spec(torch.zeros((2,) * ndim), placements) == expected


def test_bad_placements_raise_named_errors():
    from torch_xla.distributed.spmd.api import convert_to_xla_partition_spec

    with pytest.raises(IndexError, match=r"Shard\(2\) but the tensor has 2 dims") as info:
        convert_to_xla_partition_spec(torch.zeros(2, 2), [Shard(2)])
    assert isinstance(info.value, _placements.ShardDimError)
    with pytest.raises(ValueError, match="pending reduction") as err:
        convert_to_xla_partition_spec(torch.zeros(2, 2), [Partial()])
    assert isinstance(err.value, NotImplementedError)  # what XLAShardedTensor.redistribute raises upstream


@pytest.mark.parametrize(
    ("spec", "mesh_ndim", "names", "expected"),
    [
        ((0, None), 1, None, (Shard(0),)),
        ((None, 1), 2, None, (Replicate(), Shard(1))),
        ((1, 0), 2, None, (Shard(1), Shard(0))),
        ((("x", "y"), None), 2, ("x", "y"), (Shard(0), Shard(0))),
        (("y", None), 2, ("x", "y"), (Replicate(), Shard(0))),
    ],
)
def test_partition_spec_to_placements_round_trips(spec, mesh_ndim, names, expected):
    placements = _placements.partition_spec_to_placements(spec, mesh_ndim, names)
    assert placements == expected
    back = _placements.placements_to_partition_spec(placements, len(spec))
    want = tuple(
        None
        if e is None
        else tuple((names or ()).index(a) if isinstance(a, str) else a for a in e)
        if isinstance(e, tuple)
        else (names.index(e) if isinstance(e, str) else e)
        for e in spec
    )
    assert back == want


def test_dtensor_spec_reports_mesh_placements_and_meta():
    t = torch.zeros(8, 6, dtype=torch.bfloat16)
    spec = _placements.dtensor_spec(t, (2, 4), (None, 1))
    assert spec.mesh.device_type == "xla"
    assert spec.mesh.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert spec.placements == (Replicate(), Shard(1))
    assert (spec.tensor_meta.shape, spec.tensor_meta.dtype) == (t.shape, torch.bfloat16)
    with pytest.raises(ValueError, match="mesh_shape must be specified"):
        _placements.dtensor_spec(t, None, (None, 1))
    with pytest.raises(ValueError, match="partition_spec must be specified"):
        _placements.dtensor_spec(t, (8,), None)


# --- distribute_tensor ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ids", "placements", "spec"),
    [
        (list(range(8)), [Shard(0)], (0, None)),
        (torch.arange(8).reshape(2, 4), [Shard(0), Shard(1)], (0, 1)),
        (torch.arange(8).reshape(2, 4), [Replicate(), Shard(0)], (1, None)),
        (torch.arange(8).flip(0).reshape(2, 4), [Shard(1), Replicate()], (None, 0)),
    ],
)
def test_distribute_tensor_lays_out_as_mark_sharding_and_computes_like_cpu(ids, placements, spec):
    dt_mesh = DeviceMesh("xla", ids)
    cpu = torch.randn(16, 8)
    dt = distribute_tensor(cpu, dt_mesh, placements)  # a CPU tensor is moved to xla first
    assert type(dt).__name__ == "XLAShardedTensor"
    assert dt.partition_spec == spec
    order = dt_mesh.mesh.flatten().tolist()
    assert _spec(dt) == _reference_spec((16, 8), tuple(dt_mesh.mesh.shape), spec, order)
    out = dt.global_tensor @ dt.global_tensor.T + 1
    torch.testing.assert_close(out.cpu(), cpu @ cpu.T + 1)


def test_distribute_tensor_defaults_to_replicated_and_checks_placements_length():
    import torch_xla.distributed.spmd as xs

    mesh = DeviceMesh("xla", torch.arange(8).reshape(2, 4))
    dt = distribute_tensor(torch.ones(4, 4), mesh)
    assert dt.partition_spec == (None, None)
    assert xs.ShardingType(dt.sharding_type) == xs.ShardingType.REPLICATED
    with pytest.raises(ValueError, match="placements length: 1, and device_mesh.ndim: 2") as info:
        distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
    assert isinstance(info.value, _placements.PlacementsLengthError)


def test_distribute_tensor_keeps_an_xla_leaf_that_requires_grad():
    mesh = init_device_mesh("xla", (8,))
    cpu = torch.randn(16, 3)
    leaf = cpu.clone().to("xla").requires_grad_()
    dt = distribute_tensor(leaf, mesh, [Shard(0)])
    assert dt.global_tensor is leaf
    assert [tuple(s.data.shape) for s in dt.local_shards] == [(2, 3)] * 8
    (leaf * leaf).sum().backward()
    torch.testing.assert_close(leaf.grad.cpu(), 2 * cpu)


def test_distribute_tensor_reshards_a_replicated_tensor_and_refuses_a_split_one():
    import torch_xla.distributed.spmd as xs

    from spmdtorch.sharding import ShardingError

    mesh = DeviceMesh("xla", list(range(8)))
    cpu = torch.randn(8, 16)
    replicated = xs.mark_sharding(cpu.to("xla"), xs.Mesh(np.arange(8), (8,)), (None, None))
    dt = distribute_tensor(replicated, mesh, [Shard(1)])
    assert dt.global_tensor is replicated.global_tensor
    assert _spec(dt) == _reference_spec((8, 16), (8,), (None, 0))
    torch.testing.assert_close(dt.global_tensor.cpu(), cpu)
    split = cpu.to("xla")
    xs.mark_sharding(split, xs.Mesh(np.arange(8), (8,)), (0, None))
    with pytest.raises(ShardingError, match="clear_sharding"):
        distribute_tensor(split, mesh, [Shard(1)])


def test_distribute_tensor_refuses_an_already_sharded_wrapper():
    import torch_xla.distributed.spmd as xs

    mesh = DeviceMesh("xla", list(range(8)))
    wrapped = xs.mark_sharding(torch.zeros(8, 2, device="xla"), xs.Mesh(np.arange(8), (8,)), (0, None))
    with pytest.raises(RuntimeError, match="already annotated with non-replicated sharding"):
        distribute_tensor(wrapped, mesh, [Shard(1)])


# --- redistribute --------------------------------------------------------------------------------


def test_redistribute_reannotates_in_place_or_a_copy():
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(8), (2, 4))
    cpu = torch.randn(8, 16)
    t = cpu.to("xla")
    xs.mark_sharding(t, mesh, (0, None))
    done = _placements.redistribute(t, mesh, [Replicate(), Shard(1)])
    assert done.tensor is t and done.partition_spec == (None, 1)
    assert _spec(t) == _reference_spec((8, 16), (2, 4), (None, 1))
    copy = _placements.redistribute(
        t, DeviceMesh("xla", torch.arange(8).reshape(2, 4)), [Shard(0), Shard(1)], async_op=True
    )
    assert copy.tensor is not t
    assert _spec(copy.tensor) == _reference_spec((8, 16), (2, 4), (0, 1))
    assert _spec(t) == _reference_spec((8, 16), (2, 4), (None, 1))  # the original keeps its layout
    torch.testing.assert_close((copy.tensor * 3).cpu(), cpu * 3)
    torch.testing.assert_close(t.cpu(), cpu)
    with pytest.raises(ValueError, match=r"Number of placements \(1\) must match mesh dimensions \(2\)"):
        _placements.redistribute(t, mesh, [Shard(0)])


# --- distribute_module ---------------------------------------------------------------------------


class _Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train(model, data, target, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        if data.device.type == "xla":
            import torch_xla

            torch_xla.sync()
        losses.append(loss.item())
    return losses


def test_distribute_module_shards_with_partition_fn_and_trains_like_cpu():
    torch.manual_seed(0)
    cpu_model = _Mlp()
    model = _Mlp()
    model.load_state_dict(cpu_model.state_dict())
    model = model.to("xla")
    mesh = init_device_mesh("xla", (2, 4))
    seen = []

    def shard_params(name, mod, device_mesh):
        seen.append(name)
        assert device_mesh is mesh
        if isinstance(mod, nn.Linear):
            distribute_tensor(mod.weight, device_mesh, [Replicate(), Shard(0)])

    out = distribute_module(model, mesh, shard_params)
    assert out is model
    assert seen == ["", "fc1", "fc2"]
    assert _spec(model.fc1.weight) == _reference_spec((32, 16), (2, 4), (1, None))
    assert _spec(model.fc2.weight) == _reference_spec((4, 32), (2, 4), (1, None))
    data, target = torch.randn(8, 16), torch.randn(8, 4)
    want = _train(cpu_model, data, target)
    got = _train(model, data.to("xla"), target.to("xla"))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model.fc1.weight.cpu(), cpu_model.fc1.weight.detach(), rtol=1e-5, atol=1e-6)


def test_distribute_module_input_and_output_hooks():
    from torch_xla.distributed.spmd.api import xla_distribute_module

    mesh = DeviceMesh("xla", list(range(8)))
    calls = []

    def input_fn(mod, inputs, device_mesh):
        calls.append(("in", type(mod).__name__, device_mesh is mesh))
        return (inputs[0] * 2,)

    def output_fn(outputs, device_mesh):  # the deprecated two-argument form
        calls.append(("out", device_mesh is mesh))
        return outputs + 1

    lin = nn.Linear(4, 4)
    cpu_out = lin(torch.ones(2, 4) * 2) + 1
    model = lin.to("xla")
    with pytest.warns(FutureWarning, match="Deprecating output_fn that takes two arguments"):
        xla_distribute_module(model, mesh, input_fn=input_fn, output_fn=output_fn)
    got = model(torch.ones(2, 4, device="xla"))
    assert calls == [("in", "Linear", True), ("out", True)]
    torch.testing.assert_close(got.cpu(), cpu_out.detach())

    with pytest.raises(ValueError, match="input_fn should take in 3 arguments .* but got 1 arguments") as info:
        xla_distribute_module(nn.Linear(2, 2), mesh, input_fn=lambda x: x)
    assert type(info.value).__name__ == "DistributeModuleError"


def test_auto_policy_turns_on_auto_sharding_by_name():
    from torch_xla.distributed.spmd import auto_policy

    import spmdtorch

    assert auto_policy("fc1", nn.Linear(2, 2), None) is None  # as in PyTorch/XLA: a marker, a no-op itself
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = distribute_module(nn.Linear(2, 2), DeviceMesh("xla", list(range(8))), auto_policy)
        assert spmdtorch.runtime.auto_sharding_enabled()
        assert model.weight.device.type == "xla"  # moved, as PyTorch/XLA's bridge does
    finally:
        spmdtorch.runtime.set_auto_sharding(False)
