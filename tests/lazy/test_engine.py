"""The engine's one state object: every cache registered, cleared by debug.clear_caches(),
and a bounded (LRU) compile cache that counts its evictions."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import config, debug
from spmdtorch.lazy import executor
from spmdtorch.lazy._engine import ENGINE, EVICTION_COUNTER, CompileCache


def _train_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    spmdtorch.sync()
    return loss


def _model_pair(seed=0):
    torch.manual_seed(seed)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    xla = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    xla.load_state_dict(cpu.state_dict())
    xla.to("xla")
    return cpu, xla


# Caches the engine must know about; each is filled by a lazy training step
# (adam: scalars, packed scalars) or by the extra calls in test_clear_caches.
EXPECTED = {
    "lazy.executor.compile_cache",
    "lazy.executor.scalar_arrays",
    "lazy.executor.packed_arrays",
    "lazy.executor.scalar_signatures",
    "lazy.keys.signatures",
    "lazy.graph.interned_scalars",
    "lazy.padding.padded_shapes",
    "lazy.rewrite.input_views",
    "lazy.compiled.flat_specs",
    "tensor.dispatch.meta_cache",
    "tensor.dispatch.op_facts",
    "tensor.xla_tensor.contiguous_strides",
    "partition.marking.pad_programs",
    "checkpoint.fingerprint.programs",
    "checkpoint.placement.unpad_programs",
    "checkpoint.placement.cast_programs",
}


def test_every_cache_is_registered():
    import spmdtorch.checkpoint.fingerprint
    import spmdtorch.checkpoint.placement  # noqa: F401

    assert EXPECTED <= set(debug.cache_sizes())


def test_clear_caches_empties_every_cache_and_the_next_step_matches_eager(devices8):
    cpu, xla = _model_pair()
    opt_c = torch.optim.AdamW(cpu.parameters(), lr=1e-2)
    opt_x = torch.optim.AdamW(xla.parameters(), lr=1e-2)
    x, y = torch.randn(6, 8), torch.randn(6, 4)
    xd, yd = x.to("xla"), y.to("xla")

    # Fill the caches a lazy step does not reach on its own.
    executor.scalar_array(0.25)
    spmdtorch.compile(lambda a: a * 2)(xd)
    import jax.numpy as jnp

    from spmdtorch.checkpoint.fingerprint import device_fingerprints
    from spmdtorch.lazy import padding

    device_fingerprints([jnp.ones(4)])
    padding.padded_shape((10, 3), None)

    for _ in range(2):
        _train_step(cpu, opt_c, x, y)
        _train_step(xla, opt_x, xd, yd)
    filled = debug.cache_sizes()
    must_fill = EXPECTED - {
        "lazy.rewrite.input_views",  # only permute/transposes of program inputs
        "partition.marking.pad_programs",  # only uneven mark_sharding
        "checkpoint.placement.unpad_programs",  # only checkpoint reads of padded storage
        "checkpoint.placement.cast_programs",  # only checkpoint reads with a dtype cast
    }
    assert all(filled[name] > 0 for name in must_fill), {n: filled[n] for n in must_fill}

    debug.clear_caches()
    assert set(debug.cache_sizes().values()) == {0}, debug.cache_sizes()
    assert debug.last_executable() is None

    # The next steps re-trace and re-compile, and still match eager CPU torch.
    compiles = debug.counter_value("UncachedCompile")
    for _ in range(2):
        loss_c = _train_step(cpu, opt_c, x, y)
        loss_x = _train_step(xla, opt_x, xd, yd)
        np.testing.assert_allclose(loss_x.detach().cpu().numpy(), loss_c.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert debug.counter_value("UncachedCompile") > compiles
    for pc, px in zip(cpu.parameters(), xla.parameters()):
        np.testing.assert_allclose(px.detach().cpu().numpy(), pc.detach().numpy(), rtol=1e-5, atol=1e-6)
    assert debug.last_executable() is not None


def test_clear_caches_keeps_pending_values_and_compiled_functions(devices8):
    w = torch.zeros(3, device="xla")
    step = spmdtorch.compile(lambda a: w.add_(a).sum())
    for _ in range(3):
        step(torch.ones(3, device="xla"))
    pending = w * 10  # recorded, not run
    debug.clear_caches()
    assert pending.cpu().tolist() == [30.0, 30.0, 30.0]
    replays = debug.counter_value("CompiledReplay")
    assert step(torch.ones(3, device="xla")).item() == 12.0  # replays its own program
    assert debug.counter_value("CompiledReplay") == replays + 1


@pytest.fixture
def small_compile_cache(monkeypatch):
    monkeypatch.setenv("SPMDTORCH_COMPILE_CACHE_SIZE", "3")
    config.reload()
    ENGINE.compile_cache.clear()
    yield 3
    monkeypatch.delenv("SPMDTORCH_COMPILE_CACHE_SIZE")
    config.reload()


def _program(k: int):
    """A distinct program per ``k`` (the length is in the graph key; a Python number would not be)."""
    x = torch.arange(8 + k, dtype=torch.float32, device="xla")
    return ((x + 1) * 2).sum()


def _expected(k: int) -> float:
    return float(sum((i + 1) * 2 for i in range(8 + k)))


def test_compile_cache_is_bounded_lru_and_counts_evictions(devices8, small_compile_cache):
    assert ENGINE.compile_cache.maxsize == small_compile_cache
    evicted_before = debug.counter_value(EVICTION_COUNTER)
    progs = []
    for k in range(10):
        assert _program(k).item() == _expected(k)
        progs.append(weakref.ref(executor.ENGINE.compile_cache.peek(ENGINE.last_key)))
        assert len(ENGINE.compile_cache) <= small_compile_cache
    assert debug.counter_value(EVICTION_COUNTER) - evicted_before == 10 - small_compile_cache
    assert f"Counter: {EVICTION_COUNTER}" in debug.metrics_report()
    # Memory is bounded: an evicted program nobody holds is freed.
    gc.collect()
    assert sum(r() is not None for r in progs) <= small_compile_cache
    # An evicted program compiles again, with the right result; a recent one is a hit.
    compiles = debug.counter_value("UncachedCompile")
    assert _program(0).item() == _expected(0)
    assert debug.counter_value("UncachedCompile") == compiles + 1
    assert _program(9).item() == _expected(9)
    assert debug.counter_value("UncachedCompile") == compiles + 1


def test_compile_cache_hit_refreshes_recency():
    c = CompileCache(maxsize=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the most recent
    c.put("c", 3)
    assert "a" in c and "b" not in c and c.evictions == 1
    assert c.peek("a") == 1


def test_register_cache_rejects_what_it_cannot_clear():
    with pytest.raises(TypeError, match="needs size="):
        ENGINE.register_cache("test.reset_only", lambda: None, maxsize=4)
    with pytest.raises(TypeError, match="expected a dict-like cache"):
        ENGINE.register_cache("test.number", 3, maxsize=4)
    with pytest.raises(ValueError, match="give maxsize=, or bound="):
        ENGINE.register_cache("test.unbounded", {})
    assert "test.unbounded" not in debug.cache_sizes()


def test_max_in_flight_comes_from_config(devices8, monkeypatch):
    monkeypatch.setenv("SPMDTORCH_MAX_IN_FLIGHT", "1")
    config.reload()
    try:
        assert ENGINE.max_in_flight == 1
        x = torch.ones(4, device="xla")
        for _ in range(4):
            x = x + 1
            spmdtorch.sync()
            assert len(ENGINE.inflight) <= 1
        assert x.cpu().tolist() == [5.0] * 4
    finally:
        monkeypatch.delenv("SPMDTORCH_MAX_IN_FLIGHT")
        config.reload()
    assert ENGINE.max_in_flight == 8


def test_engine_owns_the_lazy_data_model():
    """Pending set, holders, trace hook and order counter are the engine's, not a module's own."""
    import torch

    from spmdtorch.lazy import _storage

    assert _storage.PENDING is ENGINE.pending
    assert _storage.HOLDERS is ENGINE.holders and _storage.CO_HOLDERS is ENGINE.co_holders
    assert _storage.TRACE_HOOK is ENGINE.trace_hook and _storage.SEQ is ENGINE.seq
    x = torch.ones(3, device="xla") * 2  # pending until the barrier
    assert x._st in list(ENGINE.pending)
    spmdtorch.sync()
    assert ENGINE.holders[id(x._st.value)]() is x._st  # the concrete result's holder
    debug.clear_caches()  # not caches: clearing leaves the data model alone
    assert ENGINE.holders[id(x._st.value)]() is x._st
    assert x.cpu().tolist() == [2.0, 2.0, 2.0]


def test_scalar_caches_keep_the_recent_values_and_stay_bounded():
    """Values that change every step (a scheduled learning rate) must not pile up device buffers."""
    hot = executor.scalar_array(0.9)
    hot_packed = executor._packed_array("f", (0.9, 0.999), None)
    for i in range(3 * executor.SCALAR_CACHE_MAX):
        executor.scalar_array(1e-3 * i + 0.5)
        executor._packed_array("f", (1e-3 * i, 0.9), None)
        # Constants the loop reuses stay cached.
        assert executor.scalar_array(0.9) is hot
        assert executor._packed_array("f", (0.9, 0.999), None) is hot_packed
    assert len(ENGINE.scalar_arrays) <= executor.SCALAR_CACHE_MAX
    assert len(ENGINE.packed_arrays) <= executor.SCALAR_CACHE_MAX
