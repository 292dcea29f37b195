"""``torch_xla._XLAC.lowering``: ``LoweringContext`` lowers the graph computing some tensors to an HLO module.

PyTorch/XLA's ``LoweringContext(name)`` builds an XLA computation from the
pending graph of the tensors given to ``build`` without running it, and maps
its parameters back to tensors. Here the program is the one spmdtorch would
compile for those tensors (:func:`spmdtorch.debug.lower_graph`): JAX lowers it
and XLA converts it to an ``HloModuleProto`` named ``name``, with PyTorch/XLA's
conventions: instructions named by opcode (``custom-call.5``) and shardings
as explicit device lists of logical ordinals (``{devices=[2,4]0,1,...}``).

Its parameters are the arrays of the tensors the graph reads (a tensor given
to ``build`` that is already computed is a parameter returned as it is), the
Python numbers that stay inputs, and the random key when the graph draws
random numbers; numbers spmdtorch compiles in as constants are not
parameters (PyTorch/XLA makes most of them parameters). Building runs
nothing, transfers nothing and leaves torch's random generator where it was.

Example::

    ctx = torch_xla._XLAC.lowering.LoweringContext("MyStep")
    ctx.build([loss])
    ctx.hlo_text()                          # protobuf text: opcode: "parameter" ...
    ctx.tensor_parameter_id(weight)         # its parameter number, or -1
    ctx.device_parameter_id_tensor_mapping()  # {parameter number: xla tensor}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from google.protobuf import json_format, text_format

import spmdtorch
from spmdtorch import debug
from spmdtorch.compat import _hlo_proto
from spmdtorch.compat.errors import CompatError
from spmdtorch.sharding import logical_device_order
from spmdtorch.tensor.xla_tensor import wrap_jax_array

__all__ = ["LoweringContext", "LoweringContextError", "hlo_module_proto"]


class LoweringContextError(CompatError, TypeError):
    """A ``LoweringContext`` was given something other than xla tensors, or read before ``build``."""


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str):
        raise LoweringContextError(f"{what}: name must be a str, got {type(name).__name__}; pass e.g. 'MyStep'")
    return name


def _xla_tensor(t: Any, what: str) -> spmdtorch.XlaTensor:
    if not isinstance(t, spmdtorch.XlaTensor):
        got = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise LoweringContextError(f"{what} must be an xla tensor, got {got}; move it with t.to('xla')")
    return t


def hlo_module_proto(graph: debug.LoweredGraph, name: str) -> Any:
    """The ``HloModuleProto`` message of ``graph``'s program, as PyTorch/XLA's builder names and annotates it.

    Args:
        graph: a program from :func:`spmdtorch.debug.lower_graph`.
        name: the module's name (PyTorch/XLA: the ``LoweringContext``'s).

    Returns:
        The message (see :mod:`spmdtorch.compat._hlo_proto`).
    """
    computation = graph.lowered.compiler_ir("hlo")
    if computation is None:  # pragma: no cover - JAX converts to HLO on every backend it supports
        raise LoweringContextError("LoweringContext.build: JAX gave no HLO for this program on this backend")
    module = _hlo_proto.parse_module(computation.as_serialized_hlo_module_proto())
    module.name = name
    # JAX names instructions after the traced function's variables; PyTorch/XLA's
    # builder after their opcode. Operands refer to instructions by id, so names are free.
    k = 0
    for comp in module.computations:
        for inst in comp.instructions:
            k += 1
            inst.name = f"{inst.opcode}.{k}"
    order = logical_device_order()
    position = {(d.process_index, d.id): i for i, d in enumerate(order)}
    _hlo_proto.explicit_devices(module, [position[(d.process_index, d.id)] for d in graph.devices])
    return module


class LoweringContext:
    """PyTorch/XLA's ``torch_xla._XLAC.lowering.LoweringContext`` (see the module docstring).

    Args:
        name: the HLO module's name.

    Raises:
        LoweringContextError: ``name`` is not a string.
    """

    def __init__(self, name: str = "PyLoweringContext") -> None:
        self._name = _check_name(name, "LoweringContext")
        self._name_string = ""
        self._graph: debug.LoweredGraph | None = None
        self._module: Any = None

    def build(self, tensors: Sequence[torch.Tensor]) -> None:
        """Lower the graph computing ``tensors`` (its outputs, in this order); runs nothing.

        Raises:
            LoweringContextError: ``tensors`` is not a list of xla tensors.
        """
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
            raise LoweringContextError(
                f"LoweringContext.build: tensors must be a list of xla tensors, got {type(tensors).__name__}; "
                "pass [t1, t2, ...]"
            )
        xs = [_xla_tensor(t, f"LoweringContext.build: tensors[{i}]") for i, t in enumerate(tensors)]
        graph = debug.lower_graph(xs, name=self._name)
        self._module = hlo_module_proto(graph, self._name)
        self._graph = graph

    def buildforiloop(self, tensors: Sequence[torch.Tensor], additional_inputs_list: Sequence[Any] = ()) -> None:
        """PyTorch/XLA's body/condition builder for its ``while_loop``; not provided.

        Raises:
            LoweringContextError: always.
        """
        raise LoweringContextError(
            "LoweringContext.buildforiloop builds the condition and body computations of PyTorch/XLA's own "
            "while_loop lowering; spmdtorch lowers loops through JAX. Write the loop as torch_xla.experimental.scan "
            "(or spmdtorch's scan), or call build(tensors) to inspect a graph"
        )

    def _built(self, what: str) -> debug.LoweredGraph:
        if self._graph is None:
            raise LoweringContextError(f"LoweringContext.{what}: nothing is built yet; call build(tensors) first")
        return self._graph

    def hlo(self) -> bytes:
        """The serialized ``xla.HloModuleProto`` (deterministic bytes)."""
        self._built("hlo")
        return bytes(self._module.SerializeToString(deterministic=True))

    def hlo_text(self) -> str:
        """The module in protobuf text form (``name: "..."``, ``opcode: "add"``, ``sharding { ... }``)."""
        self._built("hlo_text")
        return str(text_format.MessageToString(self._module, print_unknown_fields=True))

    def hlo_json(self) -> str:
        """The module as protobuf JSON (the fields this layer declares; see ``_hlo_proto``)."""
        self._built("hlo_json")
        return str(json_format.MessageToJson(self._module))

    def device_parameter_id_tensor_mapping(self) -> dict[int, torch.Tensor]:
        """Per parameter number, an xla tensor over the parameter's data; nothing is copied or transferred.

        The random key, whose data is on the host until the program runs, is
        a CPU ``uint32`` tensor.
        """
        graph = self._built("device_parameter_id_tensor_mapping")
        out: dict[int, torch.Tensor] = {}
        for p in graph.parameters:
            if p.role == "rng_key":
                out[p.number] = torch.from_numpy(p.value.copy())
            else:
                out[p.number] = wrap_jax_array(p.value)
        return out

    def parameter_id_tensor_mapping(self) -> dict[int, torch.Tensor]:
        """Per parameter number, its data copied to a CPU tensor (a transfer from the devices, as in PyTorch/XLA)."""
        self._built("parameter_id_tensor_mapping")
        return {n: t.cpu() for n, t in self.device_parameter_id_tensor_mapping().items()}

    def tensor_parameter_id(self, tensor: torch.Tensor) -> int:
        """The parameter number whose data is ``tensor``'s, or -1 (pending, or not read by the graph).

        Raises:
            LoweringContextError: ``tensor`` is not an xla tensor.
        """
        graph = self._built("tensor_parameter_id")
        return int(graph.parameter_of(_xla_tensor(tensor, "LoweringContext.tensor_parameter_id: tensor")))

    def set_name_string(self, name: str) -> None:
        """Set the context's name string (PyTorch/XLA's loop lowering reads it; the module keeps its name)."""
        self._name_string = _check_name(name, "LoweringContext.set_name_string")

    def get_name_string(self) -> str:
        """The name string set by :meth:`set_name_string` ("" until set, as in PyTorch/XLA)."""
        return self._name_string
