"""The Hugging Face weights layout: which tensor lives in which safetensors file.

A model directory holds either one ``model.safetensors`` or an index
``model.safetensors.index.json`` (``{"metadata": {"total_size": ...},
"weight_map": {name: file}}``) and its shards ``model-00001-of-0000N.safetensors``.
Shards are filled greedily in ``state_dict`` order, as ``save_pretrained``
(``huggingface_hub.split_torch_state_dict_into_shards``) does: a new shard
starts when the next tensor would push the current one past
``max_shard_size``; a tensor larger than that gets a shard of its own. So a
directory saved with the same ``max_shard_size`` has the same weight map.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence

from spmdtorch import _checks
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentError,
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    NotACheckpointError,
)

__all__ = ["INDEX_NAME", "WEIGHTS_NAME", "HfLayout", "parse_size", "read_layout", "shard_file_names", "split_shards"]

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
# huggingface_hub's units: decimal, as in "5GB" = 5 * 10**9 bytes.
_UNITS = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([KMGT]B)\s*$", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class HfLayout:
    """Where each tensor of a Hugging Face model directory is stored.

    Attributes:
        directory: the model directory.
        files: shard file name -> the tensor names it holds, in file order.
        indexed: the directory has ``model.safetensors.index.json``.
    """

    directory: str
    files: Mapping[str, tuple[str, ...]]
    indexed: bool

    def path(self, file: str) -> str:
        """The full path of one shard file."""
        return os.path.join(self.directory, file)

    def names(self) -> list[str]:
        """Every tensor name, shard by shard."""
        return [name for names in self.files.values() for name in names]


def parse_size(size: int | str, func: str = "save_pretrained") -> int:
    """Bytes in ``size``: an int, or a string like ``"5GB"`` / ``"200MB"`` (decimal units, as Hugging Face).

    Raises:
        CheckpointArgumentError: ``size`` is not a positive int or such a
            string (``CheckpointArgumentTypeError`` for a wrong type); the
            message names ``func``'s ``max_shard_size``.

    Example:
        >>> parse_size("5MB"), parse_size(1024)
        (5000000, 1024)
    """
    expected = "a positive int (bytes) or a string like '5GB', '200MB', '10KB'"
    if not _checks.is_int(size) and not isinstance(size, str):
        _checks.fail(CheckpointArgumentTypeError, func, "max_shard_size", expected, size)
    if isinstance(size, str):
        m = _SIZE.match(size)
        n = 0 if m is None else int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    else:
        n = int(size)
    if n < 1:
        _checks.fail(CheckpointArgumentError, func, "max_shard_size", expected, size)
    return n


def _header_names(path: str) -> tuple[str, ...]:
    from safetensors import safe_open

    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            return tuple(f.keys())
    except Exception as e:  # safetensors raises its own SafetensorError on a bad header
        raise CheckpointCorruptionError(f"{path} is not a readable safetensors file ({type(e).__name__}: {e})") from e


def _shard_name(file: object, name: str, index_path: str) -> str:
    """``file`` if it names a file inside the model directory, else a named corruption error.

    The names are constrained, not where they lead: a shard that is a
    symbolic link (the Hugging Face cache's ``snapshots/<rev>/x`` ->
    ``blobs/<hash>``) still loads, but a name that is absolute or climbs out
    with ``..`` would read weights from anywhere on the machine.
    """
    field = f"weight_map[{name!r}]"
    if not isinstance(file, str) or not file:
        raise CheckpointCorruptionError(
            f"{index_path}: field {field} must be a shard file name (a non-empty string), got {file!r:.80}"
        )
    parts = re.split(r"[\\/]", file)
    if (
        "\0" in file
        or os.path.isabs(file)
        or os.path.splitdrive(file)[0]
        or file.startswith(("/", "\\"))
        or ".." in parts
    ):
        raise CheckpointCorruptionError(
            f"{index_path}: field {field} is {file!r:.120}, which is not a file name inside the model directory "
            "(absolute, or climbing out with '..'); shard names are relative to the directory holding the index. "
            "Fix the index, or copy the shards next to it and name them there"
        )
    return file


def _refuse_special(path: str) -> None:
    """Refuse a FIFO, socket or device where a file is expected: opening it could block forever.

    ``os.stat`` follows symbolic links (linked shards load) and never blocks.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # absent (or a dangling link): reported as absent by the caller
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise CheckpointCorruptionError(
            f"{path} is not a regular file (a FIFO, socket or device); a model directory holds regular files "
            "(or links to them): replace it with the real file"
        )


