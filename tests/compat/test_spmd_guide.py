"""The SPMD and FSDPv2 user guides' snippets, as written there, on 8 simulated devices.

Numerics: each sharded program computes what the same code computes eagerly on the CPU.
"""

from __future__ import annotations

import collections
import copy
import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F


def test_spmd_basic_example():
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.spmd import Mesh

    xr.use_spmd()
    num_devices = xr.global_runtime_device_count()
    mesh_shape = (num_devices, 1)
    device_ids = np.array(range(num_devices))
    mesh = Mesh(device_ids, mesh_shape, ("data", "model"))

    cpu = torch.randn(8, 4)
    t = cpu.to(xm.xla_device())
    partition_spec = ("data", "model")
    xs.mark_sharding(t, mesh, partition_spec)
    import torch_xla

    assert torch_xla._XLAC._get_xla_sharding_spec(t) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    assert mesh.shape() == collections.OrderedDict([("data", 8), ("model", 1)])
    torch.testing.assert_close((t * 2).sum(0).cpu(), (cpu * 2).sum(0))


def test_partition_specs_of_other_ranks():
    import torch_xla
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    device = torch_xla.device()
    mesh = xs.Mesh(np.array(range(xr.global_runtime_device_count())), (4, 2), ("data", "model"))
    t1 = torch.randn(8, 8, 16).to(device)
    t2 = torch.randn(8).to(device)
    xs.mark_sharding(t1, mesh, (None, "data", "model"))
    spec = torch_xla._XLAC._get_xla_sharding_spec
    assert spec(t1) == "{devices=[1,4,2]0,1,2,3,4,5,6,7}"
    xs.mark_sharding(t2, mesh, ("data",))
    assert spec(t2) == "{devices=[4,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    t3 = torch.randn(8).to(device)
    xs.mark_sharding(t3, mesh, (("data", "model"),))
    assert spec(t3) == "{devices=[8]0,1,2,3,4,5,6,7}"


def test_mark_sharding_docstring_data_and_model_parallel_match_eager():
    import torch_xla.core.xla_model as xm
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr
    from torch_xla.distributed.spmd import Mesh

    mesh_shape = (4, 2)
    num_devices = xr.global_runtime_device_count()
    device_ids = np.array(range(num_devices))
    mesh = Mesh(device_ids, mesh_shape, ("x", "y"))
    torch.manual_seed(0)
    cpu_in, cpu_linear = torch.randn(8, 32), nn.Linear(32, 10)
    # 4-way data parallel
    input = cpu_in.to(xm.xla_device())
    xs.mark_sharding(input, mesh, (0, None))
    # 2-way model parallel
    linear = copy.deepcopy(cpu_linear).to(xm.xla_device())
    xs.mark_sharding(linear.weight, mesh, (None, 1))
    out = linear(input)
    out.sum().backward()
    cpu_linear(cpu_in).sum().backward()
    torch.testing.assert_close(out.cpu(), cpu_linear(cpu_in).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linear.weight.grad.cpu(), cpu_linear.weight.grad, rtol=1e-5, atol=1e-5)


def test_mesh_docstring_logical_mesh():
    import torch_xla.runtime as xr
    from torch_xla.distributed.spmd import Mesh

    # The guide sizes this mesh with len(xm.get_xla_supported_devices()), which is 1 in SPMD mode
    # (PyTorch/XLA's too); the runtime device count is what it means.
    num_devices = xr.global_runtime_device_count()
    mesh = Mesh(np.array(range(num_devices)), (4, 2), ("x", "y"))
    np.testing.assert_array_equal(mesh.get_logical_mesh(), np.array([[0, 1], [2, 3], [4, 5], [6, 7]]))
    assert mesh.shape() == collections.OrderedDict([("x", 4), ("y", 2)])


def test_hybrid_mesh_on_one_host():
    from torch_xla.distributed.spmd import HybridMesh

    # The docstring's dcn_mesh_shape=(2, 1, 1) needs 2 slices (2 processes: tests/multiprocess);
    # on one host every axis is ICI.
    mesh = HybridMesh(ici_mesh_shape=(2, 4, 1), axis_names=("data", "fsdp", "tensor"))
    assert mesh.shape() == collections.OrderedDict([("data", 2), ("fsdp", 4), ("tensor", 1)])


def test_sharding_spec_and_clear_sharding():
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = xs.Mesh(np.arange(8), (8,), ("data",))
    spec = xs.ShardingSpec(mesh, ("data", None))
    assert spec.mesh is mesh and tuple(spec.partition_spec) == ("data", None)
    t = xs.mark_sharding(torch.ones(8, 2, device="xla"), mesh, ("data", None))
    assert isinstance(t, xs.XLAShardedTensor)
    xs.clear_sharding(t)
    torch.testing.assert_close(t.cpu(), torch.ones(8, 2))
    assert torch_xla.runtime.is_spmd()


