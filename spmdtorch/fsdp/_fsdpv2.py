"""FSDPv2: fully sharded data parallelism expressed as SPMD annotations.

:class:`FSDPv2` (alias :class:`SpmdFullyShardedDataParallel`) is PyTorch/XLA's
``torch_xla.experimental.spmd_fully_sharded_data_parallel`` wrapper on
spmdtorch. It does no communication of its own: it annotates

* every parameter of the wrapped module that is not already sharded, split
  on its largest dim (the first one on a tie) over the mesh axis ``"fsdp"``,
  every other dim replicated; and
* the forward output, split on dim 0 (the batch) over ``"fsdp"`` (or over
  ``(extra_data_axis, "fsdp")``),

and the GSPMD partitioner turns that into FSDP: weights are all-gathered
before use and gradients reduce-scattered, inside the one compiled step.

With an ``auto_wrap_policy`` (see :mod:`spmdtorch.fsdp`) the
matching submodules are wrapped first, so each layer's output is sharded
too and the outer wrapper takes the leftover parameters.

State dicts keep PyTorch/XLA's layout: the wrapped module is registered as the
submodule ``_orig_module``, so keys read ``_orig_module.layers.0._orig_module.
attention.wq.weight``. :func:`plain_state_dict` / :func:`load_plain_state_dict`
give and take the unwrapped model's keys.

Example:
    >>> import numpy as np, torch, spmdtorch
    >>> from spmdtorch.mesh import Mesh
    >>> from spmdtorch.sharding import get_sharding_spec
    >>> from spmdtorch.fsdp import FSDPv2
    >>> mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    >>> model = FSDPv2(torch.nn.Linear(16, 32), mesh=mesh)
    >>> get_sharding_spec(model.module.weight)      # (32, 16): dim 0 is largest
    '{devices=[8,1]0,1,2,3,4,5,6,7}'
    >>> y = model(torch.randn(8, 16, device="xla"))
    >>> get_sharding_spec(y)
    '{devices=[8,1]0,1,2,3,4,5,6,7}'
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
from torch import nn

from spmdtorch import _checks
from spmdtorch.fsdp._mixed_precision import MixedPrecision
from spmdtorch.fsdp._wrap import recursive_wrap
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.mesh import Mesh, get_global_mesh
from spmdtorch.sharding import (
    ShardingError,
    clear_sharding,
    mark_sharding,
    tensor_sharding,
)
from spmdtorch.tensor import storage_of, view_chain
from spmdtorch.tensor.xla_tensor import XlaTensor

__all__ = [
    "FSDPv2",
    "FSDPv2Error",
    "FSDPv2MeshError",
    "FSDPv2OutputError",
    "FSDPv2WrapError",
    "SpmdFullyShardedDataParallel",
    "load_plain_state_dict",
    "plain_state_dict",
]

# The mesh axis FSDPv2 shards over; spmdtorch.plan reads it (declared internal API).
FSDP_AXIS = "fsdp"
_PREFIX = "_orig_module."
# Depth of accumulate_gradients' per-device micro-steps being recorded: there a
# tensor is one device's block, and an output annotation over the mesh (whose
# axes are manual in that region) has no meaning.
_LOCAL_STEPS = [0]


def in_local_step() -> bool:
    """Whether accumulate_gradients' per-device body is being recorded (annotations over the mesh are left out there)."""
    return _LOCAL_STEPS[0] > 0


@contextlib.contextmanager
def local_step() -> Iterator[None]:
    """While open, FSDPv2 wrappers leave their outputs unannotated (the per-device body of accumulate_gradients)."""
    _LOCAL_STEPS[0] += 1
    try:
        yield
    finally:
        _LOCAL_STEPS[0] -= 1


class FSDPv2Error(ValueError):
    """Base class of the errors :class:`FSDPv2` raises."""


class FSDPv2MeshError(FSDPv2Error):
    """No usable mesh: none given or set globally, no "fsdp" axis, unknown extra axis."""


