"""mark_sharding on tensors and modules: resharding, constraints, persistence, errors."""

import copy
import dataclasses

import jax
import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import (
    ShardingError,
    ShardingSpec,
    clear_sharding,
    load_local_shards_,
    local_shards,
    mark_sharding,
    mark_sharding_with_gradients,
    tensor_sharding,
)
from spmdtorch.tensor.dispatch import read_value


@pytest.fixture
def mesh():
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def spec_of(t):
    return tuple(tensor_sharding(t).spec)


def test_concrete_tensor_is_resharded_in_place(mesh):
    src = torch.arange(32.0).reshape(8, 4)
    x = src.to("xla")
    assert mark_sharding(x, mesh, ("data", "model")) is x
    arr = read_value(x)
    assert isinstance(arr, jax.Array)
    assert arr.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    assert arr.addressable_shards[0].data.shape == (2, 2)
    torch.testing.assert_close(x.cpu(), src)


def test_pending_tensor_gets_a_constraint(mesh):
    x = torch.ones(8, 4, device="xla")
    y = x * 3
    mark_sharding(y, mesh, (0, None))  # int = mesh axis index
    hlo = spmdtorch.debug.get_hlo_text([y])
    assert "sharding=" in hlo
    spmdtorch.sync()
    assert read_value(y).sharding.spec == jax.sharding.PartitionSpec("data", None)
    torch.testing.assert_close(y.cpu(), torch.full((8, 4), 3.0))


def test_tuple_entry_shards_one_dim_over_two_axes(mesh):
    x = torch.arange(16.0).to("xla")
    mark_sharding(x, mesh, (("data", "model"),))
    arr = read_value(x)
    assert arr.addressable_shards[0].data.shape == (2,)
    torch.testing.assert_close(x.cpu(), torch.arange(16.0))


def test_parameters_keep_sharding_across_optimizer_steps(mesh):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    model = copy.deepcopy(ref).to("xla")
    mark_sharding(model[0].weight, mesh, ("model", None))
    mark_sharding(model[2].weight, mesh, (None, "model"))
    x = torch.randn(8, 8)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    xs = x.to("xla")
    mark_sharding(xs, mesh, ("data", None))
    for _ in range(5):
        with spmdtorch.step():
            opt.zero_grad()
            model(xs).pow(2).mean().backward()
            opt.step()
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
    assert read_value(model[0].weight).sharding.spec == jax.sharding.PartitionSpec("model", None)
    assert read_value(model[2].weight).sharding.spec == jax.sharding.PartitionSpec(None, "model")
    for p_ref, p in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5)


def test_sharding_survives_inplace_clone_and_deepcopy(mesh):
    w = torch.ones(8, 4).to("xla")
    mark_sharding(w, mesh, ("data", None))
    w.mul_(2)
    spmdtorch.sync()
    assert spec_of(w) == ("data", None)
    c = w.clone()
    spmdtorch.sync()
    assert read_value(c).sharding.spec == jax.sharding.PartitionSpec("data", None)
    d = copy.deepcopy(w)
    spmdtorch.sync()
    assert read_value(d).sharding.spec == jax.sharding.PartitionSpec("data", None)


def test_remark_rules(mesh):
    x = torch.zeros(8, 4).to("xla")
    mark_sharding(x, mesh, ("data", None))
    mark_sharding(x, mesh, ("data", None))  # same: no-op
    with pytest.raises(ShardingError, match="already annotated.*clear_sharding"):
        mark_sharding(x, mesh, (None, "model"))
    clear_sharding(x)
    mark_sharding(x, mesh, (None, "model"))
    assert spec_of(x) == (None, "model")


@pytest.mark.parametrize(
    "spec,exc,match",
    [
        (("data",), ShardingError, "has 1 entries but the tensor has 2 dims"),
        (("nope", None), Exception, "nope"),
        ((5, None), Exception, "5"),
    ],
)
def test_bad_specs_raise_clear_errors(mesh, spec, exc, match):
    x = torch.zeros(8, 4).to("xla")
    with pytest.raises(exc, match=match):
        mark_sharding(x, mesh, spec)


def test_cpu_tensor_is_rejected(mesh):
    with pytest.raises(ShardingError, match="xla device.*to\\('xla'\\)"):
        mark_sharding(torch.zeros(8, 4), mesh, ("data", None))


