"""``spmdtorch.step()``: a barrier on exit, with the cyclic GC paused while the step records."""

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
    if not was:
        gc.disable()


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