class FSDPv2WrapError(FSDPv2Error, RuntimeError):
    """A module that cannot be wrapped (already wrapped, no ``forward``...).

    Also a ``RuntimeError``, which is what PyTorch/XLA raises here.
    """


class FSDPv2OutputError(FSDPv2Error, RuntimeError):
    """The default ``shard_output`` cannot shard this forward output.

    Also a ``RuntimeError``, which is what PyTorch/XLA raises here.
    """


def param_spec(shape: Sequence[int]) -> tuple[str | None, ...]:
    """``"fsdp"`` on the largest dim (the first of equals), None elsewhere.

    The spec FSDPv2 gives an unsharded parameter. Declared internal API of
    :mod:`spmdtorch.fsdp`: :mod:`spmdtorch.plan` applies and prices the same
    rule, so the plan matches what wrapping does.
    """
    spec: list[str | None] = [None] * len(shape)
    if spec:
        dims = tuple(shape)
        spec[dims.index(max(dims))] = FSDP_AXIS
    return tuple(spec)


def _is_stacked_layers(root: nn.Module, name: str) -> bool:
    """Parameter ``name`` holds every layer's weight, stacked (``scan_decoder_layers(stack_parameters=True)``).

    Such a parameter is sharded like one layer's, its leading (layer) dim
    replicated. The layer list records its stacked parameters' names in its
    ``__dict__`` (an attribute on the tensor would not survive ``module.to``).
    """
    owner_name, _, leaf = name.rpartition(".")
    owner = root.get_submodule(owner_name) if owner_name else root
    return leaf in owner.__dict__.get("_spmdtorch_stacked_names", {})


def _output_spec(ndim: int, extra_data_axis: str | None) -> tuple[str | tuple[str, str] | None, ...]:
    """``"fsdp"`` (or ``(extra_data_axis, "fsdp")``) on dim 0, None elsewhere."""
    spec: list[str | tuple[str, str] | None] = [None] * ndim
    if spec:
        spec[0] = (extra_data_axis, FSDP_AXIS) if extra_data_axis else FSDP_AXIS
    return tuple(spec)


def _is_sharded(p: torch.Tensor) -> bool:
    """Annotated (any spec, replicated included), or concrete data split across devices."""
    if storage_of(cast(XlaTensor, p)).annotated:  # the wrapper moved the module to xla first
        return True
    sharding = tensor_sharding(p)
    return sharding is not None and not sharding.is_fully_replicated


def _defines_forward(module: nn.Module) -> bool:
    """The class overrides ``nn.Module.forward``, or the instance has its own."""
    if callable(module.__dict__.get("forward")):
        return True
    forward = getattr(type(module), "forward", None)
    return forward is not None and forward is not nn.Module.forward


def _resolve_mesh(mesh: Mesh | None, extra_data_axis: str | None) -> Mesh:
    if mesh is None:
        mesh = get_global_mesh()
        if mesh is None:
            raise FSDPv2MeshError(
                "FSDPv2 needs a mesh: none was passed (mesh=None) and no global mesh is set; "
                "pass mesh=Mesh(device_ids, shape, (..., 'fsdp', ...)) or call "
                "spmdtorch.mesh.set_global_mesh(mesh) first"
            )
    if not isinstance(mesh, Mesh):
        raise FSDPv2MeshError(
            f"FSDPv2's mesh must be a spmdtorch.mesh.Mesh, got {type(mesh).__module__}."
            f"{type(mesh).__qualname__}; build one with Mesh(device_ids, mesh_shape, axis_names)"
        )
    names = tuple(mesh.axis_names or ())
    if FSDP_AXIS not in names:
        raise FSDPv2MeshError(
            f"FSDPv2's mesh must have an axis named 'fsdp' (parameters and activations are "
            f"sharded over it), but its axis names are {mesh.axis_names!r}; name the axis to "
            f"shard over 'fsdp', e.g. Mesh(np.arange(n), (n,), ('fsdp',))"
        )
    if extra_data_axis is not None:
        if not isinstance(extra_data_axis, str):
            raise FSDPv2MeshError(
                f"extra_data_axis must be the name (str) of a mesh axis, got "
                f"{type(extra_data_axis).__name__} {extra_data_axis!r}"
            )
        if extra_data_axis == FSDP_AXIS or extra_data_axis not in names:
            others = [n for n in names if n != FSDP_AXIS]
            raise FSDPv2MeshError(
                f"extra_data_axis={extra_data_axis!r} is not a mesh axis other than 'fsdp' "
                f"(the mesh's axes are {names!r}); pass one of {others!r} or None"
            )
    return mesh


