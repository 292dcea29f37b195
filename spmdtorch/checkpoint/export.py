"""Export a checkpoint to one safetensors or torch file, one array at a time.

Both formats are written by streaming: the header (safetensors) or the pickle
(torch's zip format) needs only shapes and dtypes, which the checkpoint
record holds, so arrays are read from Orbax in small batches (at most
``max_host_bytes``, or one array if it is larger), checked against their
fingerprints, written, and dropped. Host memory stays bounded by the largest
batch, never the whole state.
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import struct
import sys
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import orbax.checkpoint as ocp
import torch
from etils import epath

from spmdtorch import _checks
from spmdtorch.checkpoint import fingerprint, placement, tree
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentError,
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    MissingKeysError,
)
from spmdtorch.checkpoint.io import ARRAYS, Record, empty_array, is_stored, read_record
from spmdtorch.checkpoint.paths import CheckpointPath, checkpoint_path
from spmdtorch.checkpoint.tree import Key, KeyPath

__all__ = ["export", "read_arrays"]

_FORMATS = ("safetensors", "torch")
_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.uint16: "U16",
    torch.uint32: "U32",
    torch.uint64: "U64",
}


def _torch_dtype(name: str) -> torch.dtype:
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def read_arrays(
    path: CheckpointPath, record: Record, indices: Iterable[int], max_host_bytes: int
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(index, CPU tensor of the saved torch dtype)`` for ``indices``, in order.

    Reads in batches of at most ``max_host_bytes`` (one array when larger) and
    checks each array's fingerprint.
    """
    path = checkpoint_path(path)
    infos = record["arrays"]
    batch: list[int] = []
    size = 0
    for i in indices:
        nbytes = int(np.prod(infos[i]["shape"], dtype=np.int64)) * np.dtype(infos[i]["storage_dtype"]).itemsize
        if batch and size + nbytes > max_host_bytes:
            yield from _read_batch(path, infos, batch)
            batch, size = [], 0
        batch.append(i)
        size += nbytes
    if batch:
        yield from _read_batch(path, infos, batch)


def _read_batch(
    path: epath.Path, infos: Sequence[Mapping[str, Any]], batch: Sequence[int]
) -> Iterator[tuple[int, torch.Tensor]]:
    # Zero-size arrays are recorded only (io.is_stored): nothing to read.
    items = {tuple(infos[i]["path"]): ocp.RestoreArgs(restore_type=np.ndarray) for i in batch if is_stored(infos[i])}
    restored: Any = {}
    if items:
        args_tree = tree.orbax_tree(items)
        try:
            with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
                restored = ckptr.restore(
                    path / ARRAYS,
                    args=ocp.args.PyTreeRestore(item=args_tree, restore_args=args_tree, partial_restore=True),
                )
        except Exception as e:
            raise CheckpointCorruptionError(
                f"the arrays of checkpoint {path} cannot be read ({type(e).__name__}: {str(e)[:500]})"
            ) from e
    for i in batch:
        info = infos[i]
        if is_stored(info):
            node = restored
            for k in info["path"]:
                node = node[str(k)]
        else:
            node = empty_array(info)
        if fingerprint.fingerprint_numpy(node) != tuple(info["fingerprint"]):
            key = tree.keystr(tuple(info["path"]))
            raise CheckpointCorruptionError(
                f"checkpoint {path}: state{key} read back different from what was saved (fingerprint "
                "mismatch); the data files were altered: export another checkpoint",
                [key],
            )
        t = placement.to_torch(node)
        want = _torch_dtype(info["dtype"])
        yield i, (t.to(want) if t.dtype != want else t)
        del node, t


def _select(record: Record, prefix: Key | Sequence[Key] | None) -> tuple[Any, dict[int, str]]:
    """``(sub-structure, {array index: name})`` under ``prefix``."""
    root = tree.decode_state(record["tree"])
    keys: KeyPath = () if prefix is None else ((prefix,) if isinstance(prefix, (str, int)) else tuple(prefix))
    node = root
    for k in keys:
        if isinstance(node, dict) and k in node:
            node = node[k]
        elif isinstance(node, (list, tuple)) and isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(node):
            node = node[k]
        else:  # a leaf, a missing key, or a str / out-of-range index into a list or tuple
            raise MissingKeysError(
                f"export prefix {keys!r}: the checkpoint has no entry state{tree.keystr(keys)}", [tree.keystr(keys)]
            )
    names: dict[int, str] = {}
    for info_i, info in enumerate(record["arrays"]):
        p = tuple(info["path"])
        if p[: len(keys)] == keys:
            names[info_i] = ".".join(str(k) for k in p[len(keys) :])
    return node, names


