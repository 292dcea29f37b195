"""Load a Hugging Face model directory into a sharded model, one shard file at a time.

Every parameter is built straight into its sharding with
``jax.make_array_from_callback``: the callback reads only the block a device
owns, with positioned reads of exactly its bytes (``_st_blocks``: no memory
map, whose touched pages would stay resident until the whole shard file is
closed), so no device and no host buffer ever holds a full copy of a sharded
parameter. Host memory beyond the model's own device arrays stays about one
parameter's blocks (what ``make_array_from_callback`` gathers before placing
them), whatever the shard files' size. Headers are validated by
``safetensors.safe_open`` before anything is read.

Invariants:

* Nothing in the model changes until every check passed (names, shapes,
  dtypes, rules): a failed call can be retried on the same model.
* Tied tensors (one Parameter under several names, e.g. ``lm_head.weight`` and
  ``model.embed_tokens.weight``) are loaded once and stay one tensor; the
  checkpoint needs only one of their names (``save_pretrained`` writes one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy.typing as npt
import torch
from torch import nn

from spmdtorch import _checks, _dtypes
from spmdtorch.checkpoint import placement
from spmdtorch.checkpoint._hf_layout import HfLayout, read_layout
from spmdtorch.checkpoint._st_blocks import ST_DTYPES, ShardFile, ShardReadError, TensorEntry
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    CheckpointError,
    DtypeMismatchError,
    KeyMismatchError,
    MissingKeysError,
    ShapeMismatchError,
    UnexpectedKeysError,
    UnsupportedValueError,
)
from spmdtorch.fsdp import FSDP_AXIS, param_spec
from spmdtorch.lazy import Storage, executor, padding
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import ShardingError, mark_sharding, match_rules
from spmdtorch.tensor import storage_of, transfer, view_chain
from spmdtorch.tensor.xla_tensor import XlaTensor, contiguous_strides

__all__ = ["PretrainedLoad", "UninitializedTensorsError", "load_pretrained"]

_ST_DTYPES = ST_DTYPES  # safetensors dtype name -> torch dtype (import_state reads it here)

Rules = Mapping[str, Sequence[Any]] | str | None


class UninitializedTensorsError(CheckpointError, ValueError):
    """Tensors the checkpoint does not supply and the initialisation did not write.

    Attributes:
        names: their qualified names.
    """

    def __init__(self, message: str, names: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.names = tuple(names)


class PretrainedLoad(NamedTuple):
    """What :func:`load_pretrained` did.

    Attributes:
        missing_keys: ``state_dict`` keys the checkpoint lacks (initialised by
            ``init_fn``; empty when ``strict``).
        unexpected_keys: checkpoint names (after ``rename``) the model has no
            tensor for (skipped; empty when ``strict``).
        initialized: every tensor name ``init_fn`` initialised: the missing keys
            and the non-persistent buffers (rotary tables) built on ``meta``.
    """

    missing_keys: tuple[str, ...]
    unexpected_keys: tuple[str, ...]
    initialized: tuple[str, ...]


@dataclasses.dataclass(slots=True)
class _Target:
    """One model tensor (tied names share one), and where it is registered."""

    tensor: torch.Tensor
    is_param: bool
    names: list[str]  # qualified names, in named_modules order
    places: list[tuple[nn.Module, str]]  # (owning module, attribute)
    source: str | None = None  # the checkpoint name it loads from (model-side name)


class _Placement(NamedTuple):
    """Where a tensor that gets new xla storage goes: ``spec`` is its rule's (None: replicated, unannotated)."""

    sharding: jax.sharding.Sharding
    spec: tuple[Any, ...] | None


@dataclasses.dataclass(frozen=True, slots=True)
class _SourceInfo:
    file: str
    key: str  # the name inside the file
    shape: tuple[int, ...]
    dtype: torch.dtype


def _targets(model: nn.Module) -> dict[int, _Target]:
    out: dict[int, _Target] = {}
    for mod_name, mod in model.named_modules(remove_duplicate=False):
        tables: tuple[tuple[bool, dict[str, Any]], ...] = ((True, mod._parameters), (False, mod._buffers))
        for is_param, table in tables:
            for name, t in table.items():
                if t is None:
                    continue
                qual = f"{mod_name}.{name}" if mod_name else name
                target = out.get(id(t))
                if target is None:
                    target = out[id(t)] = _Target(t, is_param, [], [])
                if qual not in target.names:
                    target.names.append(qual)
                    target.places.append((mod, name))
    return out


