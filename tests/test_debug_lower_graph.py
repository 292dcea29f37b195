"""spmdtorch.debug.lower_graph: the program computing some tensors, lowered without running it."""

from __future__ import annotations

import doctest

import jax
import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch._checks import ArgumentTypeError
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import mark_sharding


def test_docstring_example():
    finder = doctest.DocTestFinder()
    (case,) = finder.find(debug.lower_graph, "lower_graph", globs={"lower_graph": debug.lower_graph})
    outcome = doctest.DocTestRunner().run(case)
    assert outcome.attempted >= 3 and outcome.failed == 0


def test_parameters_are_the_computed_inputs_and_the_program_computes_the_graph():
    a_cpu, b_cpu = torch.randn(4, 3), torch.randn(4, 3)
    a, b = a_cpu.to("xla"), b_cpu.to("xla")
    spmdtorch.sync()
    out = a * b + 2.5
    g = debug.lower_graph([out], name="muladd")
    assert [p.role for p in g.parameters] == ["data", "data"]
    assert [p.number for p in g.parameters] == [0, 1]
    assert {g.parameter_of(a), g.parameter_of(b)} == {0, 1}
    assert g.parameter_of(out) == -1  # pending: an output, not a parameter
    assert "jit_muladd" in g.lowered.as_text(dialect="hlo")
    # The lowered program, compiled and run on the parameters' values, computes what eager torch does.
    (result,) = g.lowered.compile()(*[p.value for p in g.parameters])
    np.testing.assert_allclose(np.asarray(result), (a_cpu * b_cpu + 2.5).numpy(), rtol=1e-6)
    # Nothing ran: the output is still pending and gives the same values when synced.
    assert isinstance(debug.read_value(out), debug.LazyRef)
    np.testing.assert_allclose(out.cpu().numpy(), np.asarray(result), rtol=1e-6)


def test_computed_tensor_is_returned_as_its_own_parameter():
    x_cpu = torch.arange(6.0).reshape(2, 3)
    x = x_cpu.to("xla")
    spmdtorch.sync()
    y = x + 1
    g = debug.lower_graph([y, x])
    assert len(g.parameters) == 1  # x is read by y's graph and returned: one parameter, not two
    assert g.parameter_of(x) == 0
    y_out, x_out = g.lowered.compile()(*[p.value for p in g.parameters])
    np.testing.assert_array_equal(np.asarray(x_out), x_cpu.numpy())
    np.testing.assert_array_equal(np.asarray(y_out), (x_cpu + 1).numpy())


def test_random_graph_takes_the_next_key_and_leaves_the_generator_alone():
    def draw(inspect: bool):
        torch.manual_seed(7)
        r = torch.rand(5, device="xla") * 3
        if inspect:
            g = debug.lower_graph(r)
            assert [p.role for p in g.parameters][-1] == "rng_key"
            key = g.parameters[-1].value
            assert np.asarray(key).dtype == np.uint32 and np.asarray(key).shape == (3,)
        return r.cpu()

    # Lowering the graph first does not change the numbers its run draws.
    torch.testing.assert_close(draw(True), draw(False))


def test_sharded_inputs_keep_their_sharding_in_the_program():
    mesh = Mesh(np.arange(8), (8,), ("x",))
    a = torch.randn(16, 4).to("xla")
    mark_sharding(a, mesh, ("x", None))
    spmdtorch.sync()
    g = debug.lower_graph([a * 2])
    (p,) = g.parameters
    assert isinstance(p.value, jax.Array) and len(p.value.sharding.device_set) == 8
    assert "sharding={devices=[8,1]" in g.lowered.as_text(dialect="hlo")


@pytest.mark.parametrize(
    ("tensors", "name", "match"),
    [
        ("not a list", "p", "tensors must be a list of xla tensors, got str"),
        ([torch.ones(2)], "p", r"tensors\[0\] must be an xla tensor, got a tensor on cpu; move it"),
        ([], 3, "name"),
    ],
)
def test_bad_arguments_are_named(tensors, name, match):
    with pytest.raises(ArgumentTypeError, match=match):
        debug.lower_graph(tensors, name=name)
