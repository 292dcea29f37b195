"""Lazy execution: barriers, one program per sync, graph cache, donation, async bound."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor.dispatch import read_value


def pending(t):
    return isinstance(read_value(t), LazyRef)


def test_ops_are_recorded_not_run_until_a_barrier():
    x = torch.ones(3, device="xla")
    spmdtorch.sync()
    before = debug.counter_value("ExecuteCount")
    y = x * 2 + 1
    z = y.sum()
    assert pending(y) and pending(z)
    assert debug.counter_value("ExecuteCount") == before
    spmdtorch.sync()
    assert not pending(y) and not pending(z)
    # all pending live tensors are computed by one program
    assert debug.counter_value("ExecuteCount") == before + 1
    assert z.item() == 9.0


@pytest.mark.parametrize(
    "barrier",
    [
        lambda t: spmdtorch.sync(),
        lambda t: spmdtorch.mark_step(),
        lambda t: t.sum().item(),
        lambda t: t.cpu(),
        lambda t: repr(t),
        lambda t: bool(t.sum() > 0),
    ],
)
def test_barriers_materialise(barrier):
    t = torch.ones(2, device="xla") + 1
    assert pending(t)
    barrier(t)
    assert not pending(t)


def test_step_context_syncs_on_exit():
    w = torch.ones(3, device="xla")
    spmdtorch.sync()
    with spmdtorch.step():
        w.mul_(2)
        assert pending(w)
    assert not pending(w)
    torch.testing.assert_close(w.cpu(), torch.full((3,), 2.0))


def test_graph_cache_reuses_programs_across_steps():
    w = torch.zeros(4, device="xla")
    spmdtorch.sync()
    before = debug.counter_value("UncachedCompile")
    for i in range(10):
        w.add_(torch.full((4,), float(i), device="xla"))
        w.mul_(0.5)  # a Python scalar that is the same every step
        w.add_(i * 0.1)  # a Python scalar that changes every step: lifted, no recompile
        spmdtorch.sync()
    assert debug.counter_value("UncachedCompile") - before == 1
    ref = torch.zeros(4)
    for i in range(10):
        ref.add_(float(i)).mul_(0.5).add_(i * 0.1)
    torch.testing.assert_close(w.cpu(), ref)


def test_shape_change_recompiles_and_logs(caplog):
    debug.log_recompiles(True)
    try:
        with caplog.at_level("INFO", logger="spmdtorch.compile"):
            for n in (13, 13, 17):
                s = (torch.ones(n, device="xla") * 7).sum()  # noqa: F841 (kept alive)
                spmdtorch.sync()
    finally:
        debug.log_recompiles(False)
    msgs = [r.getMessage() for r in caplog.records if "recompiling" in r.getMessage()]
    assert msgs, "expected a recompilation log line"
    assert any("shape" in m or "structure" in m for m in msgs)


def test_updated_buffers_are_donated():
    model = torch.nn.Linear(64, 64).to("xla")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 64).to("xla")
    for _ in range(2):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        spmdtorch.sync()
    old = read_value(model.weight)
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    spmdtorch.sync(wait=True)
    # The step overwrote the weight in place: its old buffer was donated to the
    # program (so parameters are not held twice), not kept alive beside the new one.
    assert old.is_deleted()
    assert not read_value(model.weight).is_deleted()


def test_wait_device_ops():
    x = torch.randn(64, 64, device="xla")
    for _ in range(3):
        x = x @ x / 64
    spmdtorch.sync()
    spmdtorch.wait_device_ops()
    assert torch.isfinite(x.cpu()).all()


_LOOP = textwrap.dedent(
    """
    import jax, numpy as np, torch, spmdtorch
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from spmdtorch.tensor.dispatch import wrap_jax_array
    assert jax.device_count() == 8
    mesh = Mesh(np.array(jax.devices()), ("x",))
    # Row-sharded data: every step's program all-gathers across the 8 devices.
    w = wrap_jax_array(jax.device_put(np.ones((256, 256), np.float32), NamedSharding(mesh, P("x"))))
    outs = []
    for i in range(1000):
        outs.append((w @ w.t()).sum(0) * i)  # never read
        spmdtorch.sync()
    print("done", len(outs))
    """
)


def test_thousand_steps_without_reading_never_deadlock():
    """The CPU-collective deadlock (docs/design.md, hazard "CPU collective deadlock") must not hang a user's loop.

    Runs in a fresh process with XLA's default thread pool on this machine
    (NPROC unset). With the in-flight bound lifted
    (SPMDTORCH_MAX_IN_FLIGHT=100000) this same loop hangs in an all-gather
    rendezvous within seconds (checked by hand on 2 cores).
    """
    env = dict(os.environ)
    env.pop("NPROC", None)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    proc = subprocess.run([sys.executable, "-c", _LOOP], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stdout


def test_a_failed_program_does_not_poison_later_syncs(monkeypatch):
    from spmdtorch.lazy import executor

    bad = torch.ones(3, device="xla") * 5
    real = executor.run_plan

    def boom(plan, storages, recycle=frozenset(), bake=False):
        raise RuntimeError("injected compile failure")

    monkeypatch.setattr(executor, "run_plan", boom)
    with pytest.raises(RuntimeError, match="injected"):
        spmdtorch.sync()
    monkeypatch.setattr(executor, "run_plan", real)
    ok = torch.ones(2, device="xla") + 1
    spmdtorch.sync()  # unrelated work runs
    assert ok.cpu().tolist() == [2.0, 2.0]
    assert bad.cpu().tolist() == [5.0, 5.0, 5.0]  # the failed tensor is still there, computed on read


@pytest.mark.parametrize("written", [0, 1])
def test_equal_results_share_one_buffer_and_stay_independent(written):
    base = torch.arange(6.0).to("xla")
    spmdtorch.sync()
    # Two tensors computed alike: the program merges them and hands both the same buffer.
    pair = [base * 2 + 1, base * 2 + 1]
    spmdtorch.sync()
    assert read_value(pair[0]) is read_value(pair[1])
    # ...and they stay two tensors: writing one (either) leaves the other alone,
    # although the write donates buffers (the shared one must not be donated).
    a, b = pair[written], pair[1 - written]
    for _ in range(3):
        a.mul_(3)
        spmdtorch.sync(wait=True)
    assert not read_value(b).is_deleted()
    torch.testing.assert_close(b.cpu(), torch.arange(6.0) * 2 + 1)
    torch.testing.assert_close(a.cpu(), (torch.arange(6.0) * 2 + 1) * 27)


def test_shared_buffer_is_donated_only_once_every_holder_replaced_it():
    counters = [torch.zeros((), device="xla") for _ in range(4)]
    for c in counters:
        c.add_(1)
    spmdtorch.sync()
    shared = read_value(counters[0])
    assert all(read_value(c) is shared for c in counters)
    for c in counters:  # every holder replaces it: the buffer can go
        c.add_(1)
    spmdtorch.sync(wait=True)
    assert shared.is_deleted()
    assert [c.item() for c in counters] == [2.0] * 4
    assert all(read_value(c) is read_value(counters[0]) for c in counters)


def test_random_draws_are_never_merged():
    spmdtorch.manual_seed(0)
    a = torch.rand(64, device="xla")
    b = torch.rand(64, device="xla")
    spmdtorch.sync()
    assert read_value(a) is not read_value(b)
    assert not torch.equal(a.cpu(), b.cpu())


def test_queued_executions_do_not_keep_replaced_values_alive():
    """An execution waits in the in-flight queue for a while: the queue must not
    keep the values that later steps replaced (the last steps' gradients) alive,
    or every queued step would pin a copy of the gradients."""
    import jax

    shape = (37, 29)  # no other test makes arrays of this shape
    w = torch.randn(shape).to("xla").requires_grad_()
    for _ in range(6):
        w.grad = None
        (w * 3).sum().backward()
        spmdtorch.sync()
    alive = [a for a in jax.live_arrays() if a.shape == shape and not a.is_deleted()]
    assert len(alive) <= 2, f"{len(alive)} arrays of shape {shape} alive: only w and w.grad should be"
    torch.testing.assert_close(w.grad.cpu(), torch.full(shape, 3.0))
