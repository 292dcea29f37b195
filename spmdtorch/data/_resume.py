"""Resumable input order: what fixes an epoch's batches, and how to get back to batch ``n`` of it.

A ``torch.utils.data.DataLoader`` decides an epoch's order from random
generators when its iterator starts: the global CPU generator (a
``RandomSampler`` without a ``generator`` draws its seed from it, a loader
with workers draws their base seed), or the ``generator`` given to the loader
or to its sampler. Their states just before ``iter(loader)`` therefore fix
the epoch (for a deterministic dataset); with them and the number of batches
the training loop took, a restarted job makes the same iterator and skips
that many batches (it reads them again: correct for any loader, at the cost
of loading them).

Invariant: the generators are read and set only on the thread that calls
``iter()``, and the first batch is fetched there too, so that a sampler's
seed draw never races the training loop's own use of the global generator.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch

from spmdtorch.data.errors import LoaderStateError

__all__ = ["EpochStart", "InputSizes", "LoaderState", "order_generators"]


def order_generators(loader: Iterable[Any]) -> list[torch.Generator]:
    """The ``torch.Generator`` objects (besides the global one) that decide ``loader``'s order."""
    found: dict[int, torch.Generator] = {}
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    for owner in (loader, sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator):
            found.setdefault(id(gen), gen)
    return list(found.values())


@dataclasses.dataclass(frozen=True, slots=True)
class EpochStart:
    """The random states an epoch's iterator starts from: the global CPU generator's and the loader's own."""

    torch_rng: torch.Tensor
    generators: tuple[torch.Tensor, ...]

    @classmethod
    def capture(cls, generators: list[torch.Generator]) -> EpochStart:
        return cls(torch.get_rng_state(), tuple(g.get_state() for g in generators))

    def apply(self, generators: list[torch.Generator]) -> None:
        torch.set_rng_state(self.torch_rng)
        for g, state in zip(generators, self.generators, strict=True):
            g.set_state(state)


def _length(obj: object) -> int | None:
    if not isinstance(obj, Sized):
        return None
    try:
        return len(obj)
    except TypeError:  # an IterableDataset may define __len__ that refuses
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class InputSizes:
    """The sizes that fix which sample a batch index means: resuming with other sizes would repeat and skip samples.

    Attributes:
        dataset: ``len(loader.dataset)`` (None: the loader has no sized dataset).
        batches: ``len(loader)``, batches per epoch (None: the loader has no length).
    """

    dataset: int | None
    batches: int | None

    @classmethod
    def of(cls, loader: Iterable[Any]) -> InputSizes:
        return cls(_length(getattr(loader, "dataset", None)), _length(loader))

    def check_same(self, now: InputSizes) -> None:
        """Raises ``LoaderStateError`` when a size known at both times changed."""
        for what, saved, current in (
            ("samples (len(loader.dataset))", self.dataset, now.dataset),
            ("batches per epoch (len(loader))", self.batches, now.batches),
        ):
            if saved is not None and current is not None and saved != current:
                raise LoaderStateError(
                    f"load_state_dict: the state was saved over a loader with {saved} {what}, but this loader "
                    f"has {current}; resuming would repeat some samples and skip others. Resume with the dataset "
                    "and loader settings of the saved run, or start a new epoch without load_state_dict"
                )