def _annotate_output(t: torch.Tensor, mesh: Mesh, spec: tuple[Any, ...]) -> torch.Tensor:
    """``mark_sharding(t, mesh, spec)``, on a copy when ``t`` cannot take it in place.

    A pending value or a view is annotated in place (a constraint on its
    value), as PyTorch/XLA does. A tensor with another annotation of its own
    (a parameter, another wrapper's output returned unchanged) must keep it,
    and concrete data (an input returned as is) would be resharded for good:
    those are copied first (free inside XLA) and the copy is annotated.
    """
    if not isinstance(t, XlaTensor):
        return mark_sharding(t, mesh, spec)  # raises ShardingError naming the device
    wanted = mesh.named_sharding(spec)
    if view_chain(t):
        current = tensor_sharding(t)  # the view's own annotation, if any
        in_place = current is None or current == wanted
    else:
        st = storage_of(t)
        in_place = isinstance(st.value, LazyRef) and (not st.annotated or st.sharding == wanted)
    if in_place:
        return mark_sharding(t, mesh, spec)
    copy = cast(XlaTensor, t.clone())  # a clone of an xla tensor is one
    if storage_of(copy).annotated and storage_of(copy).sharding != wanted:
        clear_sharding(copy)  # a clone inherits its source's annotation
    return mark_sharding(copy, mesh, spec)


