"""spmdtorch.dtensor's per-process caches (op layouts, specs, layouts) and the optimizers' foreach path.

An op seen before with the same input layouts runs without sharding propagation
(``dtensor.op_layouts``); specs and annotations of a layout are built once
(``dtensor.specs``, ``dtensor.layouts``). Every test compares values with eager
CPU torch and placements with what a fresh propagation gives.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from spmdtorch import debug
from spmdtorch.dtensor import _tensor as dtensor_impl
from spmdtorch.dtensor import distribute_tensor, init_device_mesh

_CACHES = ("dtensor.op_layouts", "dtensor.specs", "dtensor.layouts")


@pytest.fixture
def mesh2(devices8):
    return init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))


def _size(name: str) -> int:
    return debug.cache_sizes()[name]


def _full(d: torch.Tensor) -> torch.Tensor:
    return (d.full_tensor() if isinstance(d, DTensor) else d).cpu()


def test_caches_are_registered_bounded_and_emptied_by_clear_caches(mesh2):
    x = distribute_tensor(torch.randn(8, 8), mesh2, [Shard(0), Replicate()])
    (x * 2).sum()
    stats = debug.cache_stats()
    for name in _CACHES:
        assert stats[name].maxsize is not None and stats[name].maxsize > 0, name
        assert stats[name].size > 0, name
    debug.clear_caches()
    assert [_size(n) for n in _CACHES] == [0, 0, 0]


def test_an_op_seen_before_does_not_propagate_again(mesh2, monkeypatch):
    debug.clear_caches()
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    x = distribute_tensor(a, mesh2, [Shard(0), Shard(1)])
    w = distribute_tensor(b, mesh2, [Replicate(), Shard(0)])
    first = torch.matmul(x, w)
    size = _size("dtensor.op_layouts")
    assert size > 0

    def no_propagation(*args, **kwargs):
        raise AssertionError("a cached op propagated its placements again")

    monkeypatch.setattr(dtensor_impl, "_propagate_uncached", no_propagation)
    monkeypatch.setattr(dtensor_impl, "_Propagate", no_propagation)
    second = torch.matmul(x, w)
    assert _size("dtensor.op_layouts") == size  # a hit adds nothing
    assert second.placements == first.placements
    assert second.to_local().shape == first.to_local().shape
    torch.testing.assert_close(_full(second), a @ b, rtol=1e-5, atol=1e-5)


def test_other_input_layouts_are_other_keys(mesh2):
    debug.clear_caches()
    a = torch.randn(8, 8)
    by_row = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    by_col = distribute_tensor(a, mesh2, [Replicate(), Shard(1)])
    rows, cols = torch.relu(by_row), torch.relu(by_col)
    assert rows.placements == (Shard(0), Replicate())
    assert cols.placements == (Replicate(), Shard(1))
    # The same calls again (hits) give the same placements.
    assert torch.relu(by_row).placements == rows.placements
    assert torch.relu(by_col).placements == cols.placements
    for d in (rows, cols):
        torch.testing.assert_close(_full(d), torch.relu(a))


def test_scalar_values_are_part_of_the_key(mesh2):
    debug.clear_caches()
    a = torch.randn(8, 8)
    x = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    for scale in (2.0, 3.0, 2, True):
        torch.testing.assert_close(_full(x * scale), a * scale)
    # dims are values too: a sum over each dim has its own placements
    s0, s1 = x.sum(0), x.sum(1)
    assert s0.placements != s1.placements
    torch.testing.assert_close(_full(s0), a.sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_full(s1), a.sum(1), rtol=1e-5, atol=1e-5)


def test_unhashable_arguments_bypass_the_cache(mesh2):
    debug.clear_caches()
    a = torch.randn(8, 8)
    x = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    before = debug.cache_stats()["dtensor.op_layouts"].bypasses
    for _ in range(2):
        y = x[slice(0, 4)]  # (a slice is unhashable before Python 3.12; the key spells it out)
        torch.testing.assert_close(_full(y), a[0:4])
    out = torch.einsum("ij,jk->ik", x, x)  # einsum's operand list holds DTensors: hashable specs
    torch.testing.assert_close(_full(out), a @ a, rtol=1e-5, atol=1e-5)
    assert debug.cache_stats()["dtensor.op_layouts"].bypasses == before


def test_results_of_a_cleared_cache_match_eager(mesh2):
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    x = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    y = distribute_tensor(b, mesh2, [Shard(0), Replicate()])
    first = (x * y + x).softmax(-1)
    debug.clear_caches()
    again = (x * y + x).softmax(-1)
    assert again.placements == first.placements
    torch.testing.assert_close(_full(again), (a * b + a).softmax(-1))


def test_gradients_through_cached_ops_match_eager(mesh2):
    debug.clear_caches()
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
    model = copy.deepcopy(ref).to("xla")
    for m, placements in ((model[0], [Replicate(), Shard(0)]), (model[2], [Replicate(), Shard(1)])):
        for name, p in list(m.named_parameters()):
            pl = placements if p.dim() == 2 else [Replicate(), Replicate()]
            m.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh2, pl)))
    x = torch.randn(4, 8)
    dx = distribute_tensor(x, mesh2, [Shard(0), Replicate()])
    for _ in range(2):  # the second pass runs from the cache
        model.zero_grad()
        ref.zero_grad()
        model(dx).sum().backward()
        ref(x).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert isinstance(p.grad, DTensor) and p.grad.placements == p.placements
            torch.testing.assert_close(_full(p.grad), q.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opt_cls", [torch.optim.AdamW, torch.optim.SGD])
def test_optimizers_over_dtensor_parameters_take_their_foreach_and_fused_paths(mesh2, opt_cls, monkeypatch):
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 8)
    model = copy.deepcopy(ref).to("xla")
    for name, p in list(model.named_parameters()):
        model.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh2, [Shard(0), Replicate()])))
    kwargs = {"lr": 0.1, "momentum": 0.9} if opt_cls is torch.optim.SGD else {"lr": 0.1, "weight_decay": 0.01}
    opt, ref_opt = opt_cls(model.parameters(), **kwargs), opt_cls(ref.parameters(), **kwargs)
    seen: list[tuple[str, type]] = []

    def spy(name):
        real = getattr(torch, name)

        def call(*args, **kw):
            seen.append((name, type(args[0][0])))
            return real(*args, **kw)

        return call

    for name in ("_foreach_add_", "_fused_adamw_"):
        monkeypatch.setattr(torch, name, spy(name))
    for step in range(3):
        x = torch.randn(4, 8)
        opt.zero_grad()
        ref_opt.zero_grad()
        model(distribute_tensor(x, mesh2, [Shard(0), Replicate()])).square().sum().backward()
        ref(x).square().sum().backward()
        opt.step()
        ref_opt.step()
        assert opt.param_groups[0]["foreach"] is None, "the group is left as the user made it"
        for p, q in zip(model.parameters(), ref.parameters()):
            assert p.placements == (Shard(0), Replicate())
            torch.testing.assert_close(_full(p), q, rtol=1e-5, atol=1e-5, msg=f"step {step}")
    # foreach over the DTensors (AdamW's first step too); AdamW fused from its second step
    assert ("_foreach_add_", dtensor_impl.XlaDTensor) in seen
    fused = [t for name, t in seen if name == "_fused_adamw_"]
    assert fused == ([dtensor_impl.XlaDTensor] * 2 if opt_cls is torch.optim.AdamW else [])


def test_a_cached_op_converts_no_partition_spec(mesh2, monkeypatch):
    # Each result's annotation reuses its layout's NamedSharding (a ShardingSpec per layout in dtensor.layouts).
    from spmdtorch.mesh import Mesh

    a, b = torch.randn(8, 16), torch.randn(8, 16)
    w = distribute_tensor(b, mesh2, [Replicate(), Shard(1)]).requires_grad_(True)
    x = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    first = (x * w).relu()
    converted = []
    real = Mesh.named_sharding
    monkeypatch.setattr(Mesh, "named_sharding", lambda self, *a, **k: converted.append(a) or real(self, *a, **k))
    again = (x * w).relu()
    again.sum().backward()
    assert converted == [], "a cached DTensor op converted a partition spec again"
    assert again.placements == first.placements
    torch.testing.assert_close(_full(again), (a * b).relu())
    torch.testing.assert_close(_full(w.grad), (a * b > 0).float() * a)


def test_a_cached_step_builds_specs_only_for_gradients_of_other_metadata(mesh2, monkeypatch):
    # A gradient with its tensor's placements (no Partial) and metadata takes the tensor's own spec.
    torch.manual_seed(0)
    ref = torch.nn.Linear(16, 8)
    model = copy.deepcopy(ref).to("xla")
    for name, p in list(model.named_parameters()):
        pl = [Replicate(), Shard(0)]
        model.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh2, pl)))
    x = torch.randn(4, 16)
    dx = distribute_tensor(x, mesh2, [Shard(0), Replicate()])
    model(dx).relu().sum().backward()  # the first step fills the caches
    real = dtensor_impl._spec
    built: list[tuple] = []
    monkeypatch.setattr(dtensor_impl, "_spec", lambda *a: built.append((a[1], dtensor_impl._meta(a[2]))) or real(*a))
    model.zero_grad()
    loss = model(dx).relu().sum()
    built.clear()
    loss.backward()
    # (only sum's gradient, an expanded tensor (stride 0), has metadata of its own)
    assert [meta[1] for _, meta in built] == [(0, 0)], f"the backward of a cached step built specs for {built}"
    ref(x).relu().sum().backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert p.grad.placements == p.placements
        torch.testing.assert_close(_full(p.grad), q.grad, rtol=1e-5, atol=1e-5)


def test_a_cached_forward_reads_no_dtensor_attribute_through_torch_function(mesh2, monkeypatch):
    # The joints read requires_grad and is_leaf off the wrappers directly: each read through
    # XlaDTensor.__torch_function__ is a whole torch-function call (about 1.5 us).
    a, b = torch.randn(8, 16), torch.randn(8, 16)
    w = distribute_tensor(b, mesh2, [Replicate(), Shard(1)]).requires_grad_(True)
    x = distribute_tensor(a, mesh2, [Shard(0), Replicate()])
    (x * w).relu().sum()  # fills the caches
    reads: list[str] = []
    real = dtensor_impl.XlaDTensor.__torch_function__.__func__

    def counting(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "__get__":
            reads.append(func.__self__.__name__)
        return real(cls, func, types, args, kwargs)

    monkeypatch.setattr(dtensor_impl.XlaDTensor, "__torch_function__", classmethod(counting))
    loss = (x * w).relu().sum()
    assert reads == [], f"a cached forward read {reads} through __torch_function__"
    loss.backward()
    torch.testing.assert_close(_full(loss), (a * b).relu().sum(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_full(w.grad), (a * b > 0).float() * a)
