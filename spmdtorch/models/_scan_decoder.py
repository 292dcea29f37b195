"""Run a model's decoder-layer loop as one scan without editing the model.

Decoders iterate their layers in ``forward`` (spmdtorch's Llama:
``for layer in self.layers: h = layer(h, cos, sin)``; Hugging Face's
``LlamaModel``: ``for decoder_layer in self.layers[: num_hidden_layers]:
hidden_states = decoder_layer(hidden_states, attention_mask=...,
position_embeddings=..., ...)``). :func:`scan_decoder_layers` swaps the
layer list's class for a subclass whose iteration yields ONE callable that
runs every layer through :func:`spmdtorch.scan_layers` with the arguments the
loop passes. Nothing else changes: ``model.layers[i]``, ``len``,
``named_parameters``, state dicts, FSDPv2 wrapping and optimizers see the same
modules and parameters. Slicing (HF's ``self.layers[:n]``) keeps the class.

When the loop passes a key-value cache (generation), the callable runs the
layers one by one as the loop would (a cache is updated per layer in place).

With ``stack_parameters=True`` the layers' parameters become stacked
``Parameter`` objects of the list itself (one per parameter name, the layers along
a leading dim), so an optimizer updates a handful of arrays instead of one
per layer and parameter, as a JAX model written for ``lax.scan`` does;
``state_dict``/``load_state_dict`` keep the per-layer keys through state-dict
hooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import torch
from torch import nn

from spmdtorch import _checks
from spmdtorch.programs import (
    ScanError,
    ScanTypeError,
    check_same_structure,
    is_checkpointed,
    run_layers,
    scan_layers,
    stack_layer_tensors,
    sync,
    unstack_layer_tensor,
)

__all__ = ["find_decoder_layers", "scan_decoder_layers", "unscan_decoder_layers"]

# Keyword arguments through which HF passes a key-value cache to its layers.
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


class _ScanAllLayers:
    """Stands for every layer of the list in the model's loop: one call runs them all."""

    def __init__(self, layers: list[nn.Module], remat: bool | None, stacked: dict[str, nn.Parameter] | None) -> None:
        self.layers = layers
        self.remat = remat
        self.stacked = stacked  # per-layer parameter name -> its stacked Parameter (stack_parameters=True)

    def __call__(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
            out = hidden
            for i, layer in enumerate(self.layers):
                if self.stacked is None:
                    out = layer(hidden, *args, **kwargs)
                else:
                    state = {n: p[i] for n, p in self.stacked.items()}
                    # The layer itself, not the template: its attributes (HF's layer_idx: which cache slot) count.
                    out = torch.func.functional_call(layer, state, (hidden, *args), kwargs, strict=False)
                hidden = out[0] if isinstance(out, (tuple, list)) else out
            return out
        if self.stacked is None:
            return scan_layers(self.layers, hidden, layer_args=args, layer_kwargs=kwargs, remat=self.remat)
        template = self.layers[0]
        remat = is_checkpointed(template) if self.remat is None else self.remat
        names, tensors = list(self.stacked), list(self.stacked.values())
        return run_layers(template, names, hidden, stacked=tensors, layer_args=args, layer_kwargs=kwargs, remat=remat)


class _ScannedList:
    """Mixin for an ``nn.ModuleList`` class: iteration yields one scan over all the layers.

    ``spmdtorch.scan_layers`` of such a list (a model written the PyTorch/XLA
    way) runs its layers, over the stacked parameters if any.
    """

    _scan_remat: bool | None = None

    def __iter__(self) -> Iterator[Any]:
        layers = list(self._modules.values())  # type: ignore[attr-defined]
        stacked = _stacked_parameters(self)  # type: ignore[arg-type]
        return iter([_ScanAllLayers(layers, self._scan_remat, stacked)] if layers else [])

    def _spmdtorch_scan_layers(self) -> tuple[list[nn.Module], dict[str, nn.Parameter] | None, bool | None]:
        """For ``spmdtorch.scan_layers(self, ...)`` (``programs.SCAN_LAYERS_HOOK``): layers, stacked, remat."""
        layers = list(self._modules.values())  # type: ignore[attr-defined]
        return layers, _stacked_parameters(self), self._scan_remat  # type: ignore[arg-type]

    def __getitem__(self, idx: Any) -> Any:
        # HF loops over ``self.layers[: config.num_hidden_layers]``: a new list, which would
        # not hold the stacked parameters; slicing every layer gives the list itself.
        if isinstance(idx, slice) and self.__dict__.get(_STACKED):
            n = len(self._modules)  # type: ignore[attr-defined]
            if range(n)[idx] == range(n):
                return self
            raise ScanError(
                f"layers[{idx.start}:{idx.stop}:{idx.step}] of {n} layers with stacked parameters: only all of "
                "them can be sliced (they share one Parameter per weight). Run every layer, or call "
                "unscan_decoder_layers first"
            )
        return super().__getitem__(idx)  # type: ignore[misc]


# The list's attribute mapping a stacked Parameter's attribute name to the per-layer name it stacks
# (without FSDPv2's ``_orig_module`` segments: wrapping before or after stacking finds the same tensors).
# FSDPv2 reads it too (``fsdp._fsdpv2._is_stacked_layers``): it shards those like one layer's weight.
_STACKED = "_spmdtorch_stacked_names"


def _plain(name: str) -> str:
    """``name`` without FSDPv2's ``_orig_module`` segments."""
    return ".".join(part for part in name.split(".") if part != "_orig_module")


def _resolve(layer: nn.Module, plain_name: str) -> str:
    """The dotted name of the tensor ``plain_name`` in ``layer`` as wrapped now (FSDPv2 adds ``_orig_module``)."""
    owner, _, leaf = plain_name.rpartition(".")
    paths: dict[str, str] = {}
    for path, _m in layer.named_modules():
        paths[_plain(path)] = path  # a wrapper comes before its _orig_module: the innermost wins
    actual = paths.get(owner, owner)
    return f"{actual}.{leaf}" if actual else leaf


def _stacked_parameters(layers: nn.Module) -> dict[str, nn.Parameter] | None:
    """The first layer's (current) tensor name -> stacked Parameter, or None when parameters are per layer."""
    names: dict[str, str] | None = layers.__dict__.get(_STACKED)
    if not names or not layers._modules:
        return None
    template = cast(nn.Module, next(iter(layers._modules.values())))
    return {_resolve(template, name): cast(nn.Parameter, layers._parameters[attr]) for attr, name in names.items()}


def _attr_name(name: str) -> str:
    """The list's attribute for the stacked ``name`` (``attention.wq.weight`` -> ``stacked__attention__wq__weight``)."""
    return "stacked__" + name.replace(".", "__")


def _stack(layers: nn.ModuleList) -> None:
    """Replace the layers' parameters by stacked Parameters of ``layers`` (see ``stack_parameters``)."""
    if layers.__dict__.get(_STACKED):
        return
    mods = cast(list[nn.Module], list(layers._modules.values()))
    if not mods:
        return
    check_same_structure(mods, frozenset(("layer_idx",)))
    template = mods[0]
    buffers = [n for n, _ in template.named_buffers()]
    if buffers:
        raise ScanError(
            f"scan_decoder_layers(stack_parameters=True): the layers hold buffers ({buffers[:3]}); only "
            "parameters can be stacked. Pass stack_parameters=False (the layers keep their own tensors)"
        )
    names = [n for n, _ in template.named_parameters()]
    per_layer = [dict(m.named_parameters()) for m in mods]
    mapping: dict[str, str] = {}
    for name in names:
        tensors = [p[name] for p in per_layer]
        stacked = nn.Parameter(stack_layer_tensors(tensors), requires_grad=tensors[0].requires_grad)
        attr = _attr_name(_plain(name))
        while attr in mapping or hasattr(layers, attr):
            attr += "_"
        layers.register_parameter(attr, stacked)
        mapping[attr] = _plain(name)
    for m in mods:
        for name in names:
            owner, _, leaf = name.rpartition(".")
            del m.get_submodule(owner)._parameters[leaf]
    layers.__dict__[_STACKED] = mapping
    if not layers.__dict__.get("_spmdtorch_stack_hooks"):
        layers._register_state_dict_hook(_per_layer_state_dict)
        layers.register_load_state_dict_pre_hook(_stack_loaded_state_dict)
        layers.__dict__["_spmdtorch_stack_hooks"] = True
    sync()  # the stacked arrays are made now, not in the first training step's program


def _unstack(layers: nn.ModuleList) -> None:
    """Give every layer its own Parameters again, cut from the stacked ones (sharded like them, less the layer dim)."""
    names: dict[str, str] | None = layers.__dict__.get(_STACKED)
    if not names:
        return
    mods = cast(list[nn.Module], list(layers._modules.values()))
    for attr, name in names.items():
        stacked = cast(nn.Parameter, layers._parameters.pop(attr))
        for i, m in enumerate(mods):
            owner, _, leaf = _resolve(m, name).rpartition(".")
            p = nn.Parameter(unstack_layer_tensor(stacked, i), requires_grad=stacked.requires_grad)
            m.get_submodule(owner).register_parameter(leaf, p)
    layers.__dict__[_STACKED] = {}
    sync()


def _per_layer_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State-dict hook: each stacked entry becomes the per-layer entries an unstacked list has."""
    names: dict[str, str] | None = module.__dict__.get(_STACKED)
    if not names:
        return
    stacked = {attr: state_dict.pop(prefix + attr) for attr in names if prefix + attr in state_dict}
    mods = cast(list[nn.Module], list(module._modules.values()))
    for i in range(len(mods)):
        for attr, name in names.items():
            if attr in stacked:
                state_dict[f"{prefix}{i}.{_resolve(mods[i], name)}"] = stacked[attr][i]


def _stack_loaded_state_dict(
    module: nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    """Load pre-hook: per-layer entries (an unstacked list's keys) are stacked into the stacked entries."""
    names: dict[str, str] | None = module.__dict__.get(_STACKED)
    if not names:
        return
    mods = cast(list[nn.Module], list(module._modules.values()))
    for attr, name in names.items():
        keys = [f"{prefix}{i}.{_resolve(m, name)}" for i, m in enumerate(mods)]
        if all(k in state_dict for k in keys):
            state_dict[prefix + attr] = torch.stack([state_dict.pop(k) for k in keys])


_CLASSES: dict[tuple[type, bool | None], type] = {}


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's stack of identical layers: the largest ``nn.ModuleList`` whose children share one type.

    Returns:
        ``(qualified name, the list)``.

    Raises:
        ScanError: the model has no such list.
    """
    best: tuple[int, str, nn.ModuleList] | None = None
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < 1:
            continue
        kinds = {type(c) for c in m._modules.values()}
        if len(kinds) != 1:
            continue
        size = sum(p.numel() for p in m.parameters())
        if best is None or size > best[0]:
            best = (size, name, m)
    if best is None:
        raise ScanError(
            f"scan_decoder_layers: {type(model).__name__} has no nn.ModuleList of layers of one type; "
            "pass the list explicitly: scan_decoder_layers(model, layers=model.<path>)"
        )
    return best[1], best[2]


def scan_decoder_layers(
    model: nn.Module,
    layers: nn.ModuleList | None = None,
    *,
    remat: bool | None = None,
    stack_parameters: bool = False,
) -> nn.ModuleList:
    """Make ``model``'s loop over its decoder layers run as one ``jax.lax.scan`` (in place).

    Args:
        model: a decoder (spmdtorch's Llama, a Hugging Face causal LM...).
        layers: the layer list (default: :func:`find_decoder_layers`).
        remat: rematerialise each layer in backward (default: when the layers
            are wrapped by ``checkpoint_module`` or HF gradient checkpointing is on).
        stack_parameters: replace the layers' parameters by ONE ``Parameter``
            per parameter name, held by the list (``layers.stacked__<name with
            "." as "__">``), with the layers along a new leading dim; the
            layers then hold no parameters. An optimizer then updates a few
            stacked arrays instead of one per layer and name (9 instead of
            288 for a 32-layer Llama), which is what a JAX model written for
            ``lax.scan`` does, and the step's program stays the same size at
            any depth. ``state_dict()`` still has the per-layer keys
            (``layers.3.attention.wq.weight``) and ``load_state_dict`` takes
            them, so checkpoints are interchangeable with the unstacked
            model's. Call it *after* ``FSDPv2`` wraps the model (the stacked
            weight is sharded like one layer's, its layer dim replicated) and
            *before* creating the optimizer (which must see the new
            parameters). Layers holding buffers cannot be stacked.

    Returns:
        The layer list (its class now scans; :func:`unscan_decoder_layers` undoes it).

    Raises:
        ScanError: no layer list found, or its layers differ (checked at the
            first forward, or at once with ``stack_parameters``, naming the
            layer and what differs).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.models import LlamaConfig, LlamaForCausalLM, scan_decoder_layers
        >>> model = LlamaForCausalLM(LlamaConfig(n_layers=4)).to("xla")
        >>> _ = scan_decoder_layers(model)
        >>> tuple(model(torch.zeros(1, 8, dtype=torch.long, device="xla")).shape)
        (1, 8, 256)
        >>> stacked = LlamaForCausalLM(LlamaConfig(n_layers=4)).to("xla")
        >>> _ = scan_decoder_layers(stacked, stack_parameters=True)
        >>> tuple(stacked.layers.stacked__attention__wq__weight.shape)
        (4, 64, 64)
        >>> "layers.3.attention.wq.weight" in stacked.state_dict()
        True
    """
    if layers is None:
        _, layers = find_decoder_layers(model)
    if not isinstance(layers, nn.ModuleList):
        raise ScanError(f"scan_decoder_layers: layers must be an nn.ModuleList, got {type(layers).__name__}")
    base = type(layers)
    if issubclass(base, _ScannedList):
        base = base.__mro__[2]  # already scanned: re-derive from the original class
    key = (base, remat)
    cls = _CLASSES.get(key)
    if cls is None:
        cls = _CLASSES[key] = type(f"Scanned{base.__name__}", (_ScannedList, base), {"_scan_remat": remat})
    _checks.check_bool(stack_parameters, "scan_decoder_layers", "stack_parameters", ScanTypeError)
    if stack_parameters:
        _stack(layers)
    layers.__class__ = cls
    return layers


def unscan_decoder_layers(layers: nn.ModuleList) -> nn.ModuleList:
    """Undo :func:`scan_decoder_layers` on ``layers`` (the loop runs layer by layer again).

    Stacked parameters (``stack_parameters=True``) are cut back into per-layer
    ``Parameter`` objects (new tensors: create the optimizer again).
    """
    if isinstance(layers, _ScannedList):
        _unstack(layers)
        layers.__class__ = type(layers).__mro__[2]
    return layers