def _corrupt(path: str, key: str | None, e: Exception) -> CheckpointCorruptionError:
    """A safetensors library failure (a lying or damaged header) as a corruption error naming the file."""
    field = f" (tensor {key!r})" if key is not None else " (its header)"
    return CheckpointCorruptionError(
        f"{path}{field} cannot be read as safetensors ({type(e).__name__}: {str(e)[:300]}); the file is damaged "
        "or not what its index says: download or copy the model directory again",
        [key] if key is not None else [],
    )


def _read_sources(layout: HfLayout, rename: Callable[[str], str | None] | None) -> dict[str, _SourceInfo]:
    """Model-side name -> where the checkpoint stores it (headers only; no tensor data is read)."""
    out: dict[str, _SourceInfo] = {}
    for file, keys in layout.files.items():
        with _safe_open(layout.path(file)) as f:
            on_disk = set(f.keys())
            for key in keys:
                if key not in on_disk:
                    raise KeyMismatchError(
                        f"{layout.path(file)} lacks tensor {key!r} that the index maps to it; the index and the "
                        "shards are from different saves: copy the model directory again",
                        [key],
                    )
                name = rename(key) if rename is not None else key
                if name is None:
                    continue
                if name in out:
                    raise KeyMismatchError(
                        f"checkpoint names {out[name].key!r} and {key!r} both map to model name {name!r}"
                        + (" after rename" if rename is not None else "")
                        + "; make rename= map them to different names (or one of them to None)",
                        [name],
                    )
                try:
                    sl = f.get_slice(key)
                    st_dtype, shape = sl.get_dtype(), tuple(sl.get_shape())
                except Exception as e:
                    raise _corrupt(layout.path(file), key, e) from e
                dtype = _ST_DTYPES.get(st_dtype)
                if dtype is None:
                    raise UnsupportedValueError(
                        f"{layout.path(file)}[{key!r}] has safetensors dtype {st_dtype}, which spmdtorch "
                        f"cannot load; supported: {sorted(_ST_DTYPES)}"
                    )
                out[name] = _SourceInfo(file, key, shape, dtype)
    return out


@contextlib.contextmanager
def _safe_open(path: str) -> Iterator[Any]:
    """``safetensors.safe_open`` of ``path``; a header it refuses is a ``CheckpointCorruptionError`` naming it."""
    from safetensors import safe_open

    try:
        handle = safe_open(path, framework="pt", device="cpu")
    except Exception as e:  # safetensors' own SafetensorError (or an OSError) on a damaged file
        raise _corrupt(path, None, e) from e
    with handle as f:
        yield f


def _check_names(
    targets: Mapping[int, _Target],
    sources: Mapping[str, _SourceInfo],
    persistent: set[str],
    where: str,
    strict: bool,
    model_type: str,
) -> tuple[list[str], list[str]]:
    known: set[str] = set()
    missing: list[str] = []
    for target in targets.values():
        known.update(target.names)
        target.source = next((n for n in target.names if n in sources), None)
        if target.source is None:
            missing += [n for n in target.names if n in persistent]
    unexpected = [n for n in sources if n not in known]
    if strict and missing:
        raise MissingKeysError(
            f"{where} has no tensor for {len(missing)} key(s) of {model_type}: {missing[:10]}. "
            "If the checkpoint names them differently, pass rename=fn (checkpoint name -> model name); "
            "if they are tied to another weight, tie them before loading (model.tie_weights()); "
            "to initialise them instead (a new head), pass strict=False (init_fn= initialises them)",
            missing,
        )
    if strict and unexpected:
        raise UnexpectedKeysError(
            f"{where} has {len(unexpected)} tensor(s) that {model_type} does not: {unexpected[:10]}. "
            "Build the model from the checkpoint's config, map the names with rename=fn (checkpoint name -> "
            "model name, None to drop one), or pass strict=False to skip them",
            unexpected,
        )
    return missing, unexpected


