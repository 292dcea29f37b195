"""Stand-ins for PyTorch/XLA 2.9 names spmdtorch.compat does not provide.

``from torch_xla.x import name`` must succeed wherever PyTorch/XLA 2.9 has the
name (programs import more than they use, and hasattr()-style feature checks
must answer as PyTorch/XLA would); the stand-in raises
:class:`TorchXlaNameError` when it is *used*: called, instantiated, or an
attribute of it read. Which stand-in: a class for an upstream class (so
``isinstance(x, Name)`` answers False and ``class Sub(Name)`` still defines),
a callable for a function, an opaque value otherwise.
"""

from __future__ import annotations

from typing import Any, NoReturn

from spmdtorch.compat.errors import GUIDE, TorchXlaNameError

__all__ = ["is_placeholder", "make_placeholder", "reason_for"]

#: Why whole PyTorch/XLA modules have no spmdtorch meaning, and what to use instead (longest prefix wins).
REASONS: dict[str, str] = {
    "torch_xla._dynamo": (
        "torch.compile(fn, backend='openxla') runs on spmdtorch (torch_xla.core.dynamo_bridge."
        "extract_compiled_graph is spmdtorch.dynamo.backend); the rest of PyTorch/XLA's bridge works on its own IR"
    ),
    "torch_xla.core.dynamo_bridge": "see torch_xla._dynamo",
    "torch_xla.experimental.custom_kernel": (
        "Pallas kernels called by hand are PyTorch/XLA's; use F.scaled_dot_product_attention (lowered to JAX's "
        "flash-attention kernel on TPU) or write the kernel in JAX"
    ),
    "torch_xla.experimental.pallas_kernels": "Pallas kernels called by hand are PyTorch/XLA's; write the kernel in JAX",
    "torch_xla.experimental.eager": "spmdtorch has no eager mode: use lazy mode (mark_step) or spmdtorch.compile",
    "torch_xla.distributed.fsdp": (
        "FSDPv1 (XlaFullyShardedDataParallel) is multiprocess; use SPMD FSDPv2 "
        "(torch_xla.experimental.spmd_fully_sharded_data_parallel.SpmdFullyShardedDataParallel)"
    ),
    "torch_xla.distributed.zero_redundancy_optimizer": "ZeRO is multiprocess; FSDPv2 shards optimizer state in SPMD",
    "torch_xla.distributed.data_parallel": "multiprocess data parallelism; shard the batch over a Mesh (SPMD)",
    "torch_xla.distributed.xla_multiprocessing": "multiprocess mode; spmdtorch is SPMD only",
    "torch_xla._internal": "PyTorch/XLA's runtime internals (PJRT plugins, TPU metadata); see spmdtorch.runtime",
    "torch_xla.experimental.plugins": "PJRT plugins are PyTorch/XLA's; spmdtorch runs on JAX's backends",
    "torch_xla.stablehlo": "export with torch.export + spmdtorch.debug.get_stablehlo(tensors) instead",
}


def reason_for(qualname: str) -> str:
    """The reason stated for ``qualname`` (a dotted name), by its longest listed prefix; "" if none."""
    best = ""
    for prefix in REASONS:
        if (qualname == prefix or qualname.startswith(prefix + ".")) and len(prefix) > len(best):
            best = prefix
    return REASONS.get(best, "")


def _message(qualname: str, detail: str) -> str:
    why = detail or reason_for(qualname)
    return (
        f"{qualname} exists in PyTorch/XLA 2.9 but spmdtorch.compat does not provide it"
        + (f": {why}" if why else "")
        + f". The names compat provides and their spmdtorch equivalents are listed in {GUIDE}"
    )


def _raise(qualname: str, detail: str, use: str) -> NoReturn:
    raise TorchXlaNameError(f"{use}: " + _message(qualname, detail))


class _Placeholder:
    """An unprovided function or value: raises when called or when an attribute is read."""

    __slots__ = ("_qualname", "_detail")

    def __init__(self, qualname: str, detail: str) -> None:
        object.__setattr__(self, "_qualname", qualname)
        object.__setattr__(self, "_detail", detail)

    def __repr__(self) -> str:
        return f"<unprovided PyTorch/XLA name {self._qualname}>"

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        _raise(self._qualname, self._detail, f"calling {self._qualname}")

    def __getattr__(self, attr: str) -> NoReturn:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # protocol probes (inspect, copy, pickle) are not uses
        _raise(self._qualname, self._detail, f"reading {self._qualname}.{attr}")

    def __bool__(self) -> bool:
        _raise(self._qualname, self._detail, f"using {self._qualname} as a truth value")

    def __iter__(self) -> NoReturn:
        _raise(self._qualname, self._detail, f"iterating {self._qualname}")

    def __getitem__(self, key: Any) -> NoReturn:
        _raise(self._qualname, self._detail, f"indexing {self._qualname}")


class _PlaceholderMeta(type):
    """The metaclass of unprovided classes: instantiating one (or a subclass) or reading its attributes raises."""

    _qualname: str
    _detail: str

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        _raise(cls._qualname, cls._detail, f"instantiating {cls.__name__}")

    def __getattr__(cls, attr: str) -> NoReturn:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)  # protocol probes (copy, pickle, typing) are not uses
        _raise(cls._qualname, cls._detail, f"reading {cls._qualname}.{attr}")


def make_placeholder(module: str, name: str, kind: str, detail: str = "") -> Any:
    """The stand-in for PyTorch/XLA's ``module.name`` of ``kind`` (class, function, value).

    Args:
        module: the PyTorch/XLA module name (``torch_xla.core.xla_model``).
        name: the attribute name.
        kind: what the name is in PyTorch/XLA: ``class`` gives a class, anything else a callable value.
        detail: why it is not provided (e.g. the implementation's own error), added to the message.
    """
    qualname = f"{module}.{name}"
    if kind == "class":
        cls = _PlaceholderMeta(
            name,
            (),
            {"__module__": module, "__qualname__": name, "__doc__": _message(qualname, detail)},
        )
        type.__setattr__(cls, "_qualname", qualname)
        type.__setattr__(cls, "_detail", detail)
        return cls
    return _Placeholder(qualname, detail)


def is_placeholder(obj: Any) -> bool:
    """Whether ``obj`` is a stand-in made by :func:`make_placeholder`."""
    return isinstance(obj, _Placeholder) or isinstance(type(obj), _PlaceholderMeta) or isinstance(obj, _PlaceholderMeta)
