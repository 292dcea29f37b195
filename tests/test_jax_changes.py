"""The JAX changes between 0.10 and 0.12 that spmdtorch depends on, one test each.

Each passes on both tested stacks (jax 0.10.x and 0.12.x, see the README's
"Tested versions"): they pin down how spmdtorch copes with the change, so a
later JAX that changes it again fails here by name.

* Mesh context: ``with mesh:`` is deprecated for ``jax.set_mesh``; spmdtorch
  gives ``call_jax`` functions the mesh through ``jax.sharding.use_abstract_mesh``
  (its global mesh) or takes the caller's ``jax.set_mesh``.
* ``PartitionSpec`` is not a tuple (nor equal to one): spmdtorch turns specs
  into tuples itself and accepts either form.
* ``jnp.empty`` is uninitialised in jax 0.12: torch's ``empty`` factories on
  xla lower to ``jnp.zeros``, so their values are defined (zeros) on both.
"""

from __future__ import annotations

import ast
import pathlib

import jax
import numpy as np
import pytest
import torch
from jax.sharding import PartitionSpec as P

import spmdtorch
from spmdtorch.mesh import Mesh, get_global_mesh, set_global_mesh
from spmdtorch.sharding import get_sharding_spec, mark_sharding

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "spmdtorch"


@pytest.fixture
def mesh(devices8):
    before = get_global_mesh()
    m = Mesh(np.arange(8), (2, 4), ("x", "y"))
    yield m
    set_global_mesh(before)


def _constrained_double(seen):
    def f(v):
        mesh = jax.sharding.get_abstract_mesh()
        seen.append((mesh.empty, tuple(mesh.axis_names)))
        return jax.lax.with_sharding_constraint(v * 2, P(("x", "y")))  # a bare spec needs a mesh context

    return f


def test_call_jax_gets_the_mesh_from_spmdtorch_without_with_mesh(mesh):
    set_global_mesh(mesh)
    seen: list = []
    x = torch.arange(16.0).reshape(8, 2)
    out = spmdtorch.call_jax(_constrained_double(seen), (x.to("xla"),))
    spmdtorch.sync()
    torch.testing.assert_close(out.cpu(), x * 2)
    assert seen and seen[0] == (False, ("x", "y"))


def test_call_jax_takes_the_callers_jax_set_mesh(mesh):
    set_global_mesh(None)
    seen: list = []
    x = torch.arange(16.0).reshape(8, 2)
    with jax.set_mesh(mesh.jax_mesh):
        out = spmdtorch.call_jax(_constrained_double(seen), (x.to("xla"),))
    torch.testing.assert_close(out.cpu(), x * 2)
    assert seen and seen[0] == (False, ("x", "y"))


def test_partition_spec_and_tuple_mark_the_same_sharding(mesh):
    assert not isinstance(P("x"), tuple)  # what the code below copes with
    data = torch.arange(64.0).reshape(8, 8)
    for jax_spec, spec in (
        (P("x", "y"), ("x", "y")),
        (P(("x", "y"), None), (("x", "y"), None)),
        (P(None, "y"), (None, "y")),
    ):
        a = mark_sharding(data.to("xla"), mesh, jax_spec)
        b = mark_sharding(data.to("xla"), mesh, spec)
        assert get_sharding_spec(a) == get_sharding_spec(b) != ""
        torch.testing.assert_close((a + 1).cpu(), data + 1)
        torch.testing.assert_close((b + 1).cpu(), data + 1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.empty(5, 3, device="xla"),
        lambda: torch.empty((2, 4), dtype=torch.int32, device="xla"),
        lambda: torch.empty_strided((3, 2), (2, 1), device="xla"),
        lambda: torch.ones(3, 3, device="xla").new_empty((4, 2)),
        lambda: torch.empty_like(torch.ones(2, 6, device="xla")),
    ],
)
def test_empty_on_xla_is_defined_zeros(devices8, make):
    t = make()
    # Used as an accumulator before any write, as code ported from eager zeros often does.
    total = (t + 1).cpu()
    torch.testing.assert_close(total, torch.ones(t.shape, dtype=t.dtype))


def test_no_lowering_calls_jnp_empty():
    calls = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in ("empty", "empty_like"):
                base = node.value
                if isinstance(base, ast.Name) and base.id == "jnp":
                    calls.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} jnp.{node.attr}")
    assert calls == [], f"jnp.empty is uninitialised since jax 0.12; use jnp.zeros: {calls}"