def _check_values(targets: Mapping[int, _Target], sources: Mapping[str, _SourceInfo], where: str, cast_: bool) -> None:
    for target in targets.values():
        if target.source is None:
            continue
        src = sources[target.source]
        t = target.tensor
        if src.shape != tuple(t.shape):
            raise ShapeMismatchError(
                f"{where}: {src.file}[{src.key!r}] has shape {src.shape}, the model's {target.source} has "
                f"shape {tuple(t.shape)}; build the model from the checkpoint's config.json"
            )
        if src.dtype != t.dtype and not cast_:
            raise DtypeMismatchError(
                f"{where}: {src.file}[{src.key!r}] has dtype {src.dtype}, the model's {target.source} is "
                f"{t.dtype}; pass cast=True to convert, or build the model in {src.dtype}"
            )
        if isinstance(t, XlaTensor) and view_chain(t):
            raise UnsupportedValueError(
                f"the model's {target.source} is a view of another tensor; load into a model whose "
                "tensors own their data"
            )


def _shardings(
    model: nn.Module, targets: Mapping[int, _Target], mesh: Mesh | None, rules: Rules
) -> dict[int, _Placement]:
    """id(tensor) -> its placement, for the tensors that get new xla storage (meta or CPU)."""
    if rules is not None and mesh is None:
        raise ShardingError("load_pretrained was given sharding rules but no mesh; pass mesh=Mesh(...)")
    specs: dict[int, tuple[Any, ...]] = {}
    params = dict(model.named_parameters())
    if isinstance(rules, str):
        if rules != "fsdp":
            raise ShardingError(
                f"rules={rules!r}: give a dict of parameter-name globs to partition specs (plan.rules from "
                "plan_sharding), the string 'fsdp', or None"
            )
        assert mesh is not None  # checked above
        if FSDP_AXIS not in tuple(mesh.axis_names or ()):
            raise ShardingError(
                f"rules='fsdp' shards every parameter on its largest dim over the mesh axis 'fsdp', but the "
                f"mesh's axes are {mesh.axis_names!r}; name an axis 'fsdp'"
            )
        specs = {id(p): param_spec(p.shape) for p in params.values()}
    elif rules is not None:
        if not isinstance(rules, Mapping):
            raise ShardingError(
                f"rules must be a dict of parameter-name globs to partition specs, 'fsdp' or None, "
                f"got {type(rules).__name__}"
            )
        for name, pattern in match_rules(params, rules, owner=f" of {type(model).__name__}").items():
            specs[id(params[name])] = tuple(rules[pattern])
    out: dict[int, _Placement] = {}
    for key, target in targets.items():
        t = target.tensor
        if isinstance(t, XlaTensor):
            continue  # keeps its own storage and sharding
        spec = specs.get(key)
        if spec is None:
            out[key] = _Placement(transfer.replicated_sharding(), None)
            continue
        assert mesh is not None  # specs exist only with a mesh
        if len(spec) != t.dim():
            raise ShardingError(
                f"parameter {target.names[0]!r}: partition spec {spec} has {len(spec)} entries but the "
                f"parameter has {t.dim()} dims (shape {tuple(t.shape)}); give one entry per dim"
            )
        out[key] = _Placement(mesh.named_sharding(spec), spec)
    return out


class _BlockReader:
    """Reads devices' blocks of one checkpoint tensor, converted to the target's storage dtype.

    A block's index is over the storage shape (padded when the sharding is
    uneven); the part past the logical shape is zero-filled. Equal indices
    (replicated dims) are read once.
    """

    def __init__(self, shard: ShardFile, entry: TensorEntry, dtype: torch.dtype) -> None:
        self._shard = shard
        self._entry = entry
        self._key = entry.key
        self._shape = entry.shape
        self._dtype = dtype
        self._cache: dict[tuple[tuple[int, int], ...], npt.NDArray[Any]] = {}

    def __call__(self, index: tuple[slice, ...]) -> npt.NDArray[Any]:
        bounds = tuple((int(s.start), int(s.stop)) for s in index)  # explicit: see _build
        hit = self._cache.get(bounds)
        if hit is None:
            hit = self._cache[bounds] = self._read(bounds)
        return hit

    def _read(self, bounds: tuple[tuple[int, int], ...]) -> npt.NDArray[Any]:
        clipped = tuple((min(a, n), min(b, n)) for (a, b), n in zip(bounds, self._shape))
        block = self._shard.read_block(self._entry, clipped)  # a new buffer, nobody else's
        want = tuple(b - a for a, b in bounds)
        if block.dtype != self._dtype or tuple(block.shape) != want:
            # A cast, or the padded tail of an uneven sharding (zeros), in one copy.
            out = torch.zeros(want, dtype=self._dtype)
            out[tuple(slice(0, n) for n in block.shape)] = block
            block = out
        # A view of that private buffer (narrowed to the storage dtype): JAX may alias it on CPU.
        return transfer.host_numpy(block)