class FSDPv2(nn.Module):
    """Shard a module's parameters and outputs over the mesh axis ``"fsdp"``.

    The wrapper moves ``module`` to the xla device, annotates each parameter
    that is not already sharded (annotated, or concrete data split across
    devices) with ``"fsdp"`` on its largest dim, and shards every forward
    output with ``shard_output``. Attributes it does not have are looked up
    on the wrapped module, so ``model.config``-style access keeps working.

    ``module``, ``mesh`` and ``shard_output`` may be passed by position, as
    PyTorch/XLA's FSDPv2 guide writes it (``FSDPv2(my_module, mesh,
    shard_output)``); the other arguments are keyword-only.

    Args:
        module: The module to wrap. It must define ``forward`` (not an
            ``nn.ModuleList``/``nn.ModuleDict``) and must not be an FSDPv2.
        mesh: A :class:`spmdtorch.mesh.Mesh` with an axis named ``"fsdp"``;
            None uses :func:`spmdtorch.mesh.get_global_mesh`.
        shard_output: ``shard_output(output, mesh) -> None``, called on every
            forward output to annotate it in place (e.g. with
            ``mark_sharding(output.logits, mesh, ("fsdp", None, None))``;
            any tensor can be annotated, views such as a 3-d ``linear``'s
            output included).
            Its return value is ignored. The default shards a tensor output,
            or element 0 of a tuple output, on dim 0 over ``"fsdp"`` (or
            ``(extra_data_axis, "fsdp")``), other dims replicated; any other
            output raises :class:`FSDPv2OutputError`.
        auto_wrap_policy: ``policy(module, recurse, nonwrapped_numel) -> bool``
            (see :mod:`spmdtorch.fsdp`); the submodules it selects
            are wrapped first, with the same ``mesh``, ``shard_output`` and
            ``extra_data_axis``.
        auto_wrapper_callable: What auto-wrapping calls instead of
            ``FSDPv2``, as ``auto_wrapper_callable(submodule, mesh=...,
            shard_output=..., extra_data_axis=...)`` (e.g. to apply
            activation checkpointing before wrapping).
        extra_data_axis: A second mesh axis the batch is split over (outer,
            before ``"fsdp"``); parameters stay sharded over ``"fsdp"`` only,
            i.e. replicated along this axis.
        mixed_precision: A :class:`spmdtorch.fsdp.MixedPrecision`
            policy: the forward computes with ``param_dtype`` copies of the
            parameters (e.g. bfloat16) while the parameters, their
            gradients and the optimizer stay in float32. Set it on the outer
            wrapper; it covers every parameter beneath it.

    Raises:
        FSDPv2Error: ``mixed_precision`` is not a ``MixedPrecision``.
        FSDPv2MeshError: no mesh given and none set globally; the mesh has no
            ``"fsdp"`` axis; ``extra_data_axis`` is not another axis of the mesh.
        FSDPv2WrapError: ``module`` is already an FSDPv2, does not define
            ``forward``, or (with ``auto_wrap_policy``) contains an FSDPv2.

    Example:
        >>> import functools, numpy as np, torch, spmdtorch
        >>> from spmdtorch.mesh import Mesh
        >>> from spmdtorch.models.llama import DecoderLayer, LlamaConfig, LlamaForCausalLM
        >>> from spmdtorch.fsdp import FSDPv2
        >>> from spmdtorch.fsdp import transformer_auto_wrap_policy
        >>> mesh = Mesh(np.arange(8), (8,), ("fsdp",))
        >>> policy = functools.partial(transformer_auto_wrap_policy,
        ...                            transformer_layer_cls={DecoderLayer})
        >>> model = FSDPv2(LlamaForCausalLM(LlamaConfig.tiny()), mesh=mesh,
        ...                auto_wrap_policy=policy)
        >>> type(model.layers[0]).__name__       # attributes forward to .module
        'FSDPv2'
        >>> logits = model(torch.randint(0, 256, (8, 16), device="xla"))
    """

    def __init__(
        self,
        module: nn.Module,
        mesh: Mesh | None = None,
        shard_output: Callable[[Any, Mesh], None] | None = None,
        *,
        auto_wrap_policy: Callable[..., bool] | None = None,
        auto_wrapper_callable: Callable[..., nn.Module] | None = None,
        extra_data_axis: str | None = None,
        mixed_precision: MixedPrecision | None = None,
    ):
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecision):
            raise FSDPv2Error(
                f"FSDPv2 mixed_precision must be a spmdtorch.partition.MixedPrecision or None, got "
                f"{type(mixed_precision).__name__}; e.g. MixedPrecision(param_dtype=torch.bfloat16)"
            )
        if isinstance(module, FSDPv2):
            raise FSDPv2WrapError(
                f"module is already wrapped with FSDPv2 (wrapping {type(module.module).__name__}); "
                "wrap each module once: for nested sharding wrap the inner children first, then "
                "the outer parent (or pass auto_wrap_policy)"
            )
        if not isinstance(module, nn.Module):
            raise FSDPv2WrapError(f"FSDPv2 wraps an nn.Module, got {type(module).__name__} as module")
        for name, fn in (
            ("shard_output", shard_output),
            ("auto_wrap_policy", auto_wrap_policy),
            ("auto_wrapper_callable", auto_wrapper_callable),
        ):
            if fn is not None:
                _checks.check_callable(fn, "FSDPv2", name, FSDPv2Error)
        if extra_data_axis is not None:
            _checks.check_str(extra_data_axis, "FSDPv2", "extra_data_axis", FSDPv2Error, nonempty=True)
        if not _defines_forward(module):
            raise FSDPv2WrapError(
                f"FSDPv2 can only wrap a module that defines forward(), and "
                f"{type(module).__name__} does not (nn.ModuleList and nn.ModuleDict never do): "
                "wrap the module whose forward() runs these layers, or wrap each layer on its own"
            )
        mesh = _resolve_mesh(mesh, extra_data_axis)
        super().__init__()

        if auto_wrap_policy is not None:
            for name, sub in module.named_modules():
                if isinstance(sub, FSDPv2):
                    raise FSDPv2WrapError(
                        f"submodule {name!r} of {type(module).__name__} is already an FSDPv2, which "
                        "auto_wrap_policy would wrap again; either wrap by hand (no "
                        "auto_wrap_policy) or pass the unwrapped module"
                    )
            recursive_wrap(
                module,
                auto_wrap_policy,
                auto_wrapper_callable or FSDPv2,
                only_wrap_children=True,  # the root is this wrapper
                mesh=mesh,
                shard_output=shard_output,
                extra_data_axis=extra_data_axis,
            )

        self._orig_module = module.to("xla")
        self._mesh = mesh
        self._extra_data_axis = extra_data_axis
        # Only parameters not sharded yet: wrapped children (and the user's
        # own annotations) keep theirs; this wrapper takes the leftovers.
        for name, p in self._orig_module.named_parameters():
            if _is_sharded(p):
                continue
            stacked = _is_stacked_layers(self._orig_module, name)
            spec = (None, *param_spec(p.shape[1:])) if stacked else param_spec(p.shape)
            try:
                mark_sharding(p, mesh, spec)
            except ShardingError as e:
                raise FSDPv2Error(f"FSDPv2 could not shard parameter {name!r}: {e}") from e
        self._user_shard_output = shard_output
        self._mixed_precision = mixed_precision

    @property
    def module(self) -> nn.Module:
        """The wrapped module (as ``DistributedDataParallel.module``)."""
        return self._orig_module

    @property
    def mesh(self) -> Mesh:
        """The mesh parameters and outputs are sharded over."""
        return self._mesh

    @property
    def mixed_precision(self) -> MixedPrecision | None:
        """The compute-dtype policy (None: compute in the parameters' dtype)."""
        return self._mixed_precision

    @property
    def extra_data_axis(self) -> str | None:
        """The extra batch axis (None when the batch is split over "fsdp" only)."""
        return self._extra_data_axis

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Run the wrapped module, then shard its output (see the class docstring)."""
        if self._mixed_precision is not None:
            output = self._mixed_precision.run(self._orig_module, args, kwargs)
        else:
            output = self._orig_module(*args, **kwargs)
        if in_local_step():
            return output
        if self._user_shard_output is not None:
            self._user_shard_output(output, self._mesh)
            return output
        return self._shard_output_default(output)

    def _shard_output_default(self, output: Any) -> Any:
        if isinstance(output, torch.Tensor):
            return self._shard_tensor(output, "output")
        if isinstance(output, tuple) and output and isinstance(output[0], torch.Tensor):
            warnings.warn(
                f"FSDPv2: {type(self.module).__name__} returned a tuple; only element 0 is "
                "sharded (on dim 0 over 'fsdp'). Pass shard_output= to shard other elements.",
                stacklevel=3,
            )
            first = self._shard_tensor(output[0], "output[0]")
            if first is output[0]:
                return output
            rest = (first, *output[1:])
            return type(output)(*rest) if hasattr(output, "_fields") else rest
        what = type(output).__name__
        if isinstance(output, tuple):
            what = f"tuple whose element 0 is {type(output[0]).__name__}" if output else "empty tuple"
        raise FSDPv2OutputError(
            f"FSDPv2's default shard_output shards a tensor output or element 0 of a tuple, but "
            f"{type(self.module).__name__}.forward returned a {what}; pass "
            "shard_output=lambda output, mesh: mark_sharding(<the activation tensor>, mesh, "
            "('fsdp', None, ...)) to say which tensor to shard"
        )

    def _shard_tensor(self, t: torch.Tensor, what: str) -> torch.Tensor:
        spec = _output_spec(t.dim(), self._extra_data_axis)
        try:
            return _annotate_output(t, self._mesh, spec)
        except ShardingError as e:
            raise FSDPv2OutputError(
                f"FSDPv2 could not shard the {what} of {type(self.module).__name__} (shape {tuple(t.shape)}): {e}"
            ) from e

    def __getattr__(self, name: str) -> Any:
        """Forward attributes this wrapper does not have to the wrapped module."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            # Not during construction/unpickling, before _orig_module exists.
            if name == "_orig_module" or "_orig_module" not in self.__dict__.get("_modules", {}):
                raise
            return getattr(self._modules["_orig_module"], name)

    def __getitem__(self, key: Any) -> Any:
        """Index the wrapped module (an ``nn.Sequential``, say)."""
        wrapped: Any = self.module  # indexable when the wrapped module is (nn.Module declares no __getitem__)
        return wrapped[key]

    def extra_repr(self) -> str:
        axis = f", extra_data_axis={self._extra_data_axis!r}" if self._extra_data_axis else ""
        return f"mesh_shape={tuple(self._mesh.mesh_shape)}, axis_names={self._mesh.axis_names}{axis}"