def _values(node: Any, path: KeyPath = ()) -> dict[str, Any]:
    """Plain Python values of a decoded structure, by dotted name."""
    out: dict[str, Any] = {}
    items: Iterable[tuple[Key, Any]]
    if isinstance(node, dict):
        items = node.items()
    elif isinstance(node, (list, tuple)):
        items = enumerate(node)
    else:
        if not isinstance(node, tree.ArrayRef):
            out[".".join(str(k) for k in path)] = node
        return out
    for k, v in items:
        out.update(_values(v, path + (k,)))
    return out


def _raw_bytes(t: torch.Tensor) -> memoryview | bytes:
    """The tensor's data as a buffer (no copy for a contiguous tensor)."""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().data if t.numel() else b""


def _write_safetensors(
    out: str | os.PathLike[str],
    path: CheckpointPath,
    record: Record,
    names: Mapping[int, str],
    values: Mapping[str, Any],
    max_host_bytes: int,
) -> None:
    infos = record["arrays"]
    header: dict[str, Any] = {}
    offset = 0
    order = list(names)
    for i in order:
        dtype = _torch_dtype(infos[i]["dtype"])
        if dtype not in _ST_DTYPES:
            raise TypeError(
                f"state{tree.keystr(tuple(infos[i]['path']))} has dtype {dtype}, which safetensors "
                "cannot store; export with format='torch'"
            )
        nbytes = int(np.prod(infos[i]["shape"], dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        header[names[i]] = {
            "dtype": _ST_DTYPES[dtype],
            "shape": list(infos[i]["shape"]),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    meta = {"format": "pt"}
    meta.update({k: json.dumps(v) for k, v in values.items()})
    header["__metadata__"] = meta
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data must start 8-byte aligned
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        f.writelines(
            t.contiguous().view(torch.uint8).reshape(-1).numpy().data if t.numel() else b""
            for _, t in read_arrays(path, record, order, max_host_bytes)
        )


class _StorageRef:
    """Stands for one tensor's storage in the pickle (its data is written later)."""

    def __init__(self, key: str, dtype: torch.dtype, numel: int) -> None:
        self.key, self.dtype, self.numel = key, dtype, numel


class _TensorRef:
    """Unpickles as the tensor ``torch.save`` would have written."""

    def __init__(self, ref: _StorageRef, shape: Sequence[int]) -> None:
        self.ref, self.shape = ref, tuple(shape)

    def __reduce_ex__(self, protocol: object) -> tuple[Any, tuple[Any, ...]]:
        stride: list[int] = []
        acc = 1
        for s in reversed(self.shape):
            stride.append(acc)
            acc *= s
        return (
            torch._utils._rebuild_tensor_v2,
            (self.ref, 0, torch.Size(self.shape), tuple(reversed(stride)), False, collections.OrderedDict()),
        )


def _write_torch(
    out: str | os.PathLike[str],
    path: CheckpointPath,
    record: Record,
    node: Any,
    names: Mapping[int, str],
    max_host_bytes: int,
) -> None:
    infos = record["arrays"]
    refs: dict[int, _TensorRef] = {}
    for n, i in enumerate(names):
        dtype = _torch_dtype(infos[i]["dtype"])
        refs[i] = _TensorRef(
            _StorageRef(str(n), dtype, int(np.prod(infos[i]["shape"], dtype=np.int64))), infos[i]["shape"]
        )

    def fill(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, tree.ArrayRef):
            return refs[x.index]
        if isinstance(x, list):
            return [fill(v) for v in x]
        if isinstance(x, tuple):
            return tuple(fill(v) for v in x)
        return x

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: object) -> tuple[Any, ...] | None:
            if isinstance(obj, _StorageRef):
                # The legacy storage class names are what torch.save pickles.
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    name = torch.TypedStorage(0, dtype=obj.dtype)._pickle_storage_type()
                return ("storage", getattr(torch, name), obj.key, "cpu", obj.numel)
            return None

    import io as _io

    buf = _io.BytesIO()
    Pickler(buf, protocol=2).dump(fill(node))
    data = buf.getvalue()
    writer = torch._C.PyTorchFileWriter(os.fspath(out))
    writer.write_record("data.pkl", data, len(data))
    # str records, as torch.serialization writes them (torch's stub omits that overload).
    writer.write_record(".format_version", "1", 1)  # type: ignore[arg-type]
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))  # type: ignore[arg-type]
    for i, t in read_arrays(path, record, list(names), max_host_bytes):
        storage = t.contiguous().untyped_storage()
        # An UntypedStorage, as torch.serialization writes (torch's stub names only the legacy Storage).
        writer.write_record(f"data/{refs[i].ref.key}", storage, storage.nbytes())  # type: ignore[arg-type]
    writer.write_end_of_file()


