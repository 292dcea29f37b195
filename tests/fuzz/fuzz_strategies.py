"""Hypothesis strategies for the fuzz tests: meshes, partition specs, tensors, and their validity.

Every generated spec comes with the verdict the library must reach (``SpecCase.valid``),
computed here from the rules in ``spmdtorch.mesh.spec`` written out independently:
a test then checks that a valid spec is applied exactly and an invalid one is refused
with a named error, never the other way round.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st

NUM_DEVICES = 8
#: A few axis names: short ones, one that looks like an index, one with a space.
AXIS_NAMES = ("data", "model", "x", "0", "fsdp", "a b")


class MeshCase(NamedTuple):
    """How to build one valid mesh over the 8 devices."""

    device_ids: tuple[int, ...]
    shape: tuple[int, ...]
    names: tuple[str, ...] | None
    hybrid: bool  # build it as HybridMesh(ici_mesh_shape=shape) (device ids then are range(8))

    def build(self) -> Any:
        from spmdtorch.mesh import HybridMesh, Mesh

        if self.hybrid:
            return HybridMesh(ici_mesh_shape=self.shape, axis_names=self.names)
        return Mesh(np.array(self.device_ids), self.shape, self.names)


@st.composite
def mesh_shapes(draw: st.DrawFn) -> tuple[int, ...]:
    """Shapes whose product is 8, with 1 to 4 axes (1-sized axes included)."""
    n_axes = draw(st.integers(1, 4))
    shape = [1] * n_axes
    for _ in range(3):  # 8 = 2 * 2 * 2: give each factor to some axis
        shape[draw(st.integers(0, n_axes - 1))] *= 2
    return tuple(shape)


@st.composite
def meshes(draw: st.DrawFn) -> MeshCase:
    shape = draw(mesh_shapes())
    named = draw(st.booleans())
    names = tuple(draw(st.permutations(AXIS_NAMES))[: len(shape)]) if named else None
    hybrid = draw(st.integers(0, 4)) == 0
    ids = tuple(range(NUM_DEVICES)) if hybrid else tuple(draw(st.permutations(range(NUM_DEVICES))))
    return MeshCase(ids, shape, names, hybrid)


class SpecCase(NamedTuple):
    """A partition spec for a tensor of rank ``ndim`` on a mesh, and whether it is valid."""

    spec: Any
    valid: bool


@st.composite
def _entry(draw: st.DrawFn, mesh: MeshCase) -> tuple[Any, tuple[int, ...] | None]:
    """One spec entry and the mesh axes it uses (None: the entry itself is invalid)."""
    n = len(mesh.shape)
    names = mesh.names
    kind = draw(
        st.sampled_from(
            ["none", "index", "name", "pair", "empty", "unknown_name", "bad_index", "float", "nested", "none_in_tuple"]
        )
    )
    if kind == "none":
        return None, ()
    if kind == "empty":
        return (), ()
    if kind == "index":
        i = draw(st.integers(0, n - 1))
        return i, (i,)
    if kind == "name":
        i = draw(st.integers(0, n - 1))
        return (names[i], (i,)) if names else (f"axis_{i}", None)  # a name on an unnamed mesh is refused
    if kind == "pair":
        if n < 2:
            return (0, 0), None  # the same axis twice
        i, j = draw(st.permutations(range(n)))[:2]
        ref_i = names[i] if names and draw(st.booleans()) else i
        return (ref_i, j), (i, j)
    if kind == "unknown_name":
        return "zz", None
    if kind == "bad_index":
        return draw(st.sampled_from([n, n + 3, -1])), None
    if kind == "float":
        return 0.5, None
    if kind == "nested":
        return ((0,),), None
    return (0, None), None


@st.composite
def _valid_spec(draw: st.DrawFn, mesh: MeshCase, ndim: int) -> list[Any]:
    """One entry per dim; each mesh axis used at most once; about half the dims sharded."""
    n = len(mesh.shape)
    free = list(draw(st.permutations(range(n))))
    entries: list[Any] = []
    for _ in range(ndim):
        k = draw(st.integers(0, min(2, len(free))))
        axes, free = free[:k], free[k:]
        refs = [mesh.names[a] if mesh.names and draw(st.booleans()) else a for a in axes]
        if not refs:
            entries.append(draw(st.sampled_from([None, ()])))
        elif len(refs) == 1 and draw(st.booleans()):
            entries.append(refs[0])
        else:
            entries.append(tuple(refs))
    return entries


@st.composite
def specs(draw: st.DrawFn, mesh: MeshCase, ndim: int) -> SpecCase:
    """A spec for a rank-``ndim`` tensor: valid about half the time, else malformed somehow."""
    as_list = draw(st.booleans())
    if draw(st.booleans()):
        entries = draw(_valid_spec(mesh, ndim))
        return SpecCase(list(entries) if as_list else tuple(entries), True)
    form = draw(st.sampled_from(["fit"] * 6 + ["short", "long", "bare"]))
    if form == "bare":  # not a sequence of entries at all
        return SpecCase(draw(st.sampled_from(["data", 0, None, 1.5])), False)
    length = max(0, ndim + {"fit": 0, "short": -1, "long": 1}[form])
    entries, used, valid = [], [], length == ndim
    for _ in range(length):
        entry, axes = draw(_entry(mesh))
        entries.append(entry)
        if axes is None:
            valid = False
        else:
            used.extend(axes)
    if len(set(used)) != len(used):  # a mesh axis may shard one dim, once
        valid = False
    return SpecCase(list(entries) if as_list else tuple(entries), valid)


@st.composite
def tensor_shapes(draw: st.DrawFn, max_rank: int = 3, max_size: int = 6) -> tuple[int, ...]:
    """Ranks 0..3 (scalars included), sizes 0..6 (0-size dims and uneven splits included)."""
    rank = draw(st.integers(0, max_rank))
    return tuple(draw(st.integers(0, max_size)) for _ in range(rank))


def small_ints(shape: tuple[int, ...], seed: int, dtype: Any = None) -> Any:
    """Small integer values (float32 unless ``dtype``): the ops' sums and products of them are exact."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, shape, generator=g).to(dtype or torch.float32)


def prod(shape: tuple[int, ...]) -> int:
    return math.prod(shape)