#: PyTorch/XLA's name for :class:`FSDPv2`.
SpmdFullyShardedDataParallel = FSDPv2


def _plain_key(key: str) -> str:
    return key.replace(_PREFIX, "")


def plain_state_dict(module: nn.Module, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``module.state_dict()`` with every ``_orig_module.`` removed from the keys.

    The keys are those of the model before wrapping, so the dict loads into
    an unwrapped copy (``load_state_dict``) or, through
    :func:`load_plain_state_dict`, into a wrapped one. Values are the same
    (sharded xla) tensors ``state_dict`` returns.

    Example:
        >>> import numpy as np, torch
        >>> from spmdtorch.mesh import Mesh
        >>> model = FSDPv2(torch.nn.Linear(4, 8), mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
        >>> list(model.state_dict())
        ['_orig_module.weight', '_orig_module.bias']
        >>> list(plain_state_dict(model))
        ['weight', 'bias']
    """
    _checks.check_instance(module, nn.Module, "plain_state_dict", "module", FSDPv2Error, "an nn.Module")
    out = {}
    for key, value in module.state_dict(*args, **kwargs).items():
        out[_plain_key(key)] = value
    return out


def load_plain_state_dict(
    module: nn.Module, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
) -> Any:  # torch's _IncompatibleKeys (a private NamedTuple)
    """Load a state dict with unwrapped keys into a (possibly FSDPv2-wrapped) ``module``.

    Keys without a match are passed through unchanged, so ``strict=True``
    reports them as unexpected. Values are copied into the existing
    parameters, which keep their shardings.

    Returns:
        ``module.load_state_dict``'s ``(missing_keys, unexpected_keys)``.

    Example:
        >>> import numpy as np, torch
        >>> from spmdtorch.mesh import Mesh
        >>> ref = torch.nn.Linear(4, 8)
        >>> model = FSDPv2(torch.nn.Linear(4, 8), mesh=Mesh(np.arange(8), (8,), ("fsdp",)))
        >>> load_plain_state_dict(model, ref.state_dict())
        <All keys matched successfully>
    """
    what = "load_plain_state_dict"
    _checks.check_instance(module, nn.Module, what, "module", FSDPv2Error, "an nn.Module")
    _checks.check_instance(state_dict, Mapping, what, "state_dict", FSDPv2Error, "a mapping (a state dict)")
    strict = _checks.check_bool(strict, what, "strict", FSDPv2Error)
    assign = _checks.check_bool(assign, what, "assign", FSDPv2Error)
    names = {_plain_key(k): k for k in module.state_dict(keep_vars=True)}
    return module.load_state_dict({names.get(k, k): v for k, v in state_dict.items()}, strict=strict, assign=assign)
