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
import shutil
from typing import Any

import torch
import torch.utils._pytree as pytree

import spmdtorch
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


def load(path: str) -> Any:
    """Loads what :func:`save` wrote: the data with CPU tensors."""
    with torch.serialization.safe_globals([TensorReference]):
        ref_data = torch.load(path)
    folder = _tensors_folder(path)

    def resolve(x: Any) -> Any:
        if isinstance(x, TensorReference):
            return torch.load(_tensor_file(folder, x.tid))
        return x

    return pytree.tree_map(resolve, ref_data, is_leaf=lambda x: isinstance(x, TensorReference))