def test_module_rules(mesh):
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)).to("xla")
    mark_sharding(m, mesh, {"0.weight": ("model", None)})
    assert spec_of(m[0].weight) == ("model", None)
    assert not m[1].weight._st.annotated  # unmatched parameters stay replicated
    with pytest.raises(ShardingError, match="matches no parameter"):
        mark_sharding(m, mesh, {"2.weight": (None, None)})
    with pytest.raises(ShardingError, match="matched by two rules"):
        mark_sharding(m, mesh, {"1.weight": (None, "model"), "1.*": (None, "model")})
    with pytest.raises(ShardingError, match="parameter '1.bias'"):
        mark_sharding(m, mesh, {"1.bias": (None, None)})


def test_mark_sharding_with_gradients_annotates_the_gradient(mesh):
    x = torch.ones(8, 4).to("xla").requires_grad_(True)
    y = mark_sharding_with_gradients(x * 2, mesh, ("data", None))
    (y * y).sum().backward()
    spmdtorch.sync()
    assert read_value(y).sharding.spec == jax.sharding.PartitionSpec("data", None)
    torch.testing.assert_close(x.grad.cpu(), torch.full((8, 4), 8.0))


def test_mark_sharding_with_gradients_rejects_a_cpu_tensor(mesh):
    # Found by mypy: the view check read ``t._chain`` first, so a CPU tensor
    # raised AttributeError instead of the named error every marking raises.
    with pytest.raises(ShardingError, match="mark_sharding_with_gradients expects a tensor on the xla device"):
        mark_sharding_with_gradients(torch.ones(8, 4), mesh, ("data", None))


def test_mark_sharding_with_gradients_accepts_a_view(mesh):
    x = torch.ones(4, 8).to("xla")
    y = mark_sharding_with_gradients(x.t(), mesh, ("data", None))  # a view: the marked copy is not one
    spmdtorch.sync()
    assert read_value(y).sharding.spec == jax.sharding.PartitionSpec("data", None)


def test_sharding_spec_value_type(mesh):
    spec = ShardingSpec(mesh, ["data", None])
    assert spec.partition_spec == ("data", None)
    x = spec.apply(torch.zeros(8, 2).to("xla"))
    assert spec_of(x) == ("data", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.minibatch = True


def test_sharding_spec_converts_its_spec_once_and_applies_as_mark_sharding(mesh, monkeypatch):
    spec = ShardingSpec(mesh, ("data", None))
    views = [torch.arange(16.0).reshape(2, 8).to("xla").t() for _ in range(3)]
    spec.apply(views[0])  # the first application converts the spec
    converted = []
    real = Mesh.named_sharding
    monkeypatch.setattr(Mesh, "named_sharding", lambda self, *a, **k: converted.append(a) or real(self, *a, **k))
    pending = spec.apply(torch.ones(8, 2).to("xla") * 3)  # a pending value: a constraint
    view = spec.apply(views[1])  # a view: its own value is constrained
    assert converted == [], "ShardingSpec.apply converted its spec again"
    marked = mark_sharding(views[2], mesh, ("data", None))
    assert spec_of(pending) == spec_of(view) == spec_of(marked) == ("data", None)
    torch.testing.assert_close(view.cpu(), torch.arange(16.0).reshape(2, 8).t())
    torch.testing.assert_close(pending.cpu(), torch.full((8, 2), 3.0))
    with pytest.raises(ShardingError, match="has 2 entries but the tensor has 1 dims"):
        spec.apply(torch.ones(8).to("xla"))
    with pytest.raises(ShardingError, match="already annotated"):
        ShardingSpec(mesh, (None, "model")).apply(pending)


def test_local_shards_roundtrip(mesh):
    src = torch.arange(32.0).reshape(8, 4)
    x = mark_sharding(src.to("xla"), mesh, ("data", "model"))
    shards = local_shards(x)
    assert len(shards) == 8
    for s in shards:
        torch.testing.assert_close(s.data, src[s.indices])
    load_local_shards_(x, [s.data * 10 for s in shards])
    torch.testing.assert_close(x.cpu(), src * 10)
    assert spec_of(x) == ("data", "model")


def test_partitioned_program_contains_collectives(mesh):
    a = mark_sharding(torch.randn(8, 16).to("xla"), mesh, (None, "model"))
    b = mark_sharding(torch.randn(16, 4).to("xla"), mesh, ("model", None))
    c = a @ b  # contraction over the sharded dim: XLA must all-reduce
    from spmdtorch.lazy import executor
    from spmdtorch.tensor.dispatch import read_value as rv

    compiled = executor.lower([rv(c)]).compile().as_text()
    assert "all-reduce" in compiled
    torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu(), rtol=1e-5, atol=1e-5)


