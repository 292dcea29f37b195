"""MpDeviceLoader.state_dict / load_state_dict: a resumed loader yields what an uninterrupted one would."""

from __future__ import annotations

import pytest
import torch

from spmdtorch.data import LoaderStateError, MpDeviceLoader


def _data(generator=None, sampler_generator=None, num_workers=0):
    # Workers are spawned, not forked: a fork of a process running JAX's threads may deadlock.
    context = "spawn" if num_workers else None
    dataset = torch.utils.data.TensorDataset(torch.arange(40.0).reshape(20, 2))
    if sampler_generator is not None:
        sampler = torch.utils.data.RandomSampler(dataset, generator=sampler_generator)
        return torch.utils.data.DataLoader(dataset, batch_size=3, sampler=sampler)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=3,
        shuffle=True,
        generator=generator,
        num_workers=num_workers,
        multiprocessing_context=context,
    )


def _take(it, n):
    return [next(it)[0].cpu().tolist() for _ in range(n)]


def _epochs(loader, n_epochs):
    return [[b[0].cpu().tolist() for b in loader] for _ in range(n_epochs)]


@pytest.mark.parametrize("kind", ["global", "loader_generator", "sampler_generator"])
@pytest.mark.parametrize("stop_at", [0, 3, 7])
def test_resume_mid_epoch_continues_the_same_order(kind, stop_at):
    def build():
        if kind == "global":
            return _data()
        if kind == "loader_generator":
            return _data(generator=torch.Generator().manual_seed(5))
        return _data(sampler_generator=torch.Generator().manual_seed(5))

    def run_until_stop():
        # Epoch 0 whole, then `stop_at` batches of epoch 1; the training loop
        # draws from the global generator meanwhile (dropout, say).
        torch.manual_seed(0)
        loader = MpDeviceLoader(build(), "xla")
        first = _epochs(loader, 1)
        it = iter(loader)
        taken = _take(it, stop_at)
        torch.rand(3)
        return loader, it, first, taken

    loader, it, first, taken = run_until_stop()
    reference = first + [taken + [b[0].cpu().tolist() for b in it]] + _epochs(loader, 1)
    assert reference[0] != reference[1]  # shuffled: each epoch differs

    loader, it, first, taken = run_until_stop()
    state, rng = loader.state_dict(), torch.get_rng_state()

    # A new process: a fresh loader (other seeds), restored from the state.
    torch.manual_seed(123)
    resumed = MpDeviceLoader(build(), "xla")
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    rest = [b[0].cpu().tolist() for b in resumed]
    later = _epochs(resumed, 1)
    assert first + [taken + rest] + later == reference


def test_resume_leaves_the_restored_global_generator_alone():
    torch.manual_seed(0)
    loader = MpDeviceLoader(_data(), "xla")
    it = iter(loader)
    _take(it, 2)
    state, rng = loader.state_dict(), torch.get_rng_state()
    expected = torch.rand(4)

    torch.manual_seed(9)
    resumed = MpDeviceLoader(_data(), "xla")
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    next(iter(resumed))  # replays the epoch start, then puts the generator back
    assert torch.equal(torch.rand(4), expected)


def test_state_at_an_epoch_boundary_starts_the_next_epoch():
    torch.manual_seed(0)
    reference = _epochs(MpDeviceLoader(_data(), "xla"), 2)
    torch.manual_seed(0)
    loader = MpDeviceLoader(_data(), "xla")
    first = _epochs(loader, 1)
    state, rng = loader.state_dict(), torch.get_rng_state()
    assert state["finished"] == 1 and state["batches"] == len(reference[0])
    resumed = MpDeviceLoader(_data(), "xla")
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    assert first + _epochs(resumed, 1) == reference


