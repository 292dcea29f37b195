"""Compat names in a 2-process job (2 x 4 CPU devices, the local launcher): ordinals, rendezvous, saves, xla://."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from spmdtorch.launch import launch

HERE = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 150


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
def test_compat_names_in_a_two_process_job(tmp_path):
    out = io.StringIO()
    result = launch(
        [str(HERE / "multiprocess_compat.py"), str(tmp_path)],
        nprocs=2,
        devices_per_proc=4,
        out=out,
        timeout_s=LAUNCH_TIMEOUT_S,
        grace_period_s=5.0,
    )
    text = out.getvalue()
    tail = "\n".join(line for line in text.splitlines() if "[Gloo]" not in line)[-4000:]
    assert result.returncode == 0, tail
    reports = {}
    for line in text.splitlines():
        if line.startswith("[rank ") and "] RESULT " in line:
            reports[int(line[len("[rank ") : line.index("]")])] = json.loads(line.split("] RESULT ", 1)[1])
    assert sorted(reports) == [0, 1], tail
    for rank, rep in reports.items():
        assert rep["names"] == [2, rank, 2, 8]
        assert rep["master"] == [rank == 0, 2, rank]
        assert rep["rendezvous"] == ["rank0", "rank1rank1"]
        assert rep["mesh_reduce"] == 3
        assert rep["all_reduce_error"].startswith("xm.all_reduce reduces across")
        assert rep["gloo"] == [rank, 2, [0, 1]]
    torch.testing.assert_close(torch.load(tmp_path / "xm.pt")["t"], torch.arange(16.0).reshape(8, 2))
    import torch_xla.utils.serialization as xser

    loaded = xser.load(str(tmp_path / "xser.pt"))
    assert loaded["step"] == 3
    torch.testing.assert_close(loaded["t"], torch.arange(16.0).reshape(8, 2))