def test_inspection_strings_types_and_picture(mesh):
    from rich.console import Console

    from spmdtorch.partition import (
        ShardingType,
        get_sharding_spec,
        sharding_type,
        visualize_tensor_sharding,
    )

    plain = torch.zeros(8, 4).to("xla")
    assert get_sharding_spec(plain) == ""
    assert sharding_type(plain) == ShardingType.REPLICATED
    tiled = mark_sharding(torch.zeros(8, 4).to("xla"), mesh, ("data", "model"))
    assert get_sharding_spec(tiled) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    assert sharding_type(tiled) == ShardingType.TILED
    rows = mark_sharding(torch.zeros(8, 4).to("xla"), mesh, ("data", None))
    assert get_sharding_spec(rows) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert sharding_type(rows) == ShardingType.PARTIAL
    pending = torch.ones(8, 4, device="xla") * 2
    mark_sharding(pending, mesh, (None, "model"))
    assert get_sharding_spec(pending) == "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    console = Console(record=True, width=80)
    visualize_tensor_sharding(tiled, console=console, use_color=False)
    text = console.export_text()
    assert "CPU 0" in text and "CPU 7" in text


@pytest.mark.parametrize("spec", [("data", "model"), ("data", None), (None, ("data", "model"))])
def test_uneven_dims_are_padded_and_exact(mesh, spec):
    src = torch.arange(30.0).reshape(6, 5)
    x = mark_sharding(src.to("xla"), mesh, spec)
    arr = read_value(x)  # the logical value: a slice of the padded storage
    assert tuple(x._st.value.shape) != (6, 5)  # storage is padded...
    per_device = x._st.value.addressable_shards[0].data.size
    assert per_device < 30  # ...and no device holds a full copy
    torch.testing.assert_close(x.cpu(), src)
    torch.testing.assert_close(((x * 2).sum(0) + x.mean()).cpu(), (src * 2).sum(0) + src.mean())
    x.mul_(3)
    spmdtorch.sync()
    torch.testing.assert_close(x.cpu(), src * 3)
    assert get_sharding_spec_str(x) != ""
    shards = local_shards(x)
    covered = torch.zeros(6, 5)
    for s in shards:
        torch.testing.assert_close(s.data, (src * 3)[s.indices])
        covered[s.indices] += 1
    assert bool((covered > 0).all())
    load_local_shards_(x, [s.data + 1 for s in shards])
    torch.testing.assert_close(x.cpu(), src * 3 + 1)
    del arr


def get_sharding_spec_str(t):
    from spmdtorch.partition import get_sharding_spec

    return get_sharding_spec(t)


def test_uneven_parameter_trains_like_eager(mesh):
    torch.manual_seed(0)
    ref = torch.nn.Linear(5, 3)
    model = copy.deepcopy(ref).to("xla")
    mark_sharding(model.weight, mesh, ("data", "model"))  # 3x5 over 4x2: uneven both dims
    x = torch.randn(6, 5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for _ in range(4):
        with spmdtorch.step():
            opt.zero_grad()
            model(x.to("xla")).pow(2).sum().backward()
            opt.step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    torch.testing.assert_close(model.weight.cpu(), ref.weight.detach(), rtol=1e-5, atol=1e-5)
    assert tensor_sharding(model.weight).spec == jax.sharding.PartitionSpec("data", "model")


def test_uneven_sharding_survives_clone_and_deepcopy(mesh):
    from spmdtorch.partition import get_sharding_spec

    w = mark_sharding(torch.arange(30.0).reshape(6, 5).to("xla"), mesh, ("data", "model"))
    c = w.clone()
    d = copy.deepcopy(w)
    spmdtorch.sync()
    for t in (c, d):
        assert get_sharding_spec(t) == get_sharding_spec(w) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
        torch.testing.assert_close(t.cpu(), torch.arange(30.0).reshape(6, 5))


def test_gradient_views_report_their_sharding(mesh):
    from spmdtorch.partition import get_sharding_spec

    lin = torch.nn.Linear(4, 8).to("xla")
    mark_sharding(lin.weight, mesh, ("data", None))
    (torch.randn(2, 4).to("xla") @ lin.weight.t()).sum().backward()
    g = lin.weight.grad
    assert g._chain  # mm's backward through t(W) leaves the gradient as a view
    get_sharding_spec(g)  # views are inspectable (this raised before)
    # A view reports the placement its computed value gets:
    y = mark_sharding(torch.ones(8, 4).to("xla"), mesh, ("data", "model")).t()  # view of a tiled base
    assert get_sharding_spec(y) == "{devices=[2,4]0,2,4,6,1,3,5,7}"
