"""Fuzzed annotations: random meshes x random partition specs x random tensors x ops.

Each example builds a mesh over the 8 simulated devices (any shape with
1-sized axes, any device order, named or not, ``Mesh`` or ``HybridMesh``),
annotates a random tensor (float32, int32 or bfloat16; scalars, 0-size dims, uneven dims; concrete data,
resharded at once, or a pending value, which gets a sharding constraint in the
lazy graph) with a random spec (valid or not), runs one op, and checks:

* a valid spec: the sharded result equals the unsharded eager CPU result
  exactly (the values are small integers, so sums and products are exact);
* an invalid spec: a named spmdtorch error (``_named_error``), raised by the
  annotation itself;
* never a crash from internals (IndexError, KeyError, AttributeError, a raw
  jax error), a silently accepted bad spec, or a wrong value.

The default examples are few and deterministic (``derandomize``) so the suite
stays fast and stable; ``-m slow`` runs the same properties on more, random
examples.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from fuzz_strategies import MeshCase, SpecCase, meshes, small_ints, specs, tensor_shapes
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spmdtorch.sharding import ShardingError, ShardingSpec, get_sharding_spec, mark_sharding

FAST = settings(
    max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _named_error(e: BaseException) -> bool:
    """The class (or a base) is defined by spmdtorch, e.g. PartitionSpecError, ShardingError."""
    return any(c.__module__.split(".")[0] == "spmdtorch" for c in type(e).__mro__)


def _matmul(t: torch.Tensor) -> torch.Tensor:
    if t.dim() == 0:
        return t * t
    if t.dim() == 1:
        return t @ t
    return t @ t.transpose(-1, -2)


#: name -> op over any rank (0-size dims and scalars included).
OPS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "elementwise": lambda t: (t * 2 + 1).abs() - t,
    "matmul": _matmul,
    "sum": lambda t: t.sum(),
    "sum_dim0": lambda t: t.sum(dim=0) if t.dim() else t.sum(),
    "cumsum_last": lambda t: t.cumsum(dim=-1) if t.dim() else t,
    "reshape": lambda t: t.reshape(-1) * 3,
    "view_flat": lambda t: t.contiguous().view(-1) + 1,
    "transpose": lambda t: t.transpose(0, -1).contiguous() * 2 if t.dim() else t,
    "permute": lambda t: t.permute(tuple(reversed(range(t.dim())))) + 1,
    "slice": lambda t: t[1:] * 2 if t.dim() else t,
    "slice_step": lambda t: t[..., ::2] - 1 if t.dim() else t,
    "unsqueeze": lambda t: t.unsqueeze(0) * t.unsqueeze(0),
}


def _expect_named_error(case: SpecCase, run: Callable[[], object]) -> None:
    try:
        run()
    except Exception as e:  # noqa: BLE001 (the point: inspect whatever was raised)
        assert _named_error(e), f"spec {case.spec!r} raised {type(e).__module__}.{type(e).__name__}: {e}"
    else:
        pytest.fail(f"invalid spec {case.spec!r} was accepted")


def _check_annotation(mesh_case: MeshCase, shape: tuple[int, ...], data: st.DataObject, op_name: str) -> None:
    mesh = mesh_case.build()
    case = data.draw(specs(mesh_case, len(shape)), label="spec")
    dtype = data.draw(st.sampled_from([torch.float32, torch.float32, torch.int32, torch.bfloat16]), label="dtype")
    cpu = small_ints(shape, seed=data.draw(st.integers(0, 2**16), label="seed"), dtype=dtype)
    # Concrete data is resharded on the spot; a pending value gets a sharding constraint in its graph.
    pending = data.draw(st.booleans(), label="pending")
    x = cpu.to("xla") * 1 if pending else cpu.to("xla")
    event(
        f"valid spec: {case.valid}; sharded dims: {sum(e is not None and e != () for e in case.spec) if case.valid else '-'}"
    )
    if not case.valid:
        _expect_named_error(case, lambda: mark_sharding(x, mesh, case.spec))
        return
    mark_sharding(x, mesh, case.spec)
    assert torch.equal(x.cpu(), cpu), "annotating changed the tensor's values"
    out = OPS[op_name](x)
    expected = OPS[op_name](cpu)
    got = out.cpu()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert torch.equal(got, expected), f"{op_name} on {shape} sharded {case.spec!r} over {mesh}: {got} != {expected}"
    # The annotation reads back as a string for any spec that was accepted.
    assert isinstance(get_sharding_spec(x), str)


@FAST
@given(mesh_case=meshes(), shape=tensor_shapes(), op_name=st.sampled_from(sorted(OPS)), data=st.data())
def test_annotation_equals_eager_or_raises_named_error(devices8, mesh_case, shape, op_name, data):
    _check_annotation(mesh_case, shape, data, op_name)


@pytest.mark.slow
@SLOW
@given(mesh_case=meshes(), shape=tensor_shapes(max_size=9), op_name=st.sampled_from(sorted(OPS)), data=st.data())
def test_annotation_equals_eager_or_raises_named_error_slow(devices8, mesh_case, shape, op_name, data):
    _check_annotation(mesh_case, shape, data, op_name)


def _check_view_annotation(mesh_case: MeshCase, shape: tuple[int, ...], data: st.DataObject, op_name: str) -> None:
    """Annotating a view: an accepted annotation must give exact values, a refused one a named error.

    Both outcomes are accepted for a valid spec because annotating views is
    being added (until then ``mark_sharding`` refuses a view with a
    ``ShardingError`` that says to annotate the base or clone the view); what
    may never happen is a crash, a silently accepted invalid spec, or a wrong
    value in the view or its base.
    """
    mesh = mesh_case.build()
    cpu = small_ints(shape, seed=data.draw(st.integers(0, 2**16), label="seed"))
    make_view = data.draw(
        st.sampled_from(
            [
                ("slice", lambda t: t[1:]),
                ("transpose", lambda t: t.transpose(0, -1)),
                ("select", lambda t: t[0]),
                ("view", lambda t: t.view(t.shape)),
            ]
        ),
        label="view",
    )[1]
    base = cpu.to("xla")
    try:
        view, expected_view = make_view(base), make_view(cpu)
    except (IndexError, RuntimeError):  # torch refuses the view itself (e.g. t[0] of a 0-size dim)
        return
    case = data.draw(specs(mesh_case, view.dim()), label="spec")
    try:
        mark_sharding(view, mesh, case.spec)
    except Exception as e:  # noqa: BLE001 (the point: inspect whatever was raised)
        assert _named_error(e), f"spec {case.spec!r} on a view raised {type(e).__module__}.{type(e).__name__}: {e}"
        # A valid spec may only be refused as "a view" (a ShardingError), never as a bad spec.
        assert not case.valid or isinstance(e, ShardingError), f"valid spec {case.spec!r} refused on a view: {e}"
        return
    assert case.valid, f"invalid spec {case.spec!r} was accepted on a view"
    assert torch.equal(view.cpu(), expected_view), "annotating a view changed its values"
    assert torch.equal(OPS[op_name](view).cpu(), OPS[op_name](expected_view))
    assert torch.equal(base.cpu(), cpu), "annotating a view changed its base"


@FAST
@given(mesh_case=meshes(), shape=tensor_shapes(), op_name=st.sampled_from(sorted(OPS)), data=st.data())
def test_view_annotation_equals_eager_or_raises_named_error(devices8, mesh_case, shape, op_name, data):
    _check_view_annotation(mesh_case, shape or (3,), data, op_name)


@pytest.mark.slow
@SLOW
@given(mesh_case=meshes(), shape=tensor_shapes(max_size=9), op_name=st.sampled_from(sorted(OPS)), data=st.data())
def test_view_annotation_equals_eager_or_raises_named_error_slow(devices8, mesh_case, shape, op_name, data):
    _check_view_annotation(mesh_case, shape or (3,), data, op_name)


@FAST
@given(mesh_case=meshes(), data=st.data())
def test_sharding_spec_constructor(devices8, mesh_case, data):
    """``ShardingSpec`` checks its spec against the mesh when built (its rank when applied)."""
    mesh = mesh_case.build()
    ndim = data.draw(st.integers(0, 3), label="ndim")
    case = data.draw(specs(mesh_case, ndim), label="spec")
    minibatch = data.draw(st.sampled_from([False, True, "yes", 1, None]), label="minibatch")
    # Whether the entries alone are valid (the length is checked only when applied).
    try:
        spec = ShardingSpec(mesh, case.spec, minibatch=minibatch)
    except Exception as e:  # noqa: BLE001
        assert _named_error(e), f"ShardingSpec({case.spec!r}) raised {type(e).__module__}.{type(e).__name__}: {e}"
        assert not (case.valid and isinstance(minibatch, bool)), f"valid ShardingSpec refused: {e}"
        return
    assert isinstance(minibatch, bool), f"minibatch={minibatch!r} was accepted"
    x = torch.zeros((2,) * ndim).to("xla")
    if case.valid:
        spec.apply(x)
        assert torch.equal(x.cpu(), torch.zeros((2,) * ndim))
    else:  # entries fine, length wrong: refused when applied
        _expect_named_error(case, lambda: spec.apply(x))
