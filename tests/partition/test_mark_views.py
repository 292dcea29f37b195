"""mark_sharding on any tensor: views and activations, with PyTorch/XLA's semantics.

An annotation on a pending value is a sharding constraint in the graph; on a
view it constrains that view's value (the last step of its view chain) and
leaves the base alone. Numbers and gradients must be those of eager CPU torch,
in lazy mode and under ``spmdtorch.compile``.
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import (
    ShardingError,
    clear_sharding,
    get_sharding_spec,
    hlo_sharding_string,
    mark_sharding,
    sharding_type,
    tensor_sharding,
)
from spmdtorch.sharding import ShardingType as ST
from spmdtorch.tensor.dispatch import read_value


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (4, 2), ("data", "model"))


def constraints(tensors) -> list[tuple[str, str]]:
    """(shape, sdy spec) of every sharding constraint in the program computing ``tensors``."""
    hlo = spmdtorch.debug.get_hlo_text(tensors)
    out = []
    for line in hlo.splitlines():
        if 'custom_call_target="Sharding"' in line:
            shape = re.search(r"= \w+\[([\d,]*)\]", line).group(1)
            spec = re.search(r"sdy.sharding_per_value<\[<@mesh, (\[.*?\])>", line).group(1).replace("\\", "")
            out.append((shape, spec))
    return out


# (name, make the view from a (8, 6, 4) tensor, its partition spec, the sdy spec it shows in the program)
VIEWS = [
    ("view", lambda y: y.view(48, 4), ("data", "model"), '[{"data"}, {"model"}]'),
    ("reshape", lambda y: y.reshape(8, 24), (None, "data"), '[{}, {"data"}]'),
    ("transpose", lambda y: y.transpose(0, 2), ("model", None, "data"), '[{"model"}, {}, {"data"}]'),
    ("permute", lambda y: y.permute(2, 0, 1), (None, "data", None), '[{}, {"data"}, {}]'),
    ("slice", lambda y: y[:, 2:, :], ("data", None, "model"), '[{"data"}, {}, {"model"}]'),
    ("select", lambda y: y[3], (None, "model"), '[{}, {"model"}]'),
    ("uneven", lambda y: y[1:], ("data", None, "model"), '[{"data"}, {}, {"model"}]'),  # 4 does not divide 7
    ("unsqueeze", lambda y: y.unsqueeze(0), (None, ("data", "model"), None, None), '[{}, {"data", "model"}, {}, {}]'),
]


@pytest.mark.parametrize("name,make,spec,sdy", VIEWS, ids=[v[0] for v in VIEWS])
def test_every_kind_of_view_can_be_annotated(mesh, name, make, spec, sdy):
    src = torch.randn(8, 6, 4)
    y = torch.sin(src.to("xla"))  # a pending activation
    v = make(y)
    assert v._chain, "the case must be a view"
    assert mark_sharding(v, mesh, spec) is v  # in place, as PyTorch/XLA
    want = mesh.named_sharding(spec)
    assert get_sharding_spec(v) == hlo_sharding_string(want, v.dim())
    assert tensor_sharding(v) == want
    assert get_sharding_spec(y) == ""  # the base is not annotated
    out = v * 2
    assert (",".join(map(str, v.shape)), sdy) in constraints([out])
    torch.testing.assert_close(out.cpu(), make(torch.sin(src)) * 2)
    torch.testing.assert_close(v.cpu(), make(torch.sin(src)))


@pytest.mark.parametrize("form", ["view of a 2-d product", "F.linear"])
def test_output_of_a_3d_linear_is_annotated(mesh, form):
    # torch's linear of a 3-d input returns a view of a 2-d matmul (annotating it raised
    # before); spmdtorch's F.linear is one op, not a view: both annotate alike.
    lin = torch.nn.Linear(4, 6).to("xla")
    x = torch.randn(8, 5, 4).to("xla")
    if form == "F.linear":
        y = lin(x)
        assert not y._chain
    else:
        y = (x.flatten(0, 1) @ lin.weight.t() + lin.bias).view(8, 5, 6)
        assert y._chain
    mark_sharding(y, mesh, ("data", None, "model"))
    assert get_sharding_spec(y) == "{devices=[4,1,2]0,1,2,3,4,5,6,7}"
    assert ("8,5,6", '[{"data"}, {}, {"model"}]') in constraints([y.sum()])


def test_a_view_of_concrete_data_leaves_its_base_alone(mesh):
    w = mark_sharding(torch.arange(32.0).reshape(8, 4).to("xla"), mesh, ("data", "model"))
    before = read_value(w)
    wt = mark_sharding(w.t(), mesh, (None, "data"))
    assert get_sharding_spec(wt) == hlo_sharding_string(mesh.named_sharding((None, "data")), 2)
    assert read_value(w) is before  # no reshard of the base's data
    assert get_sharding_spec(w) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close((wt + 1).cpu(), torch.arange(32.0).reshape(8, 4).t() + 1)
    # The annotation is replayed on every read, also after the base changed.
    w.mul_(2)
    assert ("4,8", '[{}, {"data"}]') in constraints([wt + 0])
    torch.testing.assert_close(wt.cpu(), 2 * torch.arange(32.0).reshape(8, 4).t())


def test_views_of_an_annotated_view_read_through_its_constraint(mesh):
    y = torch.cos(torch.randn(8, 6).to("xla"))
    v = mark_sharding(y.view(4, 2, 6), mesh, ("data", None, None))
    w = v.flatten(1)  # a view of the annotated view: its chain starts with the constraint
    assert w._chain[: len(v._chain)] == v._chain
    assert ("4,2,6", '[{"data"}, {}, {}]') in constraints([w * 1])


def test_writes_through_an_annotated_view_reach_the_base(mesh):
    base_cpu = torch.zeros(8, 6)
    base = base_cpu.to("xla")
    v = mark_sharding(base[:, 2:], mesh, ("data", None))
    v.add_(torch.arange(4.0).to("xla"))
    base_cpu[:, 2:].add_(torch.arange(4.0))
    torch.testing.assert_close(base.cpu(), base_cpu)
    torch.testing.assert_close(v.cpu(), base_cpu[:, 2:])
    assert get_sharding_spec(v) == hlo_sharding_string(mesh.named_sharding(("data", None)), 2)


def test_re_marking_a_view(mesh):
    v = torch.ones(8, 4).to("xla").t()
    mark_sharding(v, mesh, (None, "data"))
    assert mark_sharding(v, mesh, (None, "data")) is v  # the same spec again: nothing to do
    assert len(v._chain) == 2
    with pytest.raises(ShardingError, match=r"view of shape \(4, 8\) is already annotated.*clear_sharding"):
        mark_sharding(v, mesh, ("model", "data"))
    clear_sharding(v)
    assert get_sharding_spec(v) == ""
    assert sharding_type(v) is ST.REPLICATED
    mark_sharding(v, mesh, ("model", "data"))  # what clear_sharding left is replaced
    assert len(v._chain) == 2
    assert get_sharding_spec(v) == hlo_sharding_string(mesh.named_sharding(("model", "data")), 2)
    torch.testing.assert_close(v.cpu(), torch.ones(4, 8))


def test_errors_name_the_spec_and_the_tensor(mesh):
    v = torch.ones(8, 4).to("xla").t()
    with pytest.raises(ShardingError, match=r"partition_spec \('data',\) has 1 entries but the tensor has 2 dims"):
        mark_sharding(v, mesh, ("data",))
    with pytest.raises(ShardingError, match="expects a tensor on the xla device"):
        mark_sharding(torch.ones(4, 8).t(), mesh, (None, "data"))


class Block(torch.nn.Module):
    """A tiny 3-d MLP whose activations (views among them) a user annotates."""

    def __init__(self, mesh=None):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
        self.mesh = mesh

    def mark(self, t, spec):
        if self.mesh is not None:
            mark_sharding(t, self.mesh, spec)
        return t

    def forward(self, x):  # x: (batch, seq, 8)
        h = self.mark(self.up(x), ("data", None, "model"))  # a view (3-d linear)
        h = torch.nn.functional.gelu(h)
        heads = self.mark(h.view(h.shape[0], h.shape[1], 4, 4), ("data", None, "model", None))
        heads = self.mark(heads.transpose(1, 2), ("data", "model", None, None))
        h = heads.transpose(1, 2).reshape(h.shape)
        out = self.mark(self.down(h), ("data", None, None))
        return self.mark(out[:, 1:, :], ("data", None, None))  # a slice


def _train(model, batches, steps_fn=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    step = steps_fn(step) if steps_fn is not None else step
    return [step(x).detach().item() for x in batches]


@pytest.mark.parametrize("mode", ["lazy", "compiled"])
def test_training_with_annotated_views_matches_eager_cpu(mesh, mode):
    torch.manual_seed(0)
    ref = Block()
    model = Block(mesh)
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    mark_sharding(model, mesh, {"up.weight": ("model", None), "down.weight": (None, "model")})
    batches = [torch.randn(8, 5, 8) for _ in range(4)]
    ref_losses = _train(ref, batches)
    traces = []

    def compiled(step):
        def traced(x):
            traces.append(1)
            return step(x)

        return spmdtorch.compile(traced)

    # The batch is split over "data", as a data-parallel input is
    # (test_compile_placement.py covers unannotated inputs).
    xla_batches = [mark_sharding(b.to("xla"), mesh, ("data", None, None)) for b in batches]
    losses = _train(model, xla_batches, compiled if mode == "compiled" else None)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
    if mode == "compiled":
        assert len(traces) <= 3  # replayed, not traced every step


def test_gradients_through_annotated_views_match_eager_cpu(mesh):
    torch.manual_seed(1)
    ref = Block()
    model = Block(mesh)
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    x_cpu = torch.randn(8, 5, 8, requires_grad=True)
    x = x_cpu.detach().to("xla").requires_grad_(True)
    out = model(x)
    # The constraints are in the program that computes the loss.
    specs = {s for _, s in constraints([out.sum()])}
    assert {'[{"data"}, {}, {"model"}]', '[{"data"}, {"model"}, {}, {}]'} <= specs
    (out * torch.linspace(-1, 1, 8).to("xla")).sum().backward()
    (ref(x_cpu) * torch.linspace(-1, 1, 8)).sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")


def test_annotating_inside_compile_constrains_the_program(mesh):
    @spmdtorch.compile
    def f(x):
        y = (x * 2).t()
        mark_sharding(y, mesh, ("data", None))
        return y.sum(dim=1)

    for i in range(4):
        x_cpu = torch.randn(6, 8) + i
        torch.testing.assert_close(f(x_cpu.to("xla")).cpu(), (x_cpu * 2).t().sum(dim=1))


def test_activation_annotation_is_a_constraint_not_a_reshard(mesh):
    x = torch.randn(8, 4).to("xla")
    y = x.exp()
    mark_sharding(y, mesh, ("data", None))
    assert get_sharding_spec(y) == "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"
    assert ("8,4", '[{"data"}, {}]') in constraints([y])
    spmdtorch.sync()
    assert read_value(y).sharding.spec == jax.sharding.PartitionSpec("data", None)
    torch.testing.assert_close(y.cpu(), x.cpu().exp())


def test_local_shards_of_a_view_are_those_of_its_value(mesh):
    from spmdtorch.sharding import load_local_shards_, local_shards

    src = torch.arange(32.0).reshape(4, 8)
    base = src.to("xla")
    v = mark_sharding(base.t(), mesh, ("data", "model"))  # (8, 4) tiled 4 x 2
    shards = local_shards(v)
    assert [tuple(s.data.shape) for s in shards] == [(2, 2)] * 8
    for s in shards:
        torch.testing.assert_close(s.data, src.t()[s.indices])
    with pytest.raises(ShardingError, match=r"load_local_shards_ .* is a view.*t.clone\(\)"):
        load_local_shards_(v, shards)


def test_re_annotating_every_step_reuses_the_compiled_program(mesh):
    from spmdtorch.debug import counter_value

    model = Block(mesh).to("xla")  # annotates its views anew in every forward
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiles = []
    for _ in range(4):
        model(torch.randn(8, 5, 8).to("xla")).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        spmdtorch.sync()
        compiles.append(counter_value("UncachedCompile") or 0)
    assert compiles[1:] == [compiles[1]] * 3, compiles  # the same graph key every step
