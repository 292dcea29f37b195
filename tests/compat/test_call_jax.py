"""``torch_xla.core.xla_builder.call_jax`` (``spmdtorch.call_jax``) against the eager JAX function and eager CPU torch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P

import spmdtorch
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor.dispatch import read_value

TOL = {"rtol": 1e-5, "atol": 1e-5}


def mlp(x, w, *, scale, act="tanh"):
    h = x @ w
    h = jnp.tanh(h) if act == "tanh" else jax.nn.relu(h)
    return {"y": h * scale, "idx": jnp.argmax(h, axis=-1), "parts": (h.sum(), h.max())}


def test_values_match_eager_jax_and_pytrees_round_trip(devices8):
    import torch_xla.core.xla_builder as xb

    assert xb.call_jax is spmdtorch.call_jax
    torch.manual_seed(0)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    ref = mlp(jnp.asarray(x.numpy()), jnp.asarray(w.numpy()), scale=0.5, act="relu")
    out = xb.call_jax(mlp, (x.to("xla"), w.to("xla")), {"scale": 0.5, "act": "relu"}, name="mlp")
    assert set(out) == {"y", "idx", "parts"} and isinstance(out["parts"], tuple)
    np.testing.assert_allclose(out["y"].cpu().numpy(), np.asarray(ref["y"]), **TOL)
    np.testing.assert_array_equal(out["idx"].cpu().numpy(), np.asarray(ref["idx"]))
    assert out["idx"].dtype == torch.int32  # JAX's default integer type, as under PyTorch/XLA
    for a, b in zip(out["parts"], ref["parts"]):
        np.testing.assert_allclose(a.cpu().numpy(), np.asarray(b), **TOL)


def test_is_recorded_lazily_with_the_surrounding_ops(devices8):
    calls = []

    def f(v):
        calls.append(type(v))
        return v * 3

    a = torch.arange(6.0, device="xla").reshape(2, 3) + 1  # pending
    out = spmdtorch.call_jax(f, (a,)) - 1
    assert type(read_value(out)) is LazyRef  # nothing ran: a node of the pending graph
    assert all(issubclass(c, jax.core.Tracer) for c in calls)  # f only ever traced
    torch.testing.assert_close(out.cpu(), (torch.arange(6.0).reshape(2, 3) + 1) * 3 - 1)


def test_gradients_match_eager_cpu_torch(devices8):
    torch.manual_seed(1)
    x, w = torch.randn(4, 3), torch.randn(3, 5)
    xc, wc = x.clone().requires_grad_(), w.clone().requires_grad_()
    yc = torch.tanh(xc @ wc) * 0.5
    (yc.pow(2).sum() + (torch.tanh(xc @ wc)).amax()).backward()

    xa, wa = x.to("xla").requires_grad_(), w.to("xla").requires_grad_()
    out = spmdtorch.call_jax(mlp, (xa, wa), {"scale": 0.5})
    # Only some outputs get a cotangent; the integer output none.
    (out["y"].pow(2).sum() + out["parts"][1]).backward()
    torch.testing.assert_close(xa.grad.cpu(), xc.grad, **TOL)
    torch.testing.assert_close(wa.grad.cpu(), wc.grad, **TOL)


def test_under_compile_same_program_new_values(devices8):
    def body(h, w):
        return jnp.tanh(h @ w) + 1.0

    @spmdtorch.compile
    def step(x, w):
        return spmdtorch.call_jax(body, (x * 2, w)).sum(-1)

    for seed in range(3):
        torch.manual_seed(seed)
        x, w = torch.randn(4, 3), torch.randn(3, 2)
        got = step(x.to("xla"), w.to("xla"))
        torch.testing.assert_close(got.cpu(), (torch.tanh((x * 2) @ w) + 1.0).sum(-1), **TOL)


def test_sees_the_global_mesh(devices8):
    """A bare PartitionSpec inside jax_func refers to the mesh xs.set_global_mesh set (pytorch/xla#8972)."""
    import torch_xla.distributed.spmd as xs

    def constrained(v):
        assert tuple(jax.sharding.get_abstract_mesh().axis_names) == ("data", "model")
        return jax.lax.with_sharding_constraint(v * 2, P("data", None))

    x = torch.randn(16, 4)
    xs.set_global_mesh(xs.Mesh(np.arange(8), (4, 2), ("data", "model")))
    try:
        out = spmdtorch.call_jax(constrained, (x.to("xla"),))
        torch.testing.assert_close(out.cpu(), x * 2)
    finally:
        xs.set_global_mesh(None)
    # Without a mesh the same function cannot name an axis: a named error at the call.
    with pytest.raises(spmdtorch.CallJaxError, match="constrained"):
        spmdtorch.call_jax(constrained, (x.to("xla"),))


def test_a_mesh_the_caller_set_in_jax_wins(devices8):
    mesh = jax.make_mesh((8,), ("rows",), axis_types=(jax.sharding.AxisType.Auto,))

    def f(v):
        return jax.lax.with_sharding_constraint(v + 1, P("rows"))

    with jax.set_mesh(mesh):
        out = spmdtorch.call_jax(f, (torch.zeros(8, 2, device="xla"),))
    torch.testing.assert_close(out.cpu(), torch.ones(8, 2))


def test_arrays_are_inputs_not_cached_constants(devices8):
    def add(v, c):
        return v + c

    x = torch.zeros(3, device="xla")
    first = spmdtorch.call_jax(add, (x, np.array([1.0, 2.0, 3.0], np.float32)))
    second = spmdtorch.call_jax(add, (x, jnp.array([5.0, 5.0, 5.0])))
    torch.testing.assert_close(first.cpu(), torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(second.cpu(), torch.full((3,), 5.0))


def test_bad_arguments_raise_named_errors(devices8):
    x = torch.ones(2, device="xla")
    with pytest.raises(spmdtorch.CallJaxError, match="jax_func"):
        spmdtorch.call_jax("not a function", (x,))
    with pytest.raises(TypeError, match="args"):
        spmdtorch.call_jax(jnp.sin, x)
    with pytest.raises(spmdtorch.CallJaxError, match=r"leaf 0 is a torch tensor on cpu.*\.to\('xla'\)"):
        spmdtorch.call_jax(jnp.sin, (torch.ones(2),))
    with pytest.raises(spmdtorch.CallJaxError, match="neither a tensor/array nor hashable"):
        spmdtorch.call_jax(lambda v, s: v, (x, {1, 2}))
    with pytest.raises(spmdtorch.CallJaxError, match="failed to trace.*not a valid JAX type"):
        spmdtorch.call_jax(lambda v: (v, "text"), (x,))
