"""``spmdtorch.step()``: a barrier on exit, with the cyclic GC paused while the step records (and ``spmdtorch.compile`` while it traces)."""

import gc

import pytest
import torch

import spmdtorch
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.tensor.dispatch import read_value


@pytest.fixture
def gc_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()  # as it was, whatever the test left


def test_gc_is_paused_inside_and_restored_after(gc_enabled):
    w = torch.ones(3, device="xla")
    with spmdtorch.step():
        assert not gc.isenabled()
        w.mul_(2)
    assert gc.isenabled()
    assert not isinstance(read_value(w), LazyRef)
    assert w.cpu().tolist() == [2.0, 2.0, 2.0]


def test_gc_is_restored_when_the_body_raises(gc_enabled):
    with pytest.raises(ValueError, match="boom"), spmdtorch.step():
        raise ValueError("boom")
    assert gc.isenabled()


def test_nested_steps_restore_only_at_the_outermost(gc_enabled):
    with spmdtorch.step():
        with spmdtorch.step():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pause_gc_false_and_a_disabled_gc_are_left_alone(gc_enabled):
    with spmdtorch.step(pause_gc=False):
        assert gc.isenabled()
    gc.disable()
    with spmdtorch.step():
        pass
    assert not gc.isenabled()  # the user's choice stands


def test_compile_pauses_gc_while_it_traces_and_restores_it(gc_enabled):
    # A trace records and compiles a whole step, as step() does (spmdtorch.lazy._gc).
    w = torch.zeros(3, device="xla")
    seen = []

    @spmdtorch.compile
    def step(x):
        seen.append(gc.isenabled())
        w.add_(x)
        return w.sum()

    for _ in range(4):
        out = step(torch.ones(3, device="xla"))
        assert gc.isenabled()
    assert seen and not any(seen), seen  # traced with the collector paused, every time
    assert out.item() == 12.0


def test_compile_restores_gc_when_the_trace_raises(gc_enabled):
    @spmdtorch.compile
    def step(x):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        step(torch.ones(3, device="xla"))
    assert gc.isenabled()
    gc.disable()
    with pytest.raises(ValueError, match="boom"):
        step(torch.ones(3, device="xla"))
    assert not gc.isenabled()  # a disabled collector stays disabled


def _garbage_cycle_step(**step_kwargs):
    """A step that makes a pending tensor only a reference cycle holds, then its program's output shapes."""
    spmdtorch.debug.clear_caches()  # last_executable is the program compiled last: compile this one
    w = torch.ones(5, 7, device="xla")
    spmdtorch.sync()
    with spmdtorch.step(**step_kwargs):
        junk = w.t() * 3  # (7, 5): no live tensor has this shape
        junk.cycle = junk  # only the cyclic collector frees it
        del junk
        out = w.sum(0) + 1
    assert out.cpu().tolist() == [6.0] * 7
    return [tuple(o.shape) for o in spmdtorch.debug.last_executable_outputs()]


def test_cyclic_garbage_made_in_a_step_is_no_program_output(gc_enabled):
    # The paused collector would keep the cycle alive through the sync, which would then compute
    # and keep it as an output (its buffer too); the step collects the young generation first.
    gc.collect()
    assert _garbage_cycle_step() == [(7,)]
    assert gc.isenabled()


def test_nested_step_also_drops_its_cyclic_garbage(gc_enabled):
    with spmdtorch.step():
        assert _garbage_cycle_step() == [(7,)]
