"""Random ops on xla: seeding, fresh draws per step, mesh independence, distributions.

The xla stream is drawn from torch's default CPU generator (see
``spmdtorch/lazy/rng.py``), so the contract checked here is torch's own:

(a) the same seed (``torch.manual_seed`` or ``spmdtorch.manual_seed``) gives
    the same values, also when the first run compiles and the second replays a
    cached program; ``torch.get_rng_state``/``set_rng_state`` and ``fork_rng``
    save and restore the xla stream;
(b) successive calls, lazy steps and ``spmdtorch.compile`` replays draw fresh
    numbers;
(c) a random tensor sharded over a mesh of 1, 4 or 8 devices, in any layout
    (even or padded), holds the same values as the unsharded one;
(d) the values follow torch's distributions (generous 6-sigma bounds, with
    2**16 samples, so a correct sampler fails with negligible probability
    and a wrong parameter fails for sure).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch import RandomGeneratorError, debug
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

SHAPE = (64, 32)
PROBS = torch.tensor([0.05, 0.0, 0.3, 0.15, 0.0, 0.2, 0.1, 0.2])


def _probs_xla():
    return PROBS.to("xla")


# Every random op of the issue, each making one ``SHAPE``-sized (or small) tensor.
OPS = {
    "rand": lambda: torch.rand(SHAPE, device="xla"),
    "randn": lambda: torch.randn(SHAPE, device="xla"),
    "randint": lambda: torch.randint(-3, 7, SHAPE, device="xla"),
    "F.dropout": lambda: F.dropout(torch.ones(SHAPE, device="xla"), p=0.3, training=True),
    "nn.Dropout": lambda: torch.nn.Dropout(0.3).train()(torch.ones(SHAPE, device="xla")),
    "bernoulli": lambda: torch.bernoulli(torch.full(SHAPE, 0.25, device="xla")),
    "normal_": lambda: torch.empty(SHAPE, device="xla").normal_(2.0, 3.0),
    "uniform_": lambda: torch.empty(SHAPE, device="xla").uniform_(-2.0, 5.0),
    "randperm": lambda: torch.randperm(200, device="xla"),
    "multinomial": lambda: torch.multinomial(_probs_xla().expand(16, 8), 5),
    "multinomial_replacement": lambda: torch.multinomial(_probs_xla(), 64, replacement=True),
}


def _draw(name):
    return OPS[name]().cpu()


# -- (a) reproducibility and (b) fresh numbers per call -------------------------


@pytest.mark.parametrize("name", OPS)
def test_same_seed_same_values_and_fresh_values_per_call(name):
    torch.manual_seed(1234)
    first = [_draw(name), _draw(name)]
    assert not torch.equal(first[0], first[1]), f"{name}: two calls returned the same values"
    spmdtorch.manual_seed(1234)  # the same stream as torch.manual_seed (checked below)
    second = [_draw(name), _draw(name)]
    for a, b in zip(first, second):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(99)
    assert not torch.equal(_draw(name), first[0]), f"{name}: another seed gave the same values"


def test_both_seeders_drive_the_same_stream():
    torch.manual_seed(7)
    a = _draw("randn")
    spmdtorch.manual_seed(7)
    torch.testing.assert_close(_draw("randn"), a, rtol=0, atol=0)


def test_first_run_compiles_and_still_matches_the_cached_replay():
    # Regression: lowering the program used to consume a key, so the run that
    # compiled drew different numbers from a later cached run.
    shape = (7, 13)  # a shape no other test uses: the first call must compile
    torch.manual_seed(3)
    before = debug.counter_value("UncachedCompile")
    a = torch.randn(shape, device="xla").cpu()
    assert debug.counter_value("UncachedCompile") == before + 1
    torch.manual_seed(3)
    b = torch.randn(shape, device="xla").cpu()
    assert debug.counter_value("UncachedCompile") == before + 1
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rng_state_and_fork_rng_cover_the_xla_stream():
    torch.manual_seed(0)
    _draw("rand")
    state = torch.get_rng_state()
    a = _draw("rand")
    torch.set_rng_state(state)
    torch.testing.assert_close(_draw("rand"), a, rtol=0, atol=0)
    torch.set_rng_state(state)
    with torch.random.fork_rng(devices=[]):
        inside = _draw("rand")
    torch.testing.assert_close(inside, a, rtol=0, atol=0)
    torch.testing.assert_close(_draw("rand"), a, rtol=0, atol=0)  # fork_rng restored the state


def test_values_do_not_depend_on_other_pending_ops():
    torch.manual_seed(5)
    alone = torch.randn(SHAPE, device="xla").cpu()
    torch.manual_seed(5)
    other = torch.ones(SHAPE, device="xla") * 3  # a non-random node in the same program
    mixed = torch.randn(SHAPE, device="xla")
    spmdtorch.sync()
    torch.testing.assert_close(mixed.cpu(), alone, rtol=0, atol=0)
    assert float(other.sum().item()) == 3 * SHAPE[0] * SHAPE[1]


def test_explicit_generator_is_rejected_with_the_fix():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(RandomGeneratorError, match=r"randn.*generator=.*torch.manual_seed"):
        torch.randn(3, generator=g, device="xla")
    with pytest.raises(RandomGeneratorError, match=r"normal_"):
        torch.empty(3, device="xla").normal_(generator=g)


# -- (b) fresh numbers per program, lazy step and compiled replay ----------------


def test_two_draws_in_one_program_differ():
    torch.manual_seed(0)
    a = torch.randn(SHAPE, device="xla")
    b = torch.randn(SHAPE, device="xla")
    spmdtorch.sync()
    assert not torch.equal(a.cpu(), b.cpu())


def test_lazy_steps_draw_fresh_masks():
    x = torch.ones(SHAPE, device="xla")
    masks = []
    for _ in range(3):
        with spmdtorch.step():
            y = F.dropout(x, 0.5, training=True)
        masks.append(y.cpu())
    assert all(not torch.equal(masks[i], masks[j]) for i in range(3) for j in range(i))


def test_compiled_replays_draw_fresh_numbers():
    @spmdtorch.compile
    def noisy(x):
        return F.dropout(x, 0.5, training=True) + torch.randn_like(x)

    x = torch.ones(SHAPE, device="xla")
    torch.manual_seed(0)
    before = debug.counter_value("CompiledReplay")
    outs = [noisy(x).cpu() for _ in range(5)]
    assert debug.counter_value("CompiledReplay") - before >= 2  # the last calls replayed
    for i in range(5):
        for j in range(i):
            assert not torch.equal(outs[i], outs[j]), f"calls {j} and {i} drew the same numbers"
    torch.manual_seed(0)  # replays are reproducible too
    again = [noisy(x).cpu() for _ in range(5)]
    for a, b in zip(outs, again):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _dropout_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.25), torch.nn.Linear(32, 4))


def _dropout_batches(n=4):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(n)]


def _train_with_dropout(mode):
    model = _dropout_model().to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    run = spmdtorch.compile(step) if mode == "compiled" else step
    torch.manual_seed(42)
    losses = []
    for x, y in _dropout_batches():
        with spmdtorch.step():
            losses.append(run(x.to("xla"), y.to("xla")))
    return torch.tensor([float(l.item()) for l in losses])


def test_dropout_training_is_reproducible_and_compile_equals_lazy():
    lazy = _train_with_dropout("lazy")
    compiled = _train_with_dropout("compiled")
    # One key per step in both modes, the dropout node has the same rank in
    # both programs: the same masks, so the same losses (float rounding only).
    torch.testing.assert_close(compiled, lazy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(_train_with_dropout("compiled"), compiled, rtol=0, atol=0)
    # Dropout really is active: the same model without it trains differently.
    model = _dropout_model()
    model[2].p = 0.0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    eager = []
    for x, y in _dropout_batches():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        eager.append(loss.item())
    assert not torch.allclose(lazy, torch.tensor(eager), rtol=1e-3)


# -- (c) mesh independence ----------------------------------------------------

# A mesh spans every device of the runtime (spmdtorch.mesh.Mesh), so "1, 4
# and 8 devices" are 1, 4 and 8 shards of the tensor over the 8-device mesh.
# (device ids, mesh shape, axis names, partition spec for a 2-D tensor, shards)
LAYOUTS = {
    "1shard": (np.arange(8), (1, 8), ("x", "y"), ("x", None), 1),
    "4shards_cols_reversed_ids": (np.arange(8)[::-1], (2, 4), ("x", "y"), (None, "y"), 4),
    "8shards_4x2_transposed": (np.arange(8), (4, 2), ("x", "y"), ("y", "x"), 8),
    "8shards_both_axes_on_dim1": (np.arange(8), (2, 4), ("x", "y"), (None, ("x", "y")), 8),
}
SHARDABLE = ["rand", "randn", "randint", "F.dropout", "bernoulli", "normal_", "uniform_"]


def _n_shards(t):
    value = t._st.value
    return int(np.prod(value.shape) // np.prod(value.sharding.shard_shape(value.shape)))


def _draw_all_shardable(seed):
    """One program drawing every shardable op (one compile per layout)."""
    torch.manual_seed(seed)
    return {name: OPS[name]() for name in SHARDABLE}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sharded_random_tensors_do_not_depend_on_the_mesh(layout):
    ids, shape, axes, spec, shards = LAYOUTS[layout]
    mesh = Mesh(ids, shape, axes)
    refs = _draw_all_shardable(11)
    spmdtorch.sync()
    ts = _draw_all_shardable(11)
    for t in ts.values():
        mark_sharding(t, mesh, spec)
    spmdtorch.sync()
    for name, t in ts.items():
        assert _n_shards(t) == shards, f"{name} on {layout}: {_n_shards(t)} shards, expected {shards}"
        ref = refs[name].cpu()
        # The random bits are the same on every layout (the other draws match
        # exactly). normal_'s `randn * std + mean` may be fused into one FMA in
        # one layout and not another (XLA:CPU of jax 0.12 does): a rounding, so
        # a few ulps of the output's scale, not another draw.
        atol = 8 * torch.finfo(ref.dtype).eps * float(ref.abs().max()) if name == "normal_" else 0
        torch.testing.assert_close(t.cpu(), ref, rtol=0, atol=atol, msg=lambda m, n=name: f"{n} on {layout}: {m}")


def test_in_place_draw_into_an_annotated_tensor_matches():
    # nn.Linear(device="xla") + FSDP: the parameter is annotated, then initialised.
    torch.manual_seed(2)
    ref = torch.empty(SHAPE, device="xla").uniform_(-1, 1).cpu()
    torch.manual_seed(2)
    t = torch.empty(SHAPE, device="xla")
    mark_sharding(t, Mesh(np.arange(8), (8,), ("fsdp",)), ("fsdp", None))
    t.uniform_(-1, 1)
    spmdtorch.sync()
    assert _n_shards(t) == 8
    torch.testing.assert_close(t.cpu(), ref, rtol=0, atol=0)


def test_uneven_sharding_gives_the_same_values():
    # 10 x 6 in 4 row shards and 8 column shards: padded shards (docs/design.md, decision 6).
    torch.manual_seed(4)
    ref = torch.randn(10, 6, device="xla").cpu()
    for shape, axes, spec in (((4, 2), ("x", "y"), ("x", None)), ((8,), ("x",), (None, "x"))):
        torch.manual_seed(4)
        t = torch.randn(10, 6, device="xla")
        mark_sharding(t, Mesh(np.arange(8), shape, axes), spec)
        torch.testing.assert_close(t.cpu(), ref, rtol=0, atol=0)


# -- (d) distributions ----------------------------------------------------------

N = 1 << 16  # 65536 samples


def _sigma(var):
    """Standard error of a mean of N draws of variance ``var``."""
    return (var / N) ** 0.5


def _moments(t):
    t = t.double()
    return t.mean().item(), t.var().item()


def test_rand_uniform_distribution_and_range():
    torch.manual_seed(0)
    u = torch.rand(N, device="xla").cpu()
    assert u.dtype == torch.float32 and u.min() >= 0 and u.max() < 1
    mean, var = _moments(u)
    # the variance of a sample variance of U(0, 1) draws is (1/80 - 1/144) / N
    assert abs(mean - 0.5) < 6 * _sigma(1 / 12) and abs(var - 1 / 12) < 6 * _sigma(1 / 80 - 1 / 144)
    v = torch.empty(N, device="xla").uniform_(-2.0, 5.0).cpu()
    assert v.min() >= -2 and v.max() < 5
    mean, var = _moments(v)
    assert abs(mean - 1.5) < 6 * _sigma(49 / 12) and abs(var - 49 / 12) < 6 * 49 * _sigma(1 / 80 - 1 / 144)
    # Reduced precision: drawn in the dtype, so never rounded up onto the excluded bound.
    for dt in (torch.bfloat16, torch.float16):
        h = torch.rand(N, dtype=dt, device="xla").cpu()
        assert h.dtype == dt and h.min() >= 0 and h.max() < 1, f"{dt}: max {h.max()}"


def test_random_covers_the_integer_range():
    torch.manual_seed(0)
    r = torch.empty(N, dtype=torch.uint8, device="xla").random_().cpu()
    assert r.min() == 0 and r.max() == 255  # torch's range includes the dtype's max
    r = torch.empty(N, dtype=torch.int64, device="xla").random_(3, 9).cpu()
    assert set(r.unique().tolist()) == set(range(3, 9))


def test_randn_and_normal_moments():
    torch.manual_seed(0)
    z = torch.randn(N, device="xla").cpu()
    mean, var = _moments(z)
    assert abs(mean) < 6 * _sigma(1) and abs(var - 1) < 6 * _sigma(2)  # var of a normal sample variance: 2/N
    w = torch.empty(N, device="xla").normal_(2.0, 3.0).cpu()
    mean, var = _moments(w)
    assert abs(mean - 2) < 6 * _sigma(9) and abs(var - 9) < 6 * 9 * _sigma(2)
    b = torch.randn(N, dtype=torch.bfloat16, device="xla").cpu()
    assert b.dtype == torch.bfloat16 and abs(b.float().mean().item()) < 6 * _sigma(1) + 0.01
    # Gaussian tails: P(|z| > 3) = 0.0027; some draws are out there, none absurd.
    assert 0.0015 < (z.abs() > 3).double().mean().item() < 0.004 and z.abs().max() < 7


def test_randint_range_and_uniformity():
    torch.manual_seed(0)
    r = torch.randint(-3, 7, (N,), device="xla").cpu()
    assert r.dtype == torch.int64 and r.min() == -3 and r.max() == 6
    counts = torch.bincount(r + 3, minlength=10).double()
    assert (counts - N / 10).abs().max() < 6 * (N * 0.1 * 0.9) ** 0.5


def test_dropout_and_bernoulli_rates():
    torch.manual_seed(0)
    for p in (0.1, 0.5):
        for y in (
            F.dropout(torch.ones(N, device="xla"), p, training=True),
            torch.nn.Dropout(p).train()(torch.ones(N, device="xla")),
        ):
            y = y.cpu()
            kept = y != 0
            assert abs(1 - kept.double().mean().item() - p) < 6 * _sigma(p * (1 - p))
            torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    # eval mode is the identity
    x = torch.randn(64, device="xla")
    torch.testing.assert_close(torch.nn.Dropout(0.5).eval()(x).cpu(), x.cpu(), rtol=0, atol=0)
    b = torch.bernoulli(torch.full((N,), 0.25, device="xla")).cpu()
    assert set(b.unique().tolist()) == {0.0, 1.0}
    assert abs(b.double().mean().item() - 0.25) < 6 * _sigma(0.25 * 0.75)
    probs = torch.tensor([0.0, 1.0, 0.0, 1.0]).repeat(64)
    torch.testing.assert_close(torch.bernoulli(probs.to("xla")).cpu(), probs, rtol=0, atol=0)
    b_ = torch.zeros(N, device="xla").bernoulli_(0.75).cpu()
    assert abs(b_.double().mean().item() - 0.75) < 6 * _sigma(0.25 * 0.75)


def test_randperm_is_a_permutation():
    torch.manual_seed(0)
    for n in (1, 5, 1000):
        p = torch.randperm(n, device="xla").cpu()
        assert p.dtype == torch.int64
        torch.testing.assert_close(p.sort().values, torch.arange(n), rtol=0, atol=0)
    # Every position is uniform: the first element's mean over many perms is ~ (n-1)/2.
    # (one cached program per call: a single program with 200 sorts compiles slowly)
    firsts = torch.tensor([torch.randperm(10, device="xla")[0].item() for _ in range(200)]).double()
    assert abs(firsts.mean().item() - 4.5) < 6 * (99 / 12 / 200) ** 0.5


def test_multinomial_without_replacement_is_valid():
    torch.manual_seed(0)
    rows = 4096
    s = torch.multinomial(_probs_xla().expand(rows, 8), 6).cpu()
    assert s.shape == (rows, 6) and s.dtype == torch.int64
    # six distinct categories per row, never one of probability zero (there are exactly six)
    torch.testing.assert_close(s.sort(dim=1).values, torch.tensor([0, 2, 3, 5, 6, 7]).expand(rows, 6))
    # the first pick follows the probabilities
    freq = torch.bincount(s[:, 0], minlength=8).double() / rows
    assert (freq - PROBS.double()).abs().max() < 6 * (0.25 / rows) ** 0.5


def test_multinomial_with_replacement_follows_the_probabilities():
    torch.manual_seed(0)
    s = torch.multinomial(_probs_xla().expand(2, 8), N // 2, replacement=True).cpu()
    assert s.shape == (2, N // 2) and s.dtype == torch.int64
    freq = torch.bincount(s.flatten(), minlength=8).double() / N
    assert freq[1] == 0 and freq[4] == 0
    assert (freq - PROBS.double()).abs().max() < 6 * _sigma(0.25)