def _fill_whole(shape: tuple[int, ...]) -> Callable[[tuple[slice, ...]], tuple[slice, ...]]:
    """Replace open-ended slices (a whole dim) by explicit bounds."""

    def fix(index: tuple[slice, ...]) -> tuple[slice, ...]:
        return tuple(slice(s.start or 0, n if s.stop is None else s.stop) for s, n in zip(index, shape))

    return fix


def _build(
    shard: ShardFile,
    src: _SourceInfo,
    dtype: torch.dtype,
    sharding: jax.sharding.Sharding,
    storage_shape: tuple[int, ...],
) -> jax.Array:
    entry = shard.entry(src.key)
    if (entry.dtype, entry.shape) != (src.dtype, src.shape):
        raise ShardReadError(
            f"the header now gives {entry.dtype} {entry.shape} where it gave {src.dtype} {src.shape} when the "
            "load began (the file changed while being loaded)"
        )
    reader = _BlockReader(shard, entry, dtype)
    fix = _fill_whole(storage_shape)
    storage_dtype = _dtypes.to_jax_dtype(dtype)

    def block(index: tuple[slice, ...] | None) -> npt.NDArray[Any]:
        return reader(fix(index or ()))

    array: jax.Array = jax.make_array_from_callback(storage_shape, sharding, block, dtype=storage_dtype)
    return array


def _new_tensor(array: jax.Array, target: _Target, where: _Placement) -> XlaTensor:
    """An xla tensor owning ``array`` as ``mark_sharding`` would leave it (padded storage when uneven)."""
    t = target.tensor
    logical = tuple(t.shape)
    st = Storage(array, where.sharding)
    st.annotated = where.spec is not None
    if tuple(array.shape) != logical:
        st.logical_shape = logical
    new = XlaTensor(st, (), logical, contiguous_strides(logical), 0, t.dtype)
    if target.is_param:
        return typing.cast(XlaTensor, nn.Parameter(new, requires_grad=t.requires_grad))
    return new


def _replace(target: _Target, new: torch.Tensor) -> None:
    for mod, attr in target.places:
        table: dict[str, Any] = mod._parameters if target.is_param else mod._buffers
        table[attr] = new
    target.tensor = new


def _default_init(model: nn.Module) -> Callable[[nn.Module], None]:
    hf_init = getattr(model, "_init_weights", None)

    def init(module: nn.Module) -> None:
        # A transformers PreTrainedModel initialises any of its modules (rotary
        # tables included) as from_pretrained would; otherwise torch's reset_parameters().
        if callable(hf_init):
            hf_init(module)
            return
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()

    return init


def _initialise(
    model: nn.Module,
    targets: Mapping[int, _Target],
    shardings: Mapping[int, _Placement],
    mesh: Mesh | None,
    init_fn: Callable[[nn.Module], None] | None,
) -> list[str]:
    """Give the tensors the checkpoint does not supply pending xla storage and run ``init_fn`` on their modules.

    CPU and xla tensors keep their data (CPU ones move to xla). Returns the
    names of the tensors initialised.
    """
    todo = [key for key, t in targets.items() if t.source is None and t.tensor.is_meta]
    for key, target in targets.items():
        if target.source is None and not target.tensor.is_meta and not isinstance(target.tensor, XlaTensor):
            where = shardings[key]
            moved = _new_tensor(transfer.to_device_array(target.tensor.detach(), where.sharding), target, where)
            _replace(target, moved)
    if not todo:
        return []
    versions: dict[int, int] = {}
    owners: list[nn.Module] = []
    for key in todo:
        target = targets[key]
        spec = shardings[key].spec
        t = target.tensor
        data = typing.cast(XlaTensor, torch.empty(t.shape, dtype=t.dtype, device="xla"))
        if spec is not None:
            assert mesh is not None  # specs exist only with a mesh (_shardings)
            mark_sharding(data, mesh, spec)
        new: XlaTensor = (
            typing.cast(XlaTensor, nn.Parameter(data, requires_grad=t.requires_grad)) if target.is_param else data
        )
        _replace(target, new)
        versions[key] = storage_of(new).version
        for mod, _ in target.places:
            if all(mod is not o for o in owners):
                owners.append(mod)
    init = init_fn or _default_init(model)
    with torch.no_grad():
        for mod in owners:
            init(mod)
    left = [name for key in todo for name in targets[key].names[:1] if _version(targets[key]) == versions[key]]
    if left:
        how = "your init_fn did not write them" if init_fn is not None else "their modules have no reset_parameters()"
        raise UninitializedTensorsError(
            f"the checkpoint does not hold {left[:8]}{' ...' if len(left) > 8 else ''} and {how}: they would be "
            "garbage. Pass init_fn=fn where fn(module) initialises the tensors the module owns in place (for a "
            "transformers model, model._init_weights), or build those tensors on the CPU instead of meta",
            left,
        )
    return [name for key in todo for name in targets[key].names]


