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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import nn

from spmdtorch._scan import ScanError, scan_layers

__all__ = ["find_decoder_layers", "scan_decoder_layers", "unscan_decoder_layers"]

# Keyword arguments through which HF passes a key-value cache to its layers.
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value", "layer_past")


class _ScanAllLayers:
    """Stands for every layer of the list in the model's loop: one call runs them all."""

    def __init__(self, layers: list[nn.Module], remat: bool | None) -> None:
        self.layers = layers
        self.remat = remat

    def __call__(self, hidden: Any, *args: Any, **kwargs: Any) -> Any:
        if any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
            out = hidden
            for layer in self.layers:
                out = layer(hidden, *args, **kwargs)
                hidden = out[0] if isinstance(out, (tuple, list)) else out
            return out
        return scan_layers(self.layers, hidden, layer_args=args, layer_kwargs=kwargs, remat=self.remat)


class _ScannedList:
    """Mixin for an ``nn.ModuleList`` class: iteration yields one scan over all the layers."""

    _scan_remat: bool | None = None

    def __iter__(self) -> Iterator[Any]:
        layers = list(self._modules.values())  # type: ignore[attr-defined]
        return iter([_ScanAllLayers(layers, self._scan_remat)] if layers else [])


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
    model: nn.Module, layers: nn.ModuleList | None = None, *, remat: bool | None = None
) -> nn.ModuleList:
    """Make ``model``'s loop over its decoder layers run as one ``jax.lax.scan`` (in place).

    Args:
        model: a decoder (spmdtorch's Llama, a Hugging Face causal LM...).
        layers: the layer list (default: :func:`find_decoder_layers`).
        remat: rematerialise each layer in backward (default: when the layers
            are wrapped by ``checkpoint_module`` or HF gradient checkpointing is on).

    Returns:
        The layer list (its class now scans; :func:`unscan_decoder_layers` undoes it).

    Raises:
        ScanError: no layer list found, or its layers differ (checked at the
            first forward, naming the layer and what differs).

    Example:
        >>> import torch, spmdtorch
        >>> from spmdtorch.models import LlamaConfig, LlamaForCausalLM, scan_decoder_layers
        >>> model = LlamaForCausalLM(LlamaConfig(n_layers=4)).to("xla")
        >>> _ = scan_decoder_layers(model)
        >>> tuple(model(torch.zeros(1, 8, dtype=torch.long, device="xla")).shape)
        (1, 8, 256)
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
    layers.__class__ = cls
    return layers


def unscan_decoder_layers(layers: nn.ModuleList) -> nn.ModuleList:
    """Undo :func:`scan_decoder_layers` on ``layers`` (the loop runs layer by layer again)."""
    if isinstance(layers, _ScannedList):
        layers.__class__ = type(layers).__mro__[2]
    return layers
