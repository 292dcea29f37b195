"""Save a (sharded) model as a Hugging Face model directory, one shard file at a time.

The layout is ``save_pretrained``'s: tensors under their ``state_dict``
names (tied ones once, under the first name), grouped greedily in
``state_dict`` order into shards of at most ``max_shard_size`` bytes, an
index when there is more than one. Each shard's tensors are gathered to the
host, written and dropped before the next shard, so host memory stays about
one shard. Reading a tensor that spans several processes is a collective:
every process calls :func:`save_pretrained`, process 0 writes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

import torch
from torch import nn

from spmdtorch import _checks, runtime
from spmdtorch.checkpoint._hf_layout import (
    INDEX_NAME,
    WEIGHTS_NAME,
    HfLayout,
    parse_size,
    shard_file_names,
    split_shards,
)
from spmdtorch.checkpoint.errors import CheckpointArgumentTypeError, KeyMismatchError, UnsupportedValueError
from spmdtorch.lazy import executor

__all__ = ["save_pretrained"]

_SHARD_FILE = re.compile(r"^model-\d{5}-of-\d{5}\.safetensors$")


def _unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``state_dict`` entries, a tensor shared by several names (tied weights) under its first name only."""
    seen: set[int] = set()
    out: dict[str, torch.Tensor] = {}
    for name, t in model.state_dict(keep_vars=True).items():
        if not isinstance(t, torch.Tensor):
            raise UnsupportedValueError(
                f"{type(model).__name__}.state_dict()[{name!r}] is a {type(t).__name__}, not a tensor; "
                "safetensors stores tensors only"
            )
        if id(t) in seen:
            continue
        seen.add(id(t))
        out[name] = t
    return out


def _remove_stale(directory: str, keep: set[str]) -> None:
    """Drop weight files of an earlier save that this one does not rewrite (as save_pretrained does)."""
    for file in os.listdir(directory):
        weights = file in (WEIGHTS_NAME, INDEX_NAME) or _SHARD_FILE.match(file) is not None
        if weights and file not in keep and os.path.isfile(os.path.join(directory, file)):
            os.remove(os.path.join(directory, file))


def _write(path: str, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    tmp = path + ".tmp"
    save_file(tensors, tmp, metadata={"format": "pt"})
    os.replace(tmp, path)  # a crash never leaves a half-written shard under its real name


def save_pretrained(  # noqa: C901  (why: one pass over the state dict with a branch per option: max_shard_size, dtype, rename, save_config)
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    max_shard_size: int | str = "5GB",
    dtype: torch.dtype | None = None,
    rename: Callable[[str], str] | None = None,
    save_config: bool = True,
) -> HfLayout:
    """Write ``model``'s ``state_dict`` as ``save_pretrained`` would: safetensors shards and an index.

    A directory saved with the same ``max_shard_size`` as the one it was
    loaded from gets the same files and weight map; transformers'
    ``from_pretrained`` reads it. Call it on every process (gathering a
    sharded tensor is a collective); process 0 writes.

    Args:
        model: the module (xla, CPU, or a mix).
        directory: created if needed; weight files of an earlier save that
            this one does not rewrite are removed.
        max_shard_size: bytes per shard file, an int or a string like
            ``"5GB"``/``"200MB"`` (decimal units, as Hugging Face); a tensor
            larger than that gets a file of its own.
        dtype: write floating-point tensors in this dtype (e.g.
            ``torch.bfloat16``); None keeps the model's.
        rename: maps a model ``state_dict`` name to the name to store (the
            inverse of :func:`load_pretrained`'s ``rename``).
        save_config: also write a transformers model's ``config`` (and
            ``generation_config``) with their own ``save_pretrained``.

    Returns:
        The :class:`HfLayout` written (file -> tensor names).

    Raises:
        CheckpointArgumentError: a bad argument (``max_shard_size`` not like
            ``"5GB"``; ``CheckpointArgumentTypeError`` for a wrong type).
        KeyMismatchError: ``rename`` maps two tensors to one name.
        UnsupportedValueError: a ``state_dict`` entry that is not a tensor.

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> from safetensors.torch import load_file
        >>> d = tempfile.mkdtemp()
        >>> layout = save_pretrained(torch.nn.Linear(4, 2).to("xla"), d)
        >>> sorted(load_file(d + "/model.safetensors"))
        ['bias', 'weight']
    """
    func, err = "save_pretrained", CheckpointArgumentTypeError
    _checks.check_instance(model, nn.Module, func, "model", err, "a torch.nn.Module")
    _checks.check_path(directory, func, "directory", err)
    limit = parse_size(max_shard_size, func)
    if dtype is not None:
        _checks.check_instance(dtype, torch.dtype, func, "dtype", err, "a torch.dtype or None", "e.g. torch.bfloat16")
    if rename is not None:
        _checks.check_callable(rename, func, "rename", err)
    _checks.check_bool(save_config, func, "save_config", err)
    directory = os.fspath(directory)
    state = _unique_state(model)
    names: dict[str, str] = {}  # stored name -> model name
    for name in state:
        out = rename(name) if rename is not None else name
        if out in names:
            raise KeyMismatchError(
                f"rename maps both {names[out]!r} and {name!r} to {out!r}; map them to different names", [out]
            )
        names[out] = name

    def nbytes(t: torch.Tensor) -> int:
        width = torch.empty((), dtype=dtype if dtype is not None and t.is_floating_point() else t.dtype).element_size()
        return t.numel() * width

    shards = split_shards([(out, nbytes(state[name])) for out, name in names.items()], limit)
    files = shard_file_names(len(shards))
    writer = runtime.process_index() == 0
    if writer:
        os.makedirs(directory, exist_ok=True)
    executor.sync()  # pending values (an optimizer step) are computed once, not per tensor
    for file, members in zip(files, shards):
        tensors: dict[str, torch.Tensor] = {}
        for out in members:
            t = state[names[out]].detach()
            host = t.cpu()  # a collective when t spans several processes: every process reads
            if dtype is not None and host.is_floating_point():
                host = host.to(dtype)
            tensors[out] = host.contiguous()
        if writer:
            _write(os.path.join(directory, file), tensors)
        del tensors
    if writer:
        if len(files) > 1:
            index = {
                "metadata": {
                    "total_parameters": sum(p.numel() for p in model.parameters()),
                    "total_size": sum(nbytes(state[name]) for name in names.values()),
                },
                "weight_map": {out: file for file, members in zip(files, shards) for out in members},
            }
            with open(os.path.join(directory, INDEX_NAME + ".tmp"), "w", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
            os.replace(os.path.join(directory, INDEX_NAME + ".tmp"), os.path.join(directory, INDEX_NAME))
        _remove_stale(directory, set(files) | ({INDEX_NAME} if len(files) > 1 else set()))
        if save_config:
            for attr in ("config", "generation_config"):
                config = getattr(model, attr, None)
                save = getattr(config, "save_pretrained", None)
                if callable(save):
                    save(directory)
    return HfLayout(directory, {file: tuple(members) for file, members in zip(files, shards)}, indexed=len(files) > 1)
