"""``torch_xla.core.xla_builder``: ``call_jax`` runs a JAX function on xla tensors inside the traced program.

``call_jax(jax_func, args, kwargs=None, name=None, override_hash=None)`` is
:func:`spmdtorch.call_jax`: one node of the lazy graph (or of a compiled
step) whose function is ``jax_func``, run with the active mesh (the one
``xs.set_global_mesh`` set) as JAX's abstract mesh, differentiable through
``jax.vjp``. PyTorch/XLA's HLO builder (``Op``, ``create_computation``...)
has no spmdtorch meaning: spmdtorch builds no HLO of its own; write the
computation as a JAX function and call it with ``call_jax``.

``computation_from_module_proto(name, proto)`` and
``get_computation_hlo(computation)`` read an HLO module that exists already
(``torch_xla._XLAC.lowering.LoweringContext(...).hlo()``): the first parses
the serialized ``HloModuleProto`` into an XLA computation, the second prints
it as HLO text, as PyTorch/XLA prints it (``%add.3 = f32[4]{0} add(...)``).
"""

from __future__ import annotations

import importlib
from typing import Any

from spmdtorch import CallJaxError, call_jax
from spmdtorch.compat.errors import CompatError

# jaxlib's HLO bindings (XlaComputation, HloModule, HloPrintOptions): jax has no
# public spelling of them, and jaxlib ships no type stubs for the module.
_hlo: Any = importlib.import_module("jaxlib._hlo")

__all__ = ["CallJaxError", "HloProtoError", "call_jax", "computation_from_module_proto", "get_computation_hlo"]


class HloProtoError(CompatError, ValueError):
    """``computation_from_module_proto`` was given something that is not a serialized ``HloModuleProto``."""


def computation_from_module_proto(name: str, proto: bytes) -> Any:
    """The XLA computation of a serialized ``HloModuleProto`` (``LoweringContext.hlo()``).

    Args:
        name: PyTorch/XLA's name for the computation (the module keeps the
            name its proto has, as in PyTorch/XLA).
        proto: the serialized module.

    Raises:
        HloProtoError: ``name`` is not a str, or ``proto`` is not bytes of an HLO module.
    """
    if not isinstance(name, str):
        raise HloProtoError(f"computation_from_module_proto: name must be a str, got {type(name).__name__}")
    if not isinstance(proto, (bytes, bytearray)):
        raise HloProtoError(
            f"computation_from_module_proto: proto must be the bytes of a serialized HloModuleProto, got "
            f"{type(proto).__name__}; pass LoweringContext.hlo()"
        )
    computation = _hlo.XlaComputation(bytes(proto))
    try:
        computation.get_hlo_module()
    except Exception as e:  # XLA's own parse/verify error, re-raised by name
        raise HloProtoError(
            f"computation_from_module_proto: proto ({len(proto)} bytes) is not a valid HloModuleProto: {e}; "
            "pass LoweringContext.hlo()"
        ) from e
    return computation


def get_computation_hlo(computation: Any) -> str:
    """HLO text of ``computation`` (from :func:`computation_from_module_proto`), with operand shapes.

    Raises:
        HloProtoError: ``computation`` is not an XLA computation.
    """
    if not isinstance(computation, _hlo.XlaComputation):
        raise HloProtoError(
            f"get_computation_hlo: expected the computation computation_from_module_proto returns, got "
            f"{type(computation).__name__}"
        )
    options = _hlo.HloPrintOptions()
    options.print_operand_shape = True  # PyTorch/XLA's text: add(f32[4]{0} %p0.1, ...)
    return str(computation.get_hlo_module().to_string(options))
