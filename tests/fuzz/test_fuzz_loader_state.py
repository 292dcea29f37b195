"""Fuzzed ``MpDeviceLoader.load_state_dict`` states: the same batches, or a named error that changes nothing.

A state is saved part-way through an epoch of a shuffled loader (a
``RandomSampler`` with its own generator, so the order depends on both the
global and the sampler's generator). Each example then breaks it in one
structure-aware way (a key dropped or added, an int replaced by a wrong type,
a negative or huge count, a generator state of the wrong dtype, size or
content, a size that no longer matches) or leaves it alone, and resumes a new
loader from it. Then:

* a state that is whole: the resumed loader yields exactly the batches the
  uninterrupted loader yielded after the save;
* otherwise ``load_state_dict`` or the next ``iter()`` raises
  :class:`~spmdtorch.data.LoaderStateError` (never a bare ``RuntimeError``,
  ``KeyError``, ``TypeError``...), and the global generator is as it was.

The default tier runs a fixed sample of cases; ``-m slow`` runs more, random.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from spmdtorch.data import LoaderStateError, MpDeviceLoader

FAST = settings(
    max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
SLOW = settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))

N_SAMPLES, BATCH, TAKEN = 20, 2, 3


def _loader() -> torch.utils.data.DataLoader:
    gen = torch.Generator().manual_seed(7)
    data = torch.arange(float(N_SAMPLES))
    return torch.utils.data.DataLoader(
        data, batch_size=BATCH, sampler=torch.utils.data.RandomSampler(data, generator=gen)
    )


def _saved() -> tuple[dict[str, Any], list[list[float]]]:
    """A state saved after TAKEN batches, and the batches an uninterrupted run yields after it."""
    torch.manual_seed(0)
    loader = MpDeviceLoader(_loader(), "xla")
    it = iter(loader)
    for _ in range(TAKEN):
        next(it)
    state = loader.state_dict()
    return state, [b.cpu().tolist() for b in it]


def _rng_tensor(draw, like: torch.Tensor) -> torch.Tensor:
    kind = draw(st.sampled_from(["shorter", "longer", "float", "zeros", "random"]))
    if kind == "shorter":
        return like[: draw(st.integers(0, like.numel() - 1))].clone()
    if kind == "longer":
        return torch.cat([like, torch.zeros(draw(st.integers(1, 64)), dtype=like.dtype)])
    if kind == "float":
        return like.float()
    if kind == "zeros":
        return torch.zeros_like(like)
    seed = draw(st.integers(0, 2**16))
    return torch.randint(0, 256, like.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@st.composite
def broken(draw, state: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(what was done, the state)``; ``"none"`` leaves it whole."""
    s = dict(state)
    what = draw(
        st.sampled_from(
            ["none", "drop", "extra", "int_type", "int_value", "torch_rng", "generator", "generators", "sizes"]
        )
    )
    ints = ["epochs", "batches", "finished", "dataset_len", "loader_len"]
    if what == "drop":
        del s[draw(st.sampled_from(sorted(s)))]
    elif what == "extra":
        s[draw(st.sampled_from(["extra", "epoch", "rng"]))] = 1
    elif what == "int_type":
        s[draw(st.sampled_from(ints))] = draw(st.sampled_from([1.5, "3", None, [1], True, torch.tensor([1, 2])]))
    elif what == "int_value":
        s[draw(st.sampled_from(ints))] = draw(st.sampled_from([-5, -2, 10**6, 2**40]))
    elif what == "torch_rng":
        s["torch_rng"] = _rng_tensor(draw, state["torch_rng"])
    elif what == "generator":
        s["generators"] = {"0": _rng_tensor(draw, state["generators"]["0"])}
    elif what == "generators":
        s["generators"] = draw(st.sampled_from([{}, {"1": state["generators"]["0"]}, [state["generators"]["0"]], None]))
    elif what == "sizes":
        key = draw(st.sampled_from(["dataset_len", "loader_len"]))
        s[key] = state[key] + draw(st.sampled_from([-1, 1, 7]))
    return what, s


def _check(what: str, state: dict[str, Any], expected: list[list[float]]) -> None:
    event(what)
    before = torch.get_rng_state()
    loader = MpDeviceLoader(_loader(), "xla")
    try:
        loader.load_state_dict(state)
        got = [b.cpu().tolist() for b in loader]
    except LoaderStateError:
        assert torch.equal(torch.get_rng_state(), before), "a refused state changed the global generator"
        return
    # Accepted: it must resume exactly (a whole state, or a change that does not matter).
    assert got == expected, f"{what}: resumed {got}, expected {expected}"


SAVED, EXPECTED = None, None


def _fixture() -> tuple[dict[str, Any], list[list[float]]]:
    global SAVED, EXPECTED
    if SAVED is None:
        SAVED, EXPECTED = _saved()
    return SAVED, EXPECTED


@FAST
@given(data=st.data())
def test_resume_state_restores_exactly_or_raises_named_error(devices8, data):
    state, expected = _fixture()
    what, s = data.draw(broken(state))
    _check(what, s, expected)


@pytest.mark.slow
@SLOW
@given(data=st.data())
def test_resume_state_restores_exactly_or_raises_named_error_slow(devices8, data):
    state, expected = _fixture()
    what, s = data.draw(broken(state))
    _check(what, s, expected)
