"""``torch_xla.utils.serialization`` (``xser``): streamed save/load in PyTorch/XLA's file layout.

``save(data, path)`` writes ``path`` (``torch.save`` of ``data`` with each xla
tensor replaced by a ``TensorReference``) and one file per xla tensor in
``path + '.tensors/tensor_<i>.pt'``, moving one tensor at a time to the CPU,
as PyTorch/XLA does; ``load(path)`` gives the data back with CPU tensors.
Files written by PyTorch/XLA's ``xser.save`` load here (with the compatibility
layer installed) and the reverse.
"""

from __future__ import annotations

import os
import pickle
import shutil
import stat
from typing import Any

import torch
import torch.utils._pytree as pytree

import spmdtorch
from spmdtorch.checkpoint import CheckpointCorruptionError
from spmdtorch.compat import _xla_model as xm

__all__ = ["TensorReference", "load", "save"]


class TensorReference:
    """Stands for tensor ``tid`` of the ``.tensors`` folder."""

    def __init__(self, tid: int) -> None:
        self.tid = tid


# Pickled under PyTorch/XLA's name, so files are interchangeable with its xser.
TensorReference.__module__ = "torch_xla.utils.serialization"


def _tensors_folder(path: str) -> str:
    return path + ".tensors"


def _tensor_file(folder: str, tid: int) -> str:
    return os.path.join(folder, f"tensor_{tid}.pt")


def save(data: Any, path: str, master_only: bool = True, global_master: bool = False) -> None:
    """Saves ``data`` to ``path``, streaming its xla tensors one at a time (every process must call it)."""
    write = not master_only or xm.is_master_ordinal(local=not global_master)
    folder = _tensors_folder(path)
    if write:
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        os.mkdir(folder)
    spmdtorch.sync(wait=True)
    count = [0]

    def replace(x: Any) -> Any:
        if not (isinstance(x, torch.Tensor) and xm.is_xla_tensor(x)):
            return x
        tid = count[0]
        count[0] += 1
        cpu = x.cpu()  # every process reads (a collective when x spans hosts)
        if write:
            torch.save(cpu, _tensor_file(folder, tid))
        return TensorReference(tid)

    ref_data = pytree.tree_map(replace, data)
    if write:
        torch.save(ref_data, path)


def _regular_file(path: str, what: str) -> None:
    """Refuse ``path`` unless it is a regular file (or a link to one), without opening it.

    ``os.stat`` never blocks; opening a FIFO planted in place of a file
    would wait for a writer forever.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        raise CheckpointCorruptionError(f"xser.load: {what} {path} cannot be read ({type(e).__name__}: {e})") from e
    if not stat.S_ISREG(mode):
        raise CheckpointCorruptionError(
            f"xser.load: {what} {path} is not a regular file (a directory, FIFO, socket or device); "
            "give the file xser.save wrote"
        )


def _tensor_id(ref: TensorReference, path: str) -> int:
    """The reference's tensor number, refused unless it is what :func:`save` writes: an int >= 0.

    The number becomes a file name inside ``path + '.tensors'``; a string
    such as ``'x/../../../outside/secret'`` would read a file from anywhere.
    """
    tid = getattr(ref, "tid", None)
    if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
        raise CheckpointCorruptionError(
            f"xser.load: {path}: field TensorReference.tid is {tid!r:.120}; xser.save numbers tensors 0, 1, 2... "
            f"(files {os.path.basename(_tensors_folder(path))}/tensor_<n>.pt), so the file was altered: "
            "load an unaltered copy"
        )
    return tid


def load(path: str) -> Any:
    """Loads what :func:`save` wrote: the data with CPU tensors.

    Only plain data and tensors are unpickled (``weights_only=True``, with
    ``TensorReference`` allowed), and each reference must be a tensor number
    of ``path + '.tensors'``, so an altered file cannot run code or read
    files outside its tensors folder.

    Raises:
        spmdtorch.checkpoint.CheckpointCorruptionError: ``path`` or a tensor
            file is missing, not a regular file, or not what ``save`` writes;
            the message names the file and the field.
    """
    path = os.fspath(path)
    _regular_file(path, "file")
    try:
        with torch.serialization.safe_globals([TensorReference]):
            ref_data = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as e:  # weights_only refused an object: not what save writes
        raise CheckpointCorruptionError(
            f"xser.load: {path} holds objects other than data, tensors and TensorReferences "
            f"({str(e).splitlines()[0][:200]}); only files written by xser.save load"
        ) from e
    folder = _tensors_folder(path)

    def resolve(x: Any) -> Any:
        if isinstance(x, TensorReference):
            file = _tensor_file(folder, _tensor_id(x, path))
            _regular_file(file, "tensor file")
            return torch.load(file, weights_only=True)
        return x

    return pytree.tree_map(resolve, ref_data, is_leaf=lambda x: isinstance(x, TensorReference))