def _version(target: _Target) -> int:
    return storage_of(typing.cast(XlaTensor, target.tensor)).version


def _by_file(targets: Mapping[int, _Target], sources: Mapping[str, _SourceInfo]) -> dict[str, list[int]]:
    """Shard file -> the keys of the targets it supplies (one file open at a time)."""
    out: dict[str, list[int]] = {}
    for key, target in targets.items():
        if target.source is not None:
            out.setdefault(sources[target.source].file, []).append(key)
    return out


def _open_files(layout: HfLayout, order: Sequence[str]) -> Iterator[tuple[str, ShardFile]]:
    for file in order:
        path = layout.path(file)
        try:
            shard = ShardFile(path)
        except (ShardReadError, OSError) as e:
            raise _corrupt(path, None, e) from e
        with shard:
            yield file, shard


def _check_load_args(
    directory: Any, model: Any, mesh: Any, rules: Any, strict: Any, cast: Any, rename: Any, init_fn: Any
) -> None:
    """:func:`load_pretrained`'s argument checks: all of them before anything is read."""
    func, err = "load_pretrained", CheckpointArgumentTypeError
    _checks.check_path(directory, func, "directory", err)
    _checks.check_instance(model, nn.Module, func, "model", err, "a torch.nn.Module")
    if mesh is not None:
        _checks.check_instance(mesh, Mesh, func, "mesh", err, "a spmdtorch.mesh.Mesh or None")
    if rules is not None and not isinstance(rules, (str, Mapping)):
        # A wrong *type* is an argument error; bad rules of the right type are ShardingErrors (below).
        _checks.fail(
            err,
            func,
            "rules",
            "a dict of parameter-name globs to partition specs, 'fsdp' or None",
            rules,
            "e.g. plan_sharding(model, mesh).rules",
        )
    _checks.check_bool(strict, func, "strict", err)
    _checks.check_bool(cast, func, "cast", err)
    for name, fn in (("rename", rename), ("init_fn", init_fn)):
        if fn is not None:
            _checks.check_callable(fn, func, name, err)