def test_resume_with_worker_processes():
    torch.manual_seed(0)
    reference = _epochs(MpDeviceLoader(_data(num_workers=1), "xla"), 1)[0]
    torch.manual_seed(0)
    loader = MpDeviceLoader(_data(num_workers=1), "xla")
    it = iter(loader)
    taken = _take(it, 4)
    state = loader.state_dict()
    del it
    resumed = MpDeviceLoader(_data(num_workers=1), "xla")
    resumed.load_state_dict(state)
    assert taken + [b[0].cpu().tolist() for b in resumed] == reference


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: 3, "must be a dict, got int"),
        (lambda s: {k: v for k, v in s.items() if k != "batches"}, "expected"),
        (lambda s: {**s, "batches": -1}, r"state\['batches'\] must be an int >= 0, got -1"),
        (lambda s: {**s, "generators": {"0": torch.zeros(3, dtype=torch.uint8)}}, "depends on 0 torch.Generator"),
        (lambda s: {**s, "torch_rng": [1, 2]}, "not a tensor"),
    ],
)
def test_bad_state_is_a_named_error(mutate, match):
    loader = MpDeviceLoader(_data(), "xla")
    state = loader.state_dict()
    with pytest.raises(LoaderStateError, match=match):
        loader.load_state_dict(mutate(state))


def _state_after(data, batches):
    loader = MpDeviceLoader(data, "xla")
    it = iter(loader)
    taken = [next(it) for _ in range(batches)]
    assert len(taken) == batches
    return loader.state_dict()


@pytest.mark.parametrize(
    ("resume_on", "match"),
    [
        # fewer samples: the saved position may not even exist
        ((10, 2), r"saved over a loader with 30 samples \(len\(loader.dataset\)\), but this loader has 10"),
        # more samples (the case that used to resume silently, repeating and skipping samples)
        ((40, 2), r"with 30 samples .* but this loader has 40"),
        # same samples, another batch size: batch 12 is other samples
        ((30, 3), r"with 15 batches per epoch \(len\(loader\)\), but this loader has 10"),
    ],
)
def test_resuming_over_inputs_of_another_size_is_a_named_error(resume_on, match):
    state = _state_after(torch.utils.data.DataLoader(torch.arange(30.0), batch_size=2), 12)
    n, batch_size = resume_on
    other = MpDeviceLoader(torch.utils.data.DataLoader(torch.arange(float(n)), batch_size=batch_size), "xla")
    with pytest.raises(LoaderStateError, match=match):
        other.load_state_dict(state)
    assert other._resume is None  # nothing half-applied: the next iter() starts a fresh epoch


def test_a_state_saved_without_sizes_still_resumes_and_checks_what_it_can():
    # States saved before the sizes were recorded have no dataset_len/loader_len:
    # they load, and a position past the end is still caught when iterating.
    state = _state_after(torch.utils.data.DataLoader(torch.arange(30.0), batch_size=2), 12)
    old = {k: v for k, v in state.items() if k not in ("dataset_len", "loader_len")}
    same = MpDeviceLoader(torch.utils.data.DataLoader(torch.arange(30.0), batch_size=2), "xla")
    same.load_state_dict(old)
    assert [b.cpu().tolist() for b in same] == [[24.0, 25.0], [26.0, 27.0], [28.0, 29.0]]
    short = MpDeviceLoader(torch.utils.data.DataLoader(torch.arange(10.0), batch_size=2), "xla")
    short.load_state_dict(old)
    with pytest.raises(LoaderStateError, match="took 12 batches of its epoch but the loader now yields only 5"):
        iter(short)


def test_a_loader_without_length_records_no_sizes():
    def gen():
        yield from (torch.full((2,), float(i)) for i in range(6))

    state = _state_after(gen(), 2)
    assert (state["dataset_len"], state["loader_len"]) == (-1, -1)
    with pytest.raises(LoaderStateError, match=r"state\['loader_len'\] must be an int >= -1, got -2"):
        MpDeviceLoader(gen(), "xla").load_state_dict({**state, "loader_len": -2})