class MyModule(nn.Module):
    """The FSDPv2 guide's ``my_module``: ``model(x, y)``."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x, y):
        return self.b(F.gelu(self.a(x))) * y


def _fsdp_mesh():
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    num_devices = xr.global_runtime_device_count()
    mesh_shape = (num_devices, 1)
    device_ids = np.array(range(num_devices))
    return xs.Mesh(device_ids, mesh_shape, ("fsdp", "model"))


@pytest.mark.parametrize("wrap", ["plain", "checkpoint_module"])
def test_fsdpv2_example_usage_matches_eager(wrap):
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp import checkpoint_module
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    torch.manual_seed(0)
    cpu_module = MyModule()
    my_module = copy.deepcopy(cpu_module)  # the same initial weights
    cpu_x, cpu_y = torch.randn(16, 16), torch.randn(16, 16)
    cpu_opt = torch.optim.Adam(cpu_module.parameters(), lr=0.0001)
    cpu_loss = cpu_module(cpu_x, cpu_y).sum()
    cpu_loss.backward()
    cpu_opt.step()

    mesh = _fsdp_mesh()
    x, y = cpu_x.to("xla"), cpu_y.to("xla")
    x = xs.mark_sharding(x, mesh, ("fsdp", None))
    my_module = my_module.to("xla")
    model = FSDPv2(checkpoint_module(my_module) if wrap == "checkpoint_module" else my_module, mesh)
    optim = torch.optim.Adam(model.parameters(), lr=0.0001)
    output = model(x, y)
    loss = output.sum()
    loss.backward()
    optim.step()
    torch.testing.assert_close(loss.item(), cpu_loss.item(), rtol=1e-5, atol=1e-4)
    import torch_xla

    assert torch_xla._XLAC._get_xla_sharding_spec(model.module.a.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    for p, q in zip(model.module.parameters(), cpu_module.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


class DecoderLayer(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.ff = nn.Linear(d, d)

    def forward(self, h):
        return h + F.gelu(self.ff(h))


class Output:
    def __init__(self, logits):
        self.logits = logits


class TinyLM(nn.Module):
    def __init__(self, vocab=32, d=16, n=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([DecoderLayer(d) for _ in range(n)])

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return Output(h @ self.embed.weight.t())


def test_fsdpv2_auto_wrap_and_shard_output_positional_match_eager():
    import torch_xla
    import torch_xla.distributed.spmd as xs
    from torch_xla.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel as FSDPv2

    torch.manual_seed(0)
    cpu_model = TinyLM()
    tokens = torch.randint(0, 32, (8, 6))
    cpu_logits = cpu_model(tokens).logits
    F.cross_entropy(cpu_logits.reshape(-1, 32), tokens.reshape(-1)).backward()

    mesh = _fsdp_mesh()

    def shard_output(output, mesh):
        real = output.logits if isinstance(output, Output) else output
        xs.mark_sharding(real, mesh, ("fsdp", None, None))

    auto_wrap_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = copy.deepcopy(cpu_model)
    model.zero_grad(set_to_none=True)
    model = FSDPv2(model.to("xla"), mesh, shard_output, auto_wrap_policy=auto_wrap_policy)
    assert isinstance(model.module.layers[0], FSDPv2)
    out = model(tokens.to("xla"))
    assert torch_xla._XLAC._get_xla_sharding_spec(out.logits) == "{devices=[8,1,1]0,1,2,3,4,5,6,7}"
    F.cross_entropy(out.logits.reshape(-1, 32), tokens.to("xla").reshape(-1)).backward()
    torch.testing.assert_close(out.logits.cpu(), cpu_logits.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.module.embed.weight.grad.cpu(), cpu_model.embed.weight.grad, rtol=1e-4, atol=1e-6)


def test_prepare_spmd_partition_spec_as_hugging_face_calls_it():
    from torch_xla.experimental.spmd_fully_sharded_data_parallel import _prepare_spmd_partition_spec

    t = torch.empty(4, 16, 8)
    assert _prepare_spmd_partition_spec(t) == ("fsdp", None, None)
    assert _prepare_spmd_partition_spec(t, shard_maximal=True) == (None, "fsdp", None)
    assert _prepare_spmd_partition_spec(t, extra_data_axis="data") == (("data", "fsdp"), None, None)
    assert _prepare_spmd_partition_spec(torch.empty(())) == ()
