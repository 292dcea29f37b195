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
from spmdtorch.checkpoint._hf_load import _ST_DTYPES
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
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
    """One safetensors file; tensor metadata from its header, data one tensor at a time."""

    def __init__(self, path: str) -> None:
        from safetensors import safe_open

        self._path = path
        try:
            self._file = safe_open(os.fspath(path), framework="pt", device="cpu")
            self._keys = list(self._file.keys())
        except Exception as e:  # safetensors' SafetensorError: a damaged or lying header
            raise self._corrupt(None, e) from e

    def _corrupt(self, key: str | None, e: Exception) -> CheckpointCorruptionError:
        field = f" (tensor {key!r})" if key is not None else " (its header)"
        return CheckpointCorruptionError(
            f"import_state_dict: {self._path}{field} cannot be read as safetensors ({type(e).__name__}: "
            f"{str(e)[:300]}); the file is damaged: copy it again",
            [key] if key is not None else [],
        )

    def keys(self) -> list[str]:
        return self._keys

    def describe(self, key: str) -> tuple[tuple[int, ...], torch.dtype | None]:
        """Shape and dtype from the header (no data read); dtype None when it has no torch name here."""
        try:
            sl = self._file.get_slice(key)
            return tuple(sl.get_shape()), _ST_DTYPES.get(sl.get_dtype())
        except Exception as e:
            raise self._corrupt(key, e) from e

    def get(self, key: str) -> Any:
        try:
            return self._file.get_tensor(key)
        except Exception as e:
            raise self._corrupt(key, e) from e


class _MappingSource:
    def __init__(self, mapping: Mapping[Any, Any]) -> None:
        self._map = mapping

    def keys(self) -> list[str]:
        return list(self._map.keys())

    def describe(self, key: str) -> tuple[tuple[int, ...], torch.dtype | None]:
        value = self._map[key]
        return (tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else ((), None)

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
    # os.path.isfile stats (never opens): a FIFO is refused here instead of blocking the read below.
    if not os.path.isfile(path):
        what = "is not a regular file" if os.path.exists(path) else "does not exist"
        raise NotACheckpointError(f"import_state_dict: file_or_dict {path} {what}")
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:2] == b"PK":  # torch's zip format; mmap keeps host memory to what is touched
        try:
            loaded = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except Exception as e:  # a damaged zip, or a pickle of more than tensors (weights_only refuses it)
            raise CheckpointCorruptionError(
                f"import_state_dict: {path} cannot be read as a torch state_dict file ({type(e).__name__}: "
                f"{_reason(e)}); only tensors and plain data are unpickled (weights_only=True): save "
                "model.state_dict(), or a safetensors file"
            ) from e
        if not isinstance(loaded, Mapping):
            raise CheckpointCorruptionError(
                f"import_state_dict: {path} holds a {type(loaded).__name__}, not a state_dict (a dict of name -> "
                "tensor); save model.state_dict()"
            )
        return _MappingSource(loaded), path
    return _SafetensorsSource(path), path


def _reason(e: BaseException) -> str:
    """The line of a torch load failure that says what was wrong (its weights_only refusal names the global)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    named = [line for line in lines if "WeightsUnpickler error" in line]
    return (named or lines or [type(e).__name__])[0][:300]


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
        MissingKeysError: checked for every key before any tensor changes
            (the model is left as it was), as are the four below.
        UnexpectedKeysError: as ``MissingKeysError``.
        ShapeMismatchError: as ``MissingKeysError``.
        DtypeMismatchError: as ``MissingKeysError``.
        UnsupportedValueError: as ``MissingKeysError``.
        NotACheckpointError: the path is not a regular file.
        CheckpointCorruptionError: the file cannot be read (a damaged or lying
            safetensors header, a torch file holding more than tensors); the
            message names the file and the tensor.

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
    unexpected = [k for k in source.keys() if k not in targets]
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
    # Every key is checked (from the safetensors header: no data read) before
    # any tensor changes, so a mismatch on one key leaves the model as it was.
    todo = [(key, target) for key, target in targets.items() if key in src_keys]
    for key, target in todo:
        shape, dtype = source.describe(key)
        if dtype is None:  # not a tensor, or a dtype the header table does not name: look at the value
            value = source.get(key)
            if not isinstance(value, torch.Tensor):
                raise UnsupportedValueError(
                    f"import_state_dict: {where}[{key!r}] is a {type(value).__name__}, not a tensor; a state_dict "
                    "maps names to tensors"
                )
            shape, dtype = tuple(value.shape), value.dtype
            del value
        if shape != tuple(target.shape):
            raise ShapeMismatchError(
                f"{where}[{key!r}] has shape {shape}, {type(model).__name__}.{key} has shape "
                f"{tuple(target.shape)}; build the model with the source's configuration"
            )
        if dtype != target.dtype and not cast:
            raise DtypeMismatchError(
                f"{where}[{key!r}] has dtype {dtype}, {type(model).__name__}.{key} is {target.dtype}; "
                "pass cast=True to convert"
            )
    for key, target in todo:
        src = source.get(key)
        if isinstance(target, XlaTensor):
            layout = placement.layout_of(target, (key,))
            placement.install(target, placement.device_put(_host(src, target.dtype), layout))
        else:
            with torch.no_grad():
                target.copy_(src)
        del src
    return missing, unexpected
