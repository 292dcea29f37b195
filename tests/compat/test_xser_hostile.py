"""compat's ``xser.load`` on altered files (issue 42, item 9): references stay in the tensors folder.

A ``TensorReference.tid`` becomes a file name under ``path + '.tensors'``;
an altered one must not read a file from elsewhere, and a FIFO in place of
a file must be refused without blocking.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import torch

from spmdtorch.checkpoint import CheckpointCorruptionError


def _saved(tmp_path: Any) -> str:
    import torch_xla.utils.serialization as xser

    path = str(tmp_path / "ckpt" / "state.pt")
    os.makedirs(os.path.dirname(path))
    xser.save({"w": torch.arange(4.0, device="xla"), "step": 3}, path)
    return path


def _rewrite_tid(path: str, tid: Any) -> None:
    import torch_xla.utils.serialization as xser

    torch.save({"w": xser.TensorReference(tid), "step": 3}, path)


def test_round_trip_still_loads(tmp_path):
    import torch_xla.utils.serialization as xser

    path = _saved(tmp_path)
    got = xser.load(path)
    assert got["step"] == 3
    assert torch.equal(got["w"], torch.arange(4.0))


@pytest.mark.parametrize("tid", ["x/../../../outside/secret", "0", -1, True, 1.0, None])
def test_reference_that_is_not_a_tensor_number_is_refused(tmp_path, tid):
    import torch_xla.utils.serialization as xser

    path = _saved(tmp_path)
    # A tensor the altered reference could reach: <tmp>/outside/secret.pt.
    os.makedirs(tmp_path / "outside")
    torch.save(torch.full((2,), 42.0), tmp_path / "outside" / "secret.pt")
    os.makedirs(path + ".tensors/tensor_x")  # so that tensor_x/../../../outside resolves on the way out
    _rewrite_tid(path, tid)
    with pytest.raises(
        CheckpointCorruptionError, match=r"field TensorReference\.tid is .*xser\.save numbers tensors"
    ) as info:
        xser.load(path)
    assert path in str(info.value)


def test_pickled_objects_are_refused(tmp_path):
    import torch_xla.utils.serialization as xser

    path = str(tmp_path / "state.pt")
    torch.save({"w": _Payload()}, path)
    with pytest.raises(CheckpointCorruptionError, match=r"holds objects other than data, tensors and TensorReferences"):
        xser.load(path)


class _Payload:
    """An object whose unpickling weights_only refuses."""


def _no_block(fn: Any) -> BaseException | None:
    out: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out.append(e)
        else:
            out.append(None)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "xser.load blocked on a FIFO"
    return out[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_fifos_are_refused_without_blocking(tmp_path):
    import torch_xla.utils.serialization as xser

    path = _saved(tmp_path)
    tensor_file = path + ".tensors/tensor_0.pt"
    os.unlink(tensor_file)
    os.mkfifo(tensor_file)
    err = _no_block(lambda: xser.load(path))
    assert isinstance(err, CheckpointCorruptionError) and f"tensor file {tensor_file} is not a regular file" in str(err)

    fifo = str(tmp_path / "fifo.pt")
    os.mkfifo(fifo)
    err = _no_block(lambda: xser.load(fifo))
    assert isinstance(err, CheckpointCorruptionError) and f"file {fifo} is not a regular file" in str(err)
