"""SPMDLoadPlanner never unpickles code (issue 42, item 8).

DCP stores non-tensor entries as pickles, and torch's ``DefaultLoadPlanner``
loads them with ``weights_only=False``: a planted entry runs whatever its
pickle names. ``SPMDLoadPlanner`` loads them with ``weights_only=True``;
an entry that needs more is refused by name, before its code runs.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dist_cp
from torch.distributed.checkpoint.api import CheckpointException

import spmdtorch.checkpoint.distributed_checkpoint as xc
from spmdtorch.checkpoint import UnsafeEntryError

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

RAN: list[str] = []


def _side_effect(what: str) -> str:
    RAN.append(what)
    return what


class Planted:
    """Unpickles by calling a function of the file's choosing (here a harmless one)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (_side_effect, ("code ran while loading",))


def _failures(err: CheckpointException) -> list[BaseException]:
    # DCP keeps (exception, traceback summary) per rank.
    return [f[0] if isinstance(f, tuple) else f for f in err.failures.values()]


def test_plain_entries_load_and_a_planted_pickle_is_refused_unrun(devices8, tmp_path):
    w = torch.arange(6.0).reshape(2, 3)
    plain = {"w": w.to("xla"), "step": 7, "name": "run", "hp": {"lr": 0.1, "betas": [0.9, 0.99]}, "cpu": torch.ones(2)}
    dist_cp.save(plain, checkpoint_id=str(tmp_path / "plain"), planner=xc.SPMDSavePlanner())
    target = {"w": torch.zeros(2, 3, device="xla"), "step": 0, "name": "", "hp": {"lr": 0.0, "betas": [0.0, 0.0]}}
    target["cpu"] = torch.zeros(2)
    dist_cp.load(target, checkpoint_id=str(tmp_path / "plain"), planner=xc.SPMDLoadPlanner())
    assert target["step"] == 7 and target["name"] == "run" and target["hp"] == {"lr": 0.1, "betas": [0.9, 0.99]}
    assert torch.equal(target["w"].cpu(), w) and torch.equal(target["cpu"], torch.ones(2))

    dist_cp.save({"w": w.to("xla"), "extra": Planted()}, checkpoint_id=str(tmp_path / "bad"))
    RAN.clear()
    with pytest.raises(CheckpointException) as info:  # DCP wraps every planner error per rank
        dist_cp.load(
            {"w": torch.zeros(2, 3, device="xla"), "extra": None},
            checkpoint_id=str(tmp_path / "bad"),
            planner=xc.SPMDLoadPlanner(),
        )
    (err,) = _failures(info.value)
    assert isinstance(err, UnsafeEntryError)
    assert "'extra'" in str(err) and "weights_only=True" in str(err) and "_side_effect" in str(err)
    assert RAN == []  # refused before the pickle's function was called
    # torch's own planner runs it: what the refusal prevents.
    dist_cp.load({"extra": None}, checkpoint_id=str(tmp_path / "bad"))
    assert RAN == ["code ran while loading"]