def read_layout(directory: str | os.PathLike[str]) -> HfLayout:
    """Read a model directory's index (or its single ``model.safetensors``).

    Raises:
        NotACheckpointError: the directory has neither file, or the index names
            a shard that is not there.
        CheckpointCorruptionError: the index is not valid JSON with a ``weight_map``
            of names to files inside ``directory``, or a file is not a
            regular file (a FIFO...); the message names the file and field.
    """
    directory = os.fspath(directory)
    index_path = os.path.join(directory, INDEX_NAME)
    single = os.path.join(directory, WEIGHTS_NAME)
    for special in (index_path, single):
        _refuse_special(special)
    if os.path.isfile(index_path):
        try:
            with open(index_path, encoding="utf-8") as f:
                index = json.load(f)
        except (ValueError, OSError, RecursionError) as e:
            raise CheckpointCorruptionError(
                f"{index_path} is not a Hugging Face index (a JSON object with a 'weight_map' of tensor name "
                f"-> shard file): {type(e).__name__}: {e}"
            ) from e
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise CheckpointCorruptionError(
                f"{index_path}: field weight_map must be an object of tensor name -> shard file, got "
                f"{type(weight_map).__name__ if isinstance(index, dict) and 'weight_map' in index else 'nothing'}"
            )
        files: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            files.setdefault(_shard_name(file, name, index_path), []).append(str(name))
        for file in files:
            _refuse_special(os.path.join(directory, file))
        absent = [file for file in files if not os.path.isfile(os.path.join(directory, file))]
        if absent:
            raise NotACheckpointError(
                f"{index_path} names shard file(s) {absent[:5]} that {directory} does not hold; "
                "copy the complete model directory"
            )
        return HfLayout(directory, {file: tuple(names) for file, names in files.items()}, indexed=True)
    if os.path.isfile(single):
        return HfLayout(directory, {WEIGHTS_NAME: _header_names(single)}, indexed=False)
    found = "does not exist" if not os.path.isdir(directory) else f"holds neither {INDEX_NAME} nor {WEIGHTS_NAME}"
    raise NotACheckpointError(
        f"{directory} {found}: give the directory that save_pretrained wrote (sharded weights and their index, "
        "or one model.safetensors); a PyTorch pytorch_model.bin directory must be re-saved as safetensors first"
    )


def split_shards(sizes: Sequence[tuple[str, int]], max_shard_size: int) -> list[list[str]]:
    """Group ``(name, nbytes)`` into shards, greedily in order, as ``save_pretrained`` does.

    Example:
        >>> split_shards([("a", 6), ("b", 6), ("c", 2), ("d", 12), ("e", 2)], 10)
        [['a'], ['d'], ['b', 'c', 'e']]
    """
    shards: list[list[str]] = []
    current: list[str] = []
    current_size = 0
    for name, nbytes in sizes:
        if nbytes > max_shard_size:  # its own shard; the current one stays open
            shards.append([name])
            continue
        if current_size + nbytes > max_shard_size:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += nbytes
    if current:
        shards.append(current)
    return shards


def shard_file_names(n: int) -> list[str]:
    """The file names ``save_pretrained`` gives ``n`` shards."""
    if n == 1:
        return [WEIGHTS_NAME]
    return [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
