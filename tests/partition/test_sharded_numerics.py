"""Sharded tensors through spmdtorch: sharding strings, local shards, and numerics.

For 1-D, 2-D and 3-D meshes — in natural, reversed and transposed device
orders — tensors are annotated with ``mark_sharding`` (specs by axis index,
by name, with a dim split over several axes, and partially replicated), then

(a) ``get_sharding_spec`` must print PyTorch/XLA's explicit HLO sharding
    string. Every expected string is written out by hand from the mesh
    layout, never computed with the code under test. The rule (XLA's
    ``HloSharding`` tile assignment, as PyTorch/XLA builds it): transpose the
    mesh so that the axes sharding dim 0 come first (a tuple entry: in its
    order, first = major), then those of dim 1, ..., and the axes the spec
    leaves out last (in mesh order); the flattened result is the device list.
    ``tile dims`` = shards per tensor dim, plus the product of the left-out
    axes when it is > 1 (``last_tile_dim_replicate``).
(b) ``local_shards`` must give each device the block its mesh position says
    (the expected blocks come from a small numpy model of the same rule).
(c) computations on the sharded tensors (matmul chains, reductions over
    sharded and unsharded dims, softmax, a Llama decoder layer forward and
    backward) must equal eager CPU torch.

Most cases are even (every sharded dim divisible by its shard count). The
uneven section at the end checks padded (uneven) shardings, XLA's layout of
ceil(n / k) per shard: same strings, trimmed local shards, exact values.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch.mesh import Mesh
from spmdtorch.models.llama import DecoderLayer, LlamaConfig, rope_tables
from spmdtorch.partition import (
    get_sharding_spec,
    load_local_shards_,
    local_shards,
    mark_sharding,
)

RTOL = ATOL = 1e-5

# --------------------------------------------------------------------------
# Meshes. ``ids`` is reshaped row-major to ``shape``; the comment shows the
# resulting device grid that the expected strings below are read from.
# --------------------------------------------------------------------------

REV = list(range(8))[::-1]
MESHES = {
    # [0 1 2 3 4 5 6 7]
    "1d": (np.arange(8), (8,), ("x",)),
    # [7 6 5 4 3 2 1 0]
    "1d_rev": (np.arange(8)[::-1], (8,), ("x",)),
    # [[0 1] [2 3] [4 5] [6 7]]
    "4x2": (np.arange(8), (4, 2), ("data", "model")),
    # [[7 6] [5 4] [3 2] [1 0]]
    "4x2_rev": (np.arange(8)[::-1], (4, 2), ("data", "model")),
    # [[0 1 2 3] [4 5 6 7]]
    "2x4": (np.arange(8), (2, 4), ("data", "model")),
    # the transpose of the 4x2 grid: [[0 2 4 6] [1 3 5 7]]
    "2x4_T": (np.arange(8).reshape(4, 2).T.ravel(), (2, 4), ("data", "model")),
    # unnamed: specs must use axis indices. [[0 1 2 3] [4 5 6 7]]
    "2x4_unnamed": (np.arange(8), (2, 4), None),
    # device at (a, b, c) is 4a + 2b + c
    "2x2x2": (np.arange(8), (2, 2, 2), ("a", "b", "c")),
    # device at (a, b, c) is 7 - (4a + 2b + c)
    "2x2x2_rev": (np.arange(8)[::-1], (2, 2, 2), ("a", "b", "c")),
}


def make_mesh(name):
    ids, shape, names = MESHES[name]
    return Mesh(ids, shape, names)


# (mesh, tensor shape, partition spec, expected PyTorch/XLA string)
STRING_CASES = [
    # ---- 1-D mesh
    ("1d", (16, 4), ("x", None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ("1d", (4, 16), (None, 0), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    ("1d", (16,), (0,), "{devices=[8]0,1,2,3,4,5,6,7}"),
    ("1d", (2, 8, 4), (None, "x", None), "{devices=[1,8,1]0,1,2,3,4,5,6,7}"),
    ("1d", (16, 4), (None, None), "{replicated}"),
    # ---- 1-D mesh, devices reversed: tile i lives on device 7 - i
    ("1d_rev", (16, 4), ("x", None), "{devices=[8,1]7,6,5,4,3,2,1,0}"),
    ("1d_rev", (4, 16), (None, 0), "{devices=[1,8]7,6,5,4,3,2,1,0}"),
    # ---- (4, 2) mesh
    ("4x2", (8, 4), ("data", "model"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    ("4x2", (8, 4), (0, 1), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    # transposed axes: tile (i, j) on mesh[j, i] = 2j + i
    ("4x2", (4, 8), ("model", "data"), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    # partial replication: rows over data, the 2 model devices replicate
    ("4x2", (8, 4), (0, None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ("4x2", (8, 4), (None, 1), "{devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ("4x2", (4, 6, 2), ("model", None, None), "{devices=[2,1,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    # one dim over both axes
    ("4x2", (16,), (("data", "model"),), "{devices=[8]0,1,2,3,4,5,6,7}"),
    ("4x2", (16,), (("model", "data"),), "{devices=[8]0,2,4,6,1,3,5,7}"),
    ("4x2", (4, 16), (None, ("data", "model")), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    ("4x2", (8, 4), (None, None), "{replicated}"),
    # ---- (4, 2) mesh, devices reversed: [[7 6] [5 4] [3 2] [1 0]]
    ("4x2_rev", (8, 4), ("data", "model"), "{devices=[4,2]7,6,5,4,3,2,1,0}"),
    ("4x2_rev", (8, 4), ("data", None), "{devices=[4,1,2]7,6,5,4,3,2,1,0 last_tile_dim_replicate}"),
    ("4x2_rev", (8, 4), (None, "model"), "{devices=[1,2,4]7,5,3,1,6,4,2,0 last_tile_dim_replicate}"),
    ("4x2_rev", (16,), (("model", "data"),), "{devices=[8]7,5,3,1,6,4,2,0}"),
    ("4x2_rev", (4, 8), ("model", "data"), "{devices=[2,4]7,5,3,1,6,4,2,0}"),
    # ---- (2, 4) mesh: [[0 1 2 3] [4 5 6 7]]
    ("2x4", (4, 8), ("data", "model"), "{devices=[2,4]0,1,2,3,4,5,6,7}"),
    ("2x4", (8, 2), ("model", "data"), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ("2x4", (8, 4), ("model", None), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    ("2x4", (4, 4), (None, "data"), "{devices=[1,2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ("2x4", (8, 4), (("model", "data"), None), "{devices=[8,1]0,4,1,5,2,6,3,7}"),
    # ---- (2, 4) mesh holding the transposed grid [[0 2 4 6] [1 3 5 7]]
    ("2x4_T", (4, 8), ("data", "model"), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    ("2x4_T", (8, 4), ("model", None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ("2x4_T", (8, 2), ("model", "data"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    ("2x4_T", (4, 4), ("data", None), "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    # ---- unnamed (2, 4) mesh: axis indices only
    ("2x4_unnamed", (4, 8), (1, 0), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ("2x4_unnamed", (4, 8), (None, (0, 1)), "{devices=[1,8]0,1,2,3,4,5,6,7}"),
    # ---- (2, 2, 2) mesh: device at (a, b, c) is 4a + 2b + c
    ("2x2x2", (4, 4, 4), ("a", "b", "c"), "{devices=[2,2,2]0,1,2,3,4,5,6,7}"),
    # order (c, b, a): c0b0 -> 0,4; c0b1 -> 2,6; c1b0 -> 1,5; c1b1 -> 3,7
    ("2x2x2", (4, 4, 4), ("c", "b", "a"), "{devices=[2,2,2]0,4,2,6,1,5,3,7}"),
    # order (b | a, c): b0 -> 0,1,4,5; b1 -> 2,3,6,7
    ("2x2x2", (4, 4), ("b", None), "{devices=[2,1,4]0,1,4,5,2,3,6,7 last_tile_dim_replicate}"),
    # order (c, a | b): c0a0 -> 0,2; c0a1 -> 4,6; c1a0 -> 1,3; c1a1 -> 5,7
    ("2x2x2", (4, 2), (("c", "a"), None), "{devices=[4,1,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ("2x2x2", (4, 4), (None, (2, 0)), "{devices=[1,4,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ("2x2x2", (2, 4, 2), ("c", None, "a"), "{devices=[2,1,2,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    ("2x2x2", (8, 2), (("a", "b", "c"), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ("2x2x2", (8, 2), (("c", "b", "a"), None), "{devices=[8,1]0,4,2,6,1,5,3,7}"),
    # ---- (2, 2, 2) mesh, devices reversed: device at (a, b, c) is 7 - (4a + 2b + c)
    ("2x2x2_rev", (4, 4, 4), ("a", "b", "c"), "{devices=[2,2,2]7,6,5,4,3,2,1,0}"),
    ("2x2x2_rev", (4, 4), ("b", None), "{devices=[2,1,4]7,6,3,2,5,4,1,0 last_tile_dim_replicate}"),
    ("2x2x2_rev", (4, 4, 4), ("c", "b", "a"), "{devices=[2,2,2]7,3,5,1,6,2,4,0}"),
]


def _case_id(case):
    mesh, shape, spec, _ = case
    return f"{mesh}-{'x'.join(map(str, shape))}-{spec}".replace(" ", "")


# --------------------------------------------------------------------------
# A numpy model of which device holds which block (for the local-shard check).
# --------------------------------------------------------------------------


def _axis_index(name_or_idx, names):
    return name_or_idx if isinstance(name_or_idx, int) else names.index(name_or_idx)


def expected_blocks(mesh_name, shape, spec):
    """{device ordinal: tuple of (start, stop) per dim} from the mesh grid.

    Each shard holds ceil(n / k) entries of a sharded dim, clipped to n, so
    even and uneven shardings share one model.
    """
    ids, mesh_shape, names = MESHES[mesh_name]
    grid = np.asarray(ids).reshape(mesh_shape)
    out = {}
    for coords in itertools.product(*(range(n) for n in mesh_shape)):
        block = []
        for dim, entry in enumerate(spec):
            if entry is None:
                block.append((0, shape[dim]))
                continue
            axes = [_axis_index(a, names) for a in (entry if isinstance(entry, tuple) else (entry,))]
            parts, index = 1, 0
            for a in axes:  # first axis is the major one
                index = index * mesh_shape[a] + coords[a]
                parts *= mesh_shape[a]
            size = -(-shape[dim] // parts)
            block.append((min(index * size, shape[dim]), min((index + 1) * size, shape[dim])))
        out[int(grid[coords])] = tuple(block)
    return out


def _norm_index(index, shape):
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))


# --------------------------------------------------------------------------
# (a) strings and (b) local shards
# --------------------------------------------------------------------------


@pytest.mark.parametrize("case", STRING_CASES, ids=[_case_id(c) for c in STRING_CASES])
def test_sharding_string_and_local_shards(devices8, case):
    mesh_name, shape, spec, expected = case
    mesh = make_mesh(mesh_name)
    n = int(np.prod(shape))
    src = torch.arange(n, dtype=torch.float32).reshape(shape)
    t = mark_sharding(src.to("xla"), mesh, spec)
    assert get_sharding_spec(t) == expected

    shards = local_shards(t)
    assert sorted(s.device_id for s in shards) == list(range(8))
    blocks = expected_blocks(mesh_name, shape, spec)
    replicas: dict = {}
    for s in shards:
        got = _norm_index(s.indices, shape)
        assert got == blocks[s.device_id], f"device {s.device_id}: {got} != {blocks[s.device_id]}"
        assert s.device == f"xla:{s.device_id}"
        assert tuple(s.data.shape) == tuple(b - a for a, b in got)
        torch.testing.assert_close(s.data, src[tuple(slice(a, b) for a, b in got)], rtol=0, atol=0)
        replicas.setdefault(got, []).append(s.replica_id)
    # each block is held by (8 / #blocks) devices, with replica ids 0..k-1
    k = 8 // len(replicas)
    for ids_ in replicas.values():
        assert sorted(ids_) == list(range(k))
    torch.testing.assert_close(t.cpu(), src, rtol=0, atol=0)
    # Writing the shards back (each device its own block) round-trips.
    load_local_shards_(t, [s.data * 10 + 1 for s in shards])
    torch.testing.assert_close(t.cpu(), src * 10 + 1, rtol=0, atol=0)
    assert get_sharding_spec(t) == expected


def test_string_of_pending_sharded_value(devices8):
    # Annotating a pending value (a constraint in the graph) prints the same.
    mesh = make_mesh("4x2_rev")
    y = torch.ones(8, 4, device="xla") * 2
    mark_sharding(y, mesh, (None, "model"))
    assert get_sharding_spec(y) == "{devices=[1,2,4]7,5,3,1,6,4,2,0 last_tile_dim_replicate}"
    spmdtorch.sync()
    assert get_sharding_spec(y) == "{devices=[1,2,4]7,5,3,1,6,4,2,0 last_tile_dim_replicate}"
    blocks = expected_blocks("4x2_rev", (8, 4), (None, "model"))
    for s in local_shards(y):
        assert _norm_index(s.indices, (8, 4)) == blocks[s.device_id]
    torch.testing.assert_close(y.cpu(), torch.full((8, 4), 2.0))


def test_expected_blocks_model_agrees_with_hand_written_layout():
    # Sanity check of the numpy model itself on two layouts read off by hand.
    b = expected_blocks("4x2_rev", (8, 4), ("data", "model"))
    assert b[7] == ((0, 2), (0, 2)) and b[6] == ((0, 2), (2, 4)) and b[0] == ((6, 8), (2, 4))
    b = expected_blocks("2x2x2", (8, 2), (("c", "a"), None))
    # device 1 is (a,b,c) = (0,0,1): index c*2 + a = 2 -> rows 4..6
    assert b[1] == ((4, 6), (0, 2)) and b[4] == ((2, 4), (0, 2)) and b[6] == ((2, 4), (0, 2))


# --------------------------------------------------------------------------
# (c) numerics
# --------------------------------------------------------------------------

NUMERIC_MESHES = ["1d", "1d_rev", "4x2", "4x2_rev", "2x4", "2x4_T", "2x2x2", "2x2x2_rev"]


def _axes(mesh_name):
    """(first axis, last axis, all axes) as names (or indices when unnamed)."""
    _, shape, names = MESHES[mesh_name]
    refs = list(names) if names else list(range(len(shape)))
    return refs[0], refs[-1], tuple(refs)


def _xla(src, mesh, spec):
    return mark_sharding(src.to("xla"), mesh, spec)


def _close(got, want):
    torch.testing.assert_close(got.cpu(), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("mesh_name", NUMERIC_MESHES)
def test_matmul_chains(devices8, mesh_name):
    mesh = make_mesh(mesh_name)
    first, last, every = _axes(mesh_name)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=g)
    w1 = torch.randn(32, 64, generator=g) / 6
    w2 = torch.randn(64, 32, generator=g) / 8
    w3 = torch.randn(32, 8, generator=g) / 6

    # Data-parallel rows, column-parallel w1, row-parallel w2, replicated w3.
    xs = _xla(x, mesh, (first, None))
    w1s = _xla(w1, mesh, (None, last))
    w2s = _xla(w2, mesh, (last, None))
    w3s = _xla(w3, mesh, (None, None))
    out = torch.relu(xs @ w1s) @ w2s @ w3s
    _close(out, torch.relu(x @ w1) @ w2 @ w3)

    # Contraction over a dim split across every mesh axis (an all-reduce).
    xa = _xla(x, mesh, (None, every))
    w1a = _xla(w1, mesh, (every, None))
    _close(xa @ w1a, x @ w1)
    # Batched matmul with the batch dim sharded.
    a = torch.randn(8, 4, 16, generator=g)
    b = torch.randn(8, 16, 4, generator=g)
    _close(torch.bmm(_xla(a, mesh, (every, None, None)), _xla(b, mesh, (None, None, None))), a @ b)
    # Linear layer (matmul + bias) with the weight sharded on the output dim.
    lin_w = torch.randn(16, 32, generator=g)
    lin_b = torch.randn(16, generator=g)
    got = F.linear(xs, _xla(lin_w, mesh, (every, None)), _xla(lin_b, mesh, (every,)))
    _close(got, F.linear(x, lin_w, lin_b))


@pytest.mark.parametrize("mesh_name", NUMERIC_MESHES)
def test_reductions_and_softmax(devices8, mesh_name):
    mesh = make_mesh(mesh_name)
    _, last, every = _axes(mesh_name)
    g = torch.Generator().manual_seed(1)
    src = torch.randn(16, 8, 4, generator=g)
    # dim 0 sharded over every axis; dims 1, 2 unsharded
    t = _xla(src, mesh, (every, None, None))
    # dim 1 sharded over the last axis (partially replicated on the others)
    u = _xla(src * 2, mesh, (None, last, None))
    ref_u = src * 2

    for got, want in [
        (t.sum(), src.sum()),
        (t.sum(0), src.sum(0)),  # over the sharded dim
        (t.sum(1), src.sum(1)),  # over an unsharded dim
        (t.sum((0, 2)), src.sum((0, 2))),
        (t.mean(), src.mean()),
        (t.mean(0), src.mean(0)),
        (t.mean(-1, keepdim=True), src.mean(-1, keepdim=True)),
        (t.amax(0), src.amax(0)),
        (t.amax(2), src.amax(2)),
        (t.max(), src.max()),
        (t.min(0).values, src.min(0).values),
        (torch.softmax(t, 0), torch.softmax(src, 0)),  # across shards
        (torch.softmax(t, -1), torch.softmax(src, -1)),  # within a shard
        (torch.log_softmax(t, 1), torch.log_softmax(src, 1)),
        (u.sum(1), ref_u.sum(1)),
        (u.mean((1, 2)), ref_u.mean((1, 2))),
        (u.amax(1), ref_u.amax(1)),
        (torch.softmax(u, 1), torch.softmax(ref_u, 1)),
        (t.var(0), src.var(0)),
        (t * u, src * ref_u),  # operands with different shardings
    ]:
        _close(got, want)
    # argmax over a sharded dim: indices must match exactly
    torch.testing.assert_close(t.max(0).indices.cpu(), src.max(0).indices, rtol=0, atol=0)
    torch.testing.assert_close(t.argmax(1).cpu(), src.argmax(1), rtol=0, atol=0)


def _layer_rules(mesh_name):
    """Megatron-style rules for one decoder layer, plus the batch spec."""
    first, last, _ = _axes(mesh_name)
    col, row = (last, None), (None, last)
    return {
        "attention.w[qkv].weight": col,
        "attention.wo.weight": row,
        "feed_forward.w[13].weight": col,
        "feed_forward.w2.weight": row,
        "attention_norm.weight": (None,),
    }, (first, None, None)


@pytest.mark.parametrize(
    "mesh_name, ffn_dim",
    [
        ("4x2", 176),
        ("2x4", 176),
        ("4x2_rev", 176),
        ("2x2x2", 176),
        # 8-way over a 1-D mesh: ffn_dim 172 and the batch of 4 are uneven
        ("1d", 172),
    ],
)
def test_decoder_layer_forward_backward(devices8, mesh_name, ffn_dim):
    cfg = LlamaConfig(ffn_dim=ffn_dim)
    mesh = make_mesh(mesh_name)
    torch.manual_seed(0)
    ref = DecoderLayer(cfg)
    layer = copy.deepcopy(ref).to("xla")
    rules, batch_spec = _layer_rules(mesh_name)
    mark_sharding(layer, mesh, rules)

    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 16, cfg.dim, generator=g)
    cot = torch.randn(4, 16, cfg.dim, generator=g)

    x_ref = x.clone().requires_grad_(True)
    cos, sin = rope_tables(cfg, 16)
    out_ref = ref(x_ref, cos, sin)
    (out_ref * cot).sum().backward()

    xs = _xla(x, mesh, batch_spec).requires_grad_(True)
    cos_x, sin_x = rope_tables(cfg, 16, device="xla")
    out = layer(xs, cos_x, sin_x)
    (out * _xla(cot, mesh, batch_spec)).sum().backward()

    _close(out, out_ref.detach())
    _close(xs.grad, x_ref.grad)
    for (name, p_ref), (_, p) in zip(ref.named_parameters(), layer.named_parameters()):
        torch.testing.assert_close(
            p.grad.cpu(), p_ref.grad, rtol=RTOL, atol=ATOL, msg=lambda m, name=name: f"{name}: {m}"
        )
    # the annotated weights kept their shardings through the step
    spmdtorch.sync()
    _, last, _ = _axes(mesh_name)
    assert get_sharding_spec(layer.attention.wq.weight) == get_sharding_spec(
        mark_sharding(torch.zeros(64, 64, device="xla"), mesh, (last, None))
    )


# --------------------------------------------------------------------------
# Uneven shardings (a dim the shard count does not divide): XLA's layout, where
# each shard holds ceil(n / k) of the dim and the last ones are short or empty.
# The sharding string is the same as for an even dim (it describes the tile
# grid, not the sizes); values and computations are exact.
# --------------------------------------------------------------------------

UNEVEN_CASES = [
    ("1d", (6, 4), ("x", None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ("1d_rev", (12, 3), (None, 0), "{devices=[1,8]7,6,5,4,3,2,1,0}"),
    ("4x2", (8, 3), ("data", "model"), "{devices=[4,2]0,1,2,3,4,5,6,7}"),
    ("4x2_rev", (6, 5), ("data", "model"), "{devices=[4,2]7,6,5,4,3,2,1,0}"),
    ("4x2", (6, 4), ("data", None), "{devices=[4,1,2]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ("4x2", (12,), (("model", "data"),), "{devices=[8]0,2,4,6,1,3,5,7}"),
    ("2x4", (3, 6), ("model", "data"), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ("2x4_T", (3, 6), ("data", "model"), "{devices=[2,4]0,2,4,6,1,3,5,7}"),
    ("2x2x2", (4, 4, 6), (None, "a", ("b", "c")), "{devices=[1,2,4]0,1,2,3,4,5,6,7}"),
]


def test_uneven_blocks_model_by_hand():
    b = expected_blocks("1d", (6, 4), ("x", None))
    assert [b[d][0] for d in range(8)] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (6, 6), (6, 6)]
    b = expected_blocks("4x2_rev", (6, 5), ("data", "model"))
    # device 7 is mesh (0, 0): rows 0..2, cols 0..3; device 0 is mesh (3, 1): empty rows, cols 3..5
    assert b[7] == ((0, 2), (0, 3)) and b[0] == ((6, 6), (3, 5)) and b[2] == ((4, 6), (3, 5))


@pytest.mark.parametrize("case", UNEVEN_CASES, ids=[_case_id(c) for c in UNEVEN_CASES])
def test_uneven_sharding_is_exact(devices8, case):
    mesh_name, shape, spec, expected = case
    mesh = make_mesh(mesh_name)
    n = int(np.prod(shape))
    src = torch.arange(n, dtype=torch.float32).reshape(shape)
    t = mark_sharding(src.to("xla"), mesh, spec)
    assert tuple(t.shape) == shape
    assert get_sharding_spec(t) == expected
    torch.testing.assert_close(t.cpu(), src, rtol=0, atol=0)

    blocks = expected_blocks(mesh_name, shape, spec)
    shards = local_shards(t)
    assert sorted(s.device_id for s in shards) == list(range(8))
    for s in shards:
        got = _norm_index(s.indices, shape)
        assert got == blocks[s.device_id], f"device {s.device_id}: {got} != {blocks[s.device_id]}"
        torch.testing.assert_close(s.data, src[tuple(slice(a, b) for a, b in got)], rtol=0, atol=0)

    # Computations see the logical tensor only (no padding leaks into them).
    _close(t.sum(0), src.sum(0))
    _close(t.sum(), src.sum())
    _close(t.mean(-1), src.mean(-1))
    _close(t.amax(0), src.amax(0))
    _close(torch.softmax(t / n, 0), torch.softmax(src / n, 0))
    torch.testing.assert_close(t.argmin(0).cpu(), src.argmin(0), rtol=0, atol=0)
    w = torch.linspace(-1, 1, shape[-1])
    _close(t @ w.to("xla"), src @ w)
    # In-place updates keep values and the annotation.
    t.mul_(-1).add_(3)
    spmdtorch.sync()
    torch.testing.assert_close(t.cpu(), src * -1 + 3, rtol=0, atol=0)
    assert get_sharding_spec(t) == expected


@pytest.mark.parametrize(
    "mesh_name, expected",
    [("4x2", "{devices=[4,2]0,1,2,3,4,5,6,7}"), ("4x2_rev", "{devices=[4,2]7,6,5,4,3,2,1,0}")],
)
def test_uneven_pending_value(devices8, mesh_name, expected):
    # Annotating a pending (not yet computed) value unevenly: a constraint in
    # the graph; the barrier stores it padded.
    mesh = make_mesh(mesh_name)
    src = torch.arange(30.0).reshape(6, 5)
    y = src.to("xla") * 2
    mark_sharding(y, mesh, ("data", "model"))
    assert get_sharding_spec(y) == expected
    spmdtorch.sync()
    assert get_sharding_spec(y) == expected
    torch.testing.assert_close(y.cpu(), src * 2, rtol=0, atol=0)
    blocks = expected_blocks(mesh_name, (6, 5), ("data", "model"))
    for s in local_shards(y):
        got = _norm_index(s.indices, (6, 5))
        assert got == blocks[s.device_id]
        torch.testing.assert_close(s.data, (src * 2)[tuple(slice(a, b) for a, b in got)])
    _close((y + 1).sum(1), (src * 2 + 1).sum(1))


def test_uneven_matmul_chain(devices8):
    # 12 x 20 @ 20 x 10 over a (4, 2) mesh: 20 over 4 is even, 10 over 4 and
    # 12 over 8 are not.
    mesh = make_mesh("4x2")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(12, 20, generator=g)
    w1 = torch.randn(20, 10, generator=g) / 4
    w2 = torch.randn(10, 6, generator=g) / 3
    xs = _xla(x, mesh, (("data", "model"), None))
    w1s = _xla(w1, mesh, ("model", "data"))
    w2s = _xla(w2, mesh, ("data", None))
    out = torch.softmax(torch.tanh(xs @ w1s) @ w2s, -1)
    _close(out, torch.softmax(torch.tanh(x @ w1) @ w2, -1))