def load_pretrained(
    directory: str | os.PathLike[str],
    model: nn.Module,
    mesh: Mesh | None = None,
    rules: Rules = None,
    *,
    strict: bool = True,
    cast: bool = True,
    rename: Callable[[str], str | None] | None = None,
    init_fn: Callable[[nn.Module], None] | None = None,
) -> PretrainedLoad:
    """Load a Hugging Face model directory into ``model``, sharded by ``rules``, one shard file at a time.

    ``model`` is usually built on ``meta`` (no data anywhere); each parameter
    becomes an xla tensor built straight into its sharding, every device
    reading only its own block from the file. Tensors already on xla keep their
    sharding and get the checkpoint's values in place; CPU tensors move to xla.
    Tensors the checkpoint lacks (with ``strict=False``) and non-persistent
    buffers built on ``meta`` (rotary tables) are initialised by ``init_fn``.

    Args:
        directory: a ``save_pretrained`` directory: ``model.safetensors``, or
            ``model.safetensors.index.json`` and its shards.
        model: the module to fill (e.g. ``AutoModelForCausalLM.from_config(cfg)``
            built under ``with torch.device("meta"):``).
        mesh: a ``spmdtorch.mesh.Mesh``; needed with ``rules``.
        rules: how to shard the parameters: a dict of parameter-name globs to
            partition specs (``plan_sharding(...).rules``), ``"fsdp"`` (FSDPv2's
            rule: largest dim over the axis ``"fsdp"``), or None (replicated).
            Buffers are replicated.
        strict: every persistent tensor of the model must be in the checkpoint
            and every checkpoint tensor in the model.
        cast: convert the checkpoint's dtypes to the model's (bfloat16 weights
            into a float32 model and back); False makes a mismatch an error.
        rename: maps a checkpoint tensor name to the model's name for it, or to
            None to skip it (``lambda k: k.removeprefix("model.")`` loads a
            ``*ForCausalLM`` checkpoint into the bare ``*Model``).
        init_fn: ``init_fn(module)`` initialises, in place, the tensors that
            ``module`` owns and the checkpoint does not supply. Default: a
            transformers model's ``_init_weights`` (as ``from_pretrained``
            initialises them), else the module's ``reset_parameters()``.

    Returns:
        A :class:`PretrainedLoad`: missing and unexpected keys, and the names
        ``init_fn`` initialised.

    Raises:
        CheckpointArgumentTypeError: an argument of the wrong type (``model``
            not a module, ``strict`` not a bool, ``rename`` not callable...).
        NotACheckpointError: ``directory`` holds no safetensors weights.
        MissingKeysError, UnexpectedKeysError: (``strict``) names listed, with the fix.
        ShapeMismatchError, DtypeMismatchError: a tensor that does not fit its target.
        ShardingError: bad ``rules`` (a glob that matches nothing, a spec of the wrong length).
        UninitializedTensorsError: a tensor neither the checkpoint nor ``init_fn`` filled.

    Example:
        >>> import tempfile, numpy as np, torch, spmdtorch
        >>> from safetensors.torch import save_file
        >>> from spmdtorch.mesh import Mesh
        >>> d = tempfile.mkdtemp()
        >>> save_file({"weight": torch.ones(16, 4), "bias": torch.zeros(16)}, d + "/model.safetensors")
        >>> with torch.device("meta"):
        ...     lin = torch.nn.Linear(4, 16)
        >>> mesh = Mesh(np.arange(8), (8,), ("fsdp",))
        >>> load_pretrained(d, lin, mesh, "fsdp")
        PretrainedLoad(missing_keys=(), unexpected_keys=(), initialized=())
        >>> spmdtorch.sharding.get_sharding_spec(lin.weight)
        '{devices=[8,1]0,1,2,3,4,5,6,7}'
    """
    _check_load_args(directory, model, mesh, rules, strict, cast, rename, init_fn)
    cast_ = cast
    layout = read_layout(directory)
    source_dir = os.fspath(directory)
    sources = _read_sources(layout, rename)
    targets = _targets(model)
    persistent = set(model.state_dict().keys())
    missing, unexpected = _check_names(targets, sources, persistent, source_dir, strict, type(model).__name__)
    _check_values(targets, sources, source_dir, cast_)
    shardings = _shardings(model, targets, mesh, rules)
    executor.sync()  # xla targets' layouts read concrete storages
    # Every check passed: from here on the model changes (undone if anything fails).
    originals = {key: target.tensor for key, target in targets.items()}
    try:
        initialized = _initialise(model, targets, shardings, mesh, init_fn)
        plan = _by_file(targets, sources)
        for file, handle in _open_files(layout, [f for f in layout.files if f in plan]):
            for key in plan[file]:
                target = targets[key]
                assert target.source is not None  # _by_file lists only targets with a source
                src = sources[target.source]
                t = target.tensor
                try:
                    if isinstance(t, XlaTensor):
                        layout_ = placement.layout_of(t, (target.names[0],))
                        placement.install(t, _build(handle, src, t.dtype, layout_.sharding, layout_.storage_shape))
                        continue
                    where = shardings[key]
                    storage_shape = padding.padded_shape(tuple(t.shape), where.sharding) or tuple(t.shape)
                    array = _build(handle, src, t.dtype, where.sharding, tuple(storage_shape))
                except ShardReadError as e:  # data the header promised cannot be read
                    raise _corrupt(layout.path(file), src.key, e) from e
                _replace(target, _new_tensor(array, target, where))
    except BaseException:
        # Put the replaced tensors back (meta, CPU), so that the call can be retried;
        # xla tensors loaded in place keep the values read so far.
        for key, target in targets.items():
            if target.tensor is not originals[key]:
                _replace(target, originals[key])
        raise
    if initialized:
        executor.sync()  # compute the initialised tensors now, as materialize does
    return PretrainedLoad(tuple(missing), tuple(unexpected), tuple(initialized))
