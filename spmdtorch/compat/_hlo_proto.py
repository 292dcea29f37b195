"""XLA's ``HloModuleProto`` as a Python protobuf message, for PyTorch/XLA's HLO-as-proto APIs.

PyTorch/XLA hands out a lowered program as a serialized ``xla.HloModuleProto``
(``LoweringContext.hlo()``) and prints it in protobuf text form
(``hlo_text()``: ``opcode: "parameter"``...). jaxlib serializes the same
proto but ships no Python message class for it, so this module declares the
fields of XLA's ``xla/service/hlo.proto`` and ``xla/xla_data.proto`` that a
lowered program uses (module, computations, instructions, shapes, layouts,
literals, shardings, metadata, frontend attributes) with their XLA field
numbers, and lets ``google.protobuf`` parse and print them. A field not
declared here is kept as an unknown field: it survives a parse and
re-serialization unchanged and prints under its number.

:func:`explicit_devices` rewrites every sharding's tile assignment from XLA's
compact iota form (``<=[2,4]T(1,0)``) into the explicit device list
PyTorch/XLA's builder writes, numbering devices by logical ordinal.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import descriptor_pool, message_factory

# Generated code: its message classes are made at import, invisible to mypy.
descriptor_pb2: Any = _descriptor_pb2

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    "string": _F.TYPE_STRING,
    "bytes": _F.TYPE_BYTES,
    "bool": _F.TYPE_BOOL,
    "int32": _F.TYPE_INT32,
    "int64": _F.TYPE_INT64,
    "uint32": _F.TYPE_UINT32,
    "uint64": _F.TYPE_UINT64,
    "float": _F.TYPE_FLOAT,
    "double": _F.TYPE_DOUBLE,
}

# XLA's enums (values as in xla_data.proto / hlo.proto).
_ENUMS: dict[str, dict[str, int]] = {
    "PrimitiveType": {
        "PRIMITIVE_TYPE_INVALID": 0,
        "PRED": 1,
        "S8": 2,
        "S16": 3,
        "S32": 4,
        "S64": 5,
        "U8": 6,
        "U16": 7,
        "U32": 8,
        "U64": 9,
        "F16": 10,
        "F32": 11,
        "F64": 12,
        "TUPLE": 13,
        "OPAQUE_TYPE": 14,
        "C64": 15,
        "BF16": 16,
        "TOKEN": 17,
        "C128": 18,
        "F8E5M2": 19,
        "F8E4M3FN": 20,
        "S4": 21,
        "U4": 22,
        "F8E4M3B11FNUZ": 23,
        "F8E5M2FNUZ": 24,
        "F8E4M3FNUZ": 25,
        "F8E4M3": 28,
        "F8E3M4": 29,
        "F4E2M1FN": 32,
        "F8E8M0FNU": 33,
    },
    "OpSharding.Type": {
        "REPLICATED": 0,
        "MAXIMAL": 1,
        "TUPLE": 2,
        "OTHER": 3,
        "MANUAL": 4,
        "UNKNOWN": 5,
        "UNREDUCED": 6,
    },
    "CustomCallApiVersion": {
        "API_VERSION_UNSPECIFIED": 0,
        "API_VERSION_ORIGINAL": 1,
        "API_VERSION_STATUS_RETURNING": 2,
        "API_VERSION_STATUS_RETURNING_UNIFIED": 3,
        "API_VERSION_TYPED_FFI": 4,
    },
}

# message -> (field, number, type, repeated). A type is a scalar name, an enum
# of _ENUMS or a message of this table.
_MESSAGES: dict[str, list[tuple[str, int, str, bool]]] = {
    "HloModuleProto": [
        ("name", 1, "string", False),
        ("entry_computation_name", 2, "string", False),
        ("computations", 3, "HloComputationProto", True),
        ("host_program_shape", 4, "ProgramShapeProto", False),
        ("id", 5, "int64", False),
        ("entry_computation_id", 6, "int64", False),
        ("is_dynamic", 11, "bool", False),
        ("spmd_output_sharding", 12, "OpSharding", False),
        ("spmd_parameters_shardings", 14, "OpSharding", True),
        ("use_auto_spmd_partitioning", 16, "bool", False),
        ("frontend_attributes", 19, "FrontendAttributes", False),
    ],
    "HloComputationProto": [
        ("name", 1, "string", False),
        ("instructions", 2, "HloInstructionProto", True),
        ("program_shape", 4, "ProgramShapeProto", False),
        ("id", 5, "int64", False),
        ("root_id", 6, "int64", False),
        ("is_fusion_computation", 7, "bool", False),
        ("execution_thread", 8, "string", False),
    ],
    "HloInstructionProto": [
        ("name", 1, "string", False),
        ("opcode", 2, "string", False),
        ("shape", 3, "ShapeProto", False),
        ("metadata", 7, "OpMetadata", False),
        ("literal", 8, "LiteralProto", False),
        ("parameter_number", 9, "int64", False),
        ("fusion_kind", 11, "string", False),
        ("tuple_index", 13, "int64", False),
        ("dimensions", 14, "int64", True),
        ("slice_dimensions", 17, "SliceDimensions", True),
        ("dynamic_slice_sizes", 20, "int64", True),
        ("channel_id", 26, "int64", False),
        ("custom_call_target", 28, "string", False),
        ("id", 35, "int64", False),
        ("operand_ids", 36, "int64", True),
        ("control_predecessor_ids", 37, "int64", True),
        ("called_computation_ids", 38, "int64", True),
        ("sharding", 40, "OpSharding", False),
        ("backend_config", 43, "bytes", False),
        ("feature_group_count", 50, "int64", False),
        ("batch_group_count", 58, "int64", False),
        ("is_stable", 60, "bool", False),
        ("comparison_direction", 63, "string", False),
        ("custom_call_has_side_effect", 65, "bool", False),
        ("indices_are_sorted", 67, "bool", False),
        ("frontend_attributes", 68, "FrontendAttributes", False),
        ("unique_indices", 69, "bool", False),
        ("comparison_type", 72, "string", False),
        ("custom_call_api_version", 77, "CustomCallApiVersion", False),
        ("k", 81, "int64", False),
        ("largest", 85, "bool", False),
        ("is_composite", 89, "bool", False),
    ],
    "SliceDimensions": [("start", 1, "int64", False), ("limit", 2, "int64", False), ("stride", 3, "int64", False)],
    "ShapeProto": [
        ("element_type", 2, "PrimitiveType", False),
        ("dimensions", 3, "int64", True),
        ("tuple_shapes", 4, "ShapeProto", True),
        ("layout", 5, "LayoutProto", False),
        ("is_dynamic_dimension", 6, "bool", True),
    ],
    "LayoutProto": [("minor_to_major", 1, "int64", True), ("tail_padding_alignment_in_elements", 16, "int64", False)],
    "ProgramShapeProto": [
        ("parameters", 1, "ShapeProto", True),
        ("result", 2, "ShapeProto", False),
        ("parameter_names", 3, "string", True),
    ],
    "OpSharding": [
        ("type", 1, "OpSharding.Type", False),
        ("tile_shape", 2, "ShapeProto", False),
        ("tile_assignment_dimensions", 3, "int64", True),
        ("tile_assignment_devices", 4, "int64", True),
        ("tuple_shardings", 5, "OpSharding", True),
        ("replicate_on_last_tile_dim", 6, "bool", False),
        ("metadata", 7, "OpMetadata", True),
        ("last_tile_dims", 8, "OpSharding.Type", True),
        ("iota_reshape_dims", 9, "int64", True),
        ("iota_transpose_perm", 10, "int32", True),
    ],
    "OpMetadata": [
        ("op_type", 1, "string", False),
        ("op_name", 2, "string", False),
        ("source_file", 3, "string", False),
        ("source_line", 4, "int32", False),
    ],
    "LiteralProto": [
        ("shape", 1, "ShapeProto", False),
        ("preds", 2, "bool", True),
        ("u8s", 3, "bytes", False),
        ("s32s", 4, "int32", True),
        ("s64s", 5, "int64", True),
        ("u32s", 6, "uint32", True),
        ("u64s", 7, "uint64", True),
        ("f32s", 8, "float", True),
        ("f64s", 9, "double", True),
        ("tuple_literals", 10, "LiteralProto", True),
        ("f16s", 11, "bytes", False),
        ("bf16s", 13, "bytes", False),
        ("s8s", 15, "bytes", False),
    ],
    "FrontendAttributes": [("map", 1, "FrontendAttributes.MapEntry", True)],
}


@functools.cache
def _classes() -> dict[str, Any]:
    """The message classes, built once in a pool of their own (no clash with any ``xla`` protos)."""
    fd = descriptor_pb2.FileDescriptorProto(name="spmdtorch_compat_xla_hlo.proto", package="xla", syntax="proto3")
    messages = {msg: fd.message_type.add(name=msg) for msg in _MESSAGES}
    for enum, values in _ENUMS.items():
        # An enum's values share its scope: OpSharding's TUPLE must not clash with PrimitiveType's.
        owner, _, short = enum.rpartition(".")
        e = (messages[owner].enum_type if owner else fd.enum_type).add(name=short)
        for name, number in values.items():
            e.value.add(name=name, number=number)
    for msg, fields in _MESSAGES.items():
        m = messages[msg]
        for name, number, kind, repeated in fields:
            f = m.field.add(name=name, number=number)
            f.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
            if kind in _SCALARS:
                f.type = _SCALARS[kind]
            elif kind in _ENUMS:
                f.type, f.type_name = _F.TYPE_ENUM, f".xla.{kind}"
            else:
                f.type, f.type_name = _F.TYPE_MESSAGE, f".xla.{kind}"
        if msg == "FrontendAttributes":  # map<string, string> map = 1
            entry = m.nested_type.add(name="MapEntry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"xla.{name}")) for name in _MESSAGES}


def parse_module(serialized: bytes) -> Any:
    """A serialized ``xla.HloModuleProto`` as a message (undeclared fields kept as unknown fields)."""
    module = _classes()["HloModuleProto"]()
    module.ParseFromString(serialized)
    return module


def _shardings(module: Any) -> list[Any]:
    found = []

    def add(sharding: Any) -> None:
        found.append(sharding)
        for sub in sharding.tuple_shardings:
            add(sub)

    for comp in module.computations:
        for inst in comp.instructions:
            if inst.HasField("sharding"):
                add(inst.sharding)
    if module.HasField("spmd_output_sharding"):
        add(module.spmd_output_sharding)
    for s in module.spmd_parameters_shardings:
        add(s)
    return found


def explicit_devices(module: Any, ordinals: Sequence[int]) -> None:
    """Rewrite every sharding of ``module`` to an explicit device list of logical ordinals.

    Args:
        module: a message from :func:`parse_module`, changed in place.
        ordinals: per position in the program's device assignment, that
            device's logical ordinal (what PyTorch/XLA's sharding strings show).
    """
    for s in _shardings(module):
        dims = list(s.tile_assignment_dimensions)
        if s.iota_reshape_dims:
            reshape = list(s.iota_reshape_dims)
            perm = list(s.iota_transpose_perm) or list(range(len(reshape)))
            positions = np.arange(int(np.prod(reshape))).reshape(reshape).transpose(perm).ravel()
            del s.iota_reshape_dims[:]
            del s.iota_transpose_perm[:]
        elif s.tile_assignment_devices:
            positions = np.asarray(list(s.tile_assignment_devices))
        else:
            continue
        if dims and int(np.prod(dims)) != positions.size:  # pragma: no cover - XLA wrote an inconsistent sharding
            raise ValueError(f"sharding tile assignment {dims} does not hold {positions.size} devices")
        del s.tile_assignment_devices[:]
        s.tile_assignment_devices.extend(int(ordinals[p]) for p in positions)