def export(
    path: CheckpointPath,
    out: str | os.PathLike[str],
    format: str = "safetensors",
    *,
    prefix: Key | Sequence[Key] | None = None,
    max_host_bytes: int = 256 << 20,
) -> None:
    """Write the checkpoint at ``path`` as one file a plain PyTorch program loads.

    Tensors get their saved torch dtype (64-bit tensors that the device held
    in 32 bits are widened back). ``format="torch"`` writes what
    ``torch.save(state)`` would have (the whole structure, plain values
    included; ``torch.load(out, weights_only=True)`` reads it);
    ``"safetensors"`` writes the tensors under their dotted key paths and the
    plain values as JSON strings in the header's ``__metadata__``.

    Args:
        path: a checkpoint directory (see :func:`spmdtorch.checkpoint.save`).
        out: the file to write.
        format: ``"safetensors"`` or ``"torch"``.
        prefix: export only ``state[prefix]`` (a key, or a tuple of keys), with
            names relative to it: ``prefix="model"`` gives a file that
            ``model.load_state_dict`` takes.
        max_host_bytes: read at most this many bytes of arrays at a time.

    Raises:
        NotACheckpointError, CheckpointCorruptionError: see :func:`spmdtorch.checkpoint.load`.
        CheckpointArgumentError: an unknown ``format``, ``max_host_bytes`` < 1
            (a ``ValueError``; ``CheckpointArgumentTypeError`` for a wrong type).
        MissingKeysError: ``prefix`` names no entry of the checkpoint (a ``KeyError``).

    Example:
        >>> import tempfile, torch, spmdtorch
        >>> from spmdtorch import checkpoint
        >>> d = tempfile.mkdtemp()
        >>> checkpoint.save(d + "/ckpt", {"model": {"w": torch.ones(2, device="xla")}, "step": 1})
        >>> checkpoint.export(d + "/ckpt", d + "/model.pt", "torch", prefix="model")
        >>> torch.load(d + "/model.pt", weights_only=True)
        {'w': tensor([1., 1.])}
    """
    checkpoint_path(path)
    checkpoint_path(out, "out")
    _checks.check_choice(format, _FORMATS, "export", "format", CheckpointArgumentError)
    _checks.check_int(max_host_bytes, "export", "max_host_bytes", CheckpointArgumentError, minimum=1)
    if prefix is not None and not isinstance(prefix, (str, int)):
        if not isinstance(prefix, Sequence) or isinstance(prefix, bytes):
            _checks.fail(CheckpointArgumentTypeError, "export", "prefix", "a key, a sequence of keys or None", prefix)
        for i, k in enumerate(prefix):
            if not isinstance(k, (str, int)):
                _checks.fail(CheckpointArgumentTypeError, "export", f"prefix[{i}]", "a str or int key", k)
    record = read_record(path)
    node, names = _select(record, prefix)
    if format == "safetensors":
        _write_safetensors(out, path, record, names, _values(node), max_host_bytes)
    else:
        _write_torch(out, path, record, node, names, max_host_bytes)
