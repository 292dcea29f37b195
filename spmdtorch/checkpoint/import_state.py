"""Load a plain torch/safetensors state_dict into a sharded model, one tensor at a time.

Each source tensor is read alone (``safetensors.safe_open`` reads one tensor;
a torch file is memory-mapped), checked against the parameter it replaces,
and placed straight into that parameter's sharding: ``jax.device_put`` of a
host array with a sharding copies to each device only its own block, so no
device ever holds a replicated copy of a sharded parameter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy.typing as npt
import torch

from spmdtorch import _checks, _dtypes
from spmdtorch.checkpoint import placement
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentTypeError,
    DtypeMismatchError,
    MissingKeysError,
    NotACheckpointError,
    ShapeMismatchError,
    UnexpectedKeysError,
    UnsupportedValueError,
)
from spmdtorch.lazy import executor
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = ["import_state_dict"]


class _SafetensorsSource:
    def __init__(self, path: str) -> None:
        from safetensors import safe_open

        self._file = safe_open(os.fspath(path), framework="pt", device="cpu")
        self._keys = list(self._file.keys())

    def keys(self) -> list[str]:
        return self._keys

    def get(self, key: str) -> Any:
        return self._file.get_tensor(key)


class _MappingSource:
    def __init__(self, mapping: Mapping[str, Any]) -> None:
        self._map = mapping

    def keys(self) -> list[str]:
        return list(self._map.keys())

    def get(self, key: str) -> Any:
        return self._map[key]


def _open(source: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[_SafetensorsSource | _MappingSource, str]:
    if isinstance(source, Mapping):
        return _MappingSource(source), "the given state_dict"
    if not isinstance(source, (str, os.PathLike)) or isinstance(source, bytes):
        _checks.fail(
            CheckpointArgumentTypeError,
            "import_state_dict",
            "file_or_dict",
            "a state_dict (a Mapping) or the path of a safetensors / torch file",
            source,
        )
    path = os.fspath(source)
    if not os.path.isfile(path):
        raise NotACheckpointError(f"import_state_dict: file_or_dict {path} is not a file")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:2] == b"PK":  # torch's zip format; mmap keeps host memory to what is touched
        return _MappingSource(torch.load(path, map_location="cpu", mmap=True, weights_only=True)), path
    return _SafetensorsSource(path), path


def _host(t: torch.Tensor, dtype: torch.dtype) -> npt.NDArray[Any]:
    """``t`` as a numpy array of the device storage dtype for torch ``dtype``."""
    t = t.detach().to(dtype)
    storage = _dtypes.to_torch_dtype(_dtypes.to_jax_dtype(dtype))
    return placement.host_array(t.to(storage) if storage != dtype else t)


def import_state_dict(
    file_or_dict: str | os.PathLike[str] | Mapping[str, Any],
    model: torch.nn.Module,
    *,
    strict: bool = True,
    cast: bool = False,
) -> tuple[list[str], list[str]]:
    """Copy a plain state_dict into ``model``'s tensors, keeping their shardings.

    Args:
        file_or_dict: a ``.safetensors`` file, a ``torch.save``'d state_dict
            file, or a mapping of name → CPU tensor.
        model: the (sharded) module to fill; its ``state_dict()`` keys are the targets.
        strict: every key must match (otherwise unmatched keys are skipped).
        cast: convert dtypes (otherwise a dtype mismatch raises).

    Returns:
        ``(missing_keys, unexpected_keys)``: lists, empty when ``strict``.

    Raises:
        MissingKeysError, UnexpectedKeysError, ShapeMismatchError, DtypeMismatchError.

    Example:
        >>> import torch, spmdtorch
        >>> src = torch.nn.Linear(4, 2)
        >>> model = torch.nn.Linear(4, 2).to("xla")
        >>> import_state_dict(src.state_dict(), model)
        ([], [])
        >>> torch.equal(model.weight.cpu(), src.weight.detach())
        True
    """
    _checks.check_instance(
        model, torch.nn.Module, "import_state_dict", "model", CheckpointArgumentTypeError, "a torch.nn.Module"
    )
    strict = _checks.check_bool(strict, "import_state_dict", "strict", CheckpointArgumentTypeError)
    cast = _checks.check_bool(cast, "import_state_dict", "cast", CheckpointArgumentTypeError)
    source, where = _open(file_or_dict)
    executor.sync()
    targets = model.state_dict()
    src_keys = set(source.keys())
    missing = [k for k in targets if k not in src_keys]
    unexpected = [k for k in source.keys() if k not in targets]  # noqa: SIM118 - not a dict
    if strict and missing:
        raise MissingKeysError(
            f"{where} has no entry for {len(missing)} key(s) of {type(model).__name__}: {missing[:10]}; "
            "pass strict=False to leave them unchanged",
            missing,
        )
    if strict and unexpected:
        raise UnexpectedKeysError(
            f"{where} has {len(unexpected)} key(s) that {type(model).__name__} does not: {unexpected[:10]}; "
            "pass strict=False to skip them",
            unexpected,
        )
    for key, target in targets.items():
        if key not in src_keys:
            continue
        src = source.get(key)
        if not isinstance(src, torch.Tensor):
            raise UnsupportedValueError(f"{where}[{key!r}] is a {type(src).__name__}, not a tensor")
        if tuple(src.shape) != tuple(target.shape):
            raise ShapeMismatchError(
                f"{where}[{key!r}] has shape {tuple(src.shape)}, {type(model).__name__}.{key} has shape "
                f"{tuple(target.shape)}; build the model with the source's configuration"
            )
        if src.dtype != target.dtype and not cast:
            raise DtypeMismatchError(
                f"{where}[{key!r}] has dtype {src.dtype}, {type(model).__name__}.{key} is {target.dtype}; "
                "pass cast=True to convert"
            )
        if isinstance(target, XlaTensor):
            layout = placement.layout_of(target, (key,))
            placement.install(target, placement.device_put(_host(src, target.dtype), layout))
        else:
            with torch.no_grad():
                target.copy_(src)
        del src
    return missing, unexpected