@dataclasses.dataclass(frozen=True, slots=True)
class LoaderState:
    """Where a loader stands: the epoch's start, how many of its batches were taken, whether it ended."""

    epochs: int  # iterators started so far (this one included)
    batches: int  # batches of the current epoch taken by the training loop
    finished: bool  # the loop saw the current epoch end (the next iter() starts a new one)
    start: EpochStart | None  # None before the first iter()
    sizes: InputSizes = InputSizes(None, None)  # the loader's sizes when saved (None: unknown, states saved before)

    def to_dict(self) -> dict[str, Any]:
        """A checkpointable dict: ints and CPU uint8 tensors (``MpDeviceLoader.state_dict()``)."""
        start = self.start or EpochStart(torch.get_rng_state(), ())
        return {
            "epochs": self.epochs,
            "batches": self.batches,
            "finished": int(self.finished),
            "torch_rng": start.torch_rng.clone(),
            "generators": {str(i): s.clone() for i, s in enumerate(start.generators)},
            # -1: no length (ints only, so that any checkpoint format holds the state).
            "dataset_len": -1 if self.sizes.dataset is None else self.sizes.dataset,
            "loader_len": -1 if self.sizes.batches is None else self.sizes.batches,
        }

    @classmethod
    def from_dict(cls, state: object, n_generators: int) -> LoaderState:
        """Validate a dict made by :meth:`to_dict` (possibly restored from a checkpoint)."""
        fix = "pass the dict that MpDeviceLoader.state_dict() returned (restored from your checkpoint)"
        if not isinstance(state, dict):
            raise LoaderStateError(f"load_state_dict: state must be a dict, got {type(state).__name__}; {fix}")
        expected = {"epochs", "batches", "finished", "torch_rng", "generators"}
        sized = expected | {"dataset_len", "loader_len"}
        if set(state) not in (expected, sized):  # states saved before the sizes were recorded have none
            raise LoaderStateError(f"load_state_dict: state has keys {sorted(state)}, expected {sorted(sized)}; {fix}")
        ints = {}
        for key in ("epochs", "batches", "finished", "dataset_len", "loader_len"):
            if key not in state:
                ints[key] = -1
                continue
            value = state[key]
            if isinstance(value, torch.Tensor) and value.numel() == 1:
                value = int(value.item())
            low = -1 if key.endswith("_len") else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoaderStateError(f"load_state_dict: state[{key!r}] must be an int >= {low}, got {value!r}; {fix}")
            if key == "finished" and value > 1:
                raise LoaderStateError(f"load_state_dict: state['finished'] must be 0 or 1, got {value!r}; {fix}")
            ints[key] = value
        gens = state["generators"]
        if not isinstance(gens, dict) or len(gens) != n_generators:
            got = len(gens) if isinstance(gens, dict) else type(gens).__name__
            raise LoaderStateError(
                f"load_state_dict: the state holds {got} generator states but this loader's order depends on "
                f"{n_generators} torch.Generator(s) (the loader's and its sampler's `generator`); build the "
                "loader as it was when the state was saved"
            )
        names = [str(i) for i in range(n_generators)]
        if sorted(gens) != names:
            raise LoaderStateError(
                f"load_state_dict: state['generators'] has keys {sorted(gens)!r}, expected {names!r}; {fix}"
            )
        named = [("state['torch_rng']", state["torch_rng"])] + [(f"state['generators'][{n!r}]", gens[n]) for n in names]
        cpu = [_generator_state(where, t, fix) for where, t in named]
        sizes = InputSizes(*(None if ints[k] < 0 else ints[k] for k in ("dataset_len", "loader_len")))
        return cls(ints["epochs"], ints["batches"], bool(ints["finished"]), EpochStart(cpu[0], tuple(cpu[1:])), sizes)


def _generator_state(where: str, t: object, fix: str) -> torch.Tensor:
    """A saved ``torch.Generator`` state, checked: a CPU uint8 copy that a generator accepts.

    No conversion: a float tensor cast to uint8 could pass for a state and
    silently give another order. Checked on a scratch generator, so a bad
    state is refused before any generator is touched.
    """
    if not isinstance(t, torch.Tensor):
        raise LoaderStateError(f"load_state_dict: {where} is a {type(t).__name__}, not a tensor; {fix}")
    if t.dtype != torch.uint8 or t.dim() != 1:
        raise LoaderStateError(
            f"load_state_dict: {where} must be a 1-d uint8 tensor (a torch.Generator state), got "
            f"{t.dtype} of shape {tuple(t.shape)}; {fix}"
        )
    cpu = t.detach().to("cpu").clone()
    try:
        torch.Generator().set_state(cpu)
    except RuntimeError as e:
        raise LoaderStateError(f"load_state_dict: {where} is not a valid torch.Generator state ({e}); {fix}") from e
    return cpu


def _raising(error: BaseException) -> Iterator[Any]:
    raise error
    yield  # a generator: the error surfaces on the loading thread, as any loading error does


def start_epoch(
    loader: Iterable[Any], generators: list[torch.Generator], resume: LoaderState | None
) -> tuple[Iterator[Any], EpochStart, int]:
    """Start ``loader``'s next epoch on this thread: ``(batches, its start, batches skipped)``.

    With ``resume`` (a mid-epoch state), the epoch restarts from the saved
    start and skips the batches already taken. The global generator is then
    put back as it was (the training loop restores it from the same
    checkpoint); the loader's own generators stay where the replay left them,
    which is where they were when the state was saved. The first batch is
    fetched here (see the module's invariant).
    """
    skip = 0
    current: torch.Tensor | None = None
    if resume is not None and resume.start is not None and not resume.finished:
        current = torch.get_rng_state()
        resume.start.apply(generators)
        start, skip = resume.start, resume.batches
    else:
        start = EpochStart.capture(generators)
    try:
        it = iter(loader)
        for taken in range(skip):
            try:
                next(it)
            except StopIteration:
                raise LoaderStateError(
                    f"load_state_dict: the saved state took {skip} batches of its epoch but the loader now "
                    f"yields only {taken}; resume with the dataset and loader settings of the saved run"
                ) from None
        try:
            first = next(it)
        except StopIteration:
            return iter(()), start, skip
        except Exception as e:  # noqa: BLE001 - raised by the consumer, like any loading error
            return _raising(e), start, skip
        return _chain(first, it), start, skip
    finally:
        if current is not None:
            torch.set_rng_state(current)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
