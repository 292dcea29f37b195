"""What one trace of ``spmdtorch.compile`` records: the roles of a program's inputs and outputs.

JAX's trace recipes are the model: each program input, program output and
returned leaf has a role, one small frozen class per kind, and the replay
consumes them with ``match``. Each role also gives the part of the trace's
``compare_key`` that two traces must share before the function is replayed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from typing import Any

import jax
import numpy as np
import torch

from spmdtorch.lazy.graph import Scalar
from spmdtorch.tensor.xla_tensor import MetaKey

__all__ = [
    "AliasResult",
    "ArgInput",
    "ArgResult",
    "ConstInput",
    "ConstResult",
    "FreshOutput",
    "FreshResult",
    "InputRole",
    "OutputTarget",
    "Record",
    "ResultLeaf",
    "ScalarInput",
    "StorageInput",
    "StorageOutput",
    "ValueResult",
]

_frozen = dataclasses.dataclass(frozen=True, slots=True)


# -- program inputs: where each leaf of the program comes from on the next call --


@_frozen
class ArgInput:
    """The value of the call's flat argument ``index``."""

    index: int

    def key(self) -> tuple:
        return ("arg", self.index)


@_frozen
class StorageInput:
    """The value of a storage that existed before the call (a parameter, optimizer state).

    ``co_holders``: storages that held the same array when traced; a replay is
    valid only while they all still hold one array.
    """

    holder: weakref.ref
    co_holders: tuple

    def key(self) -> tuple:
        return ("storage", id(self.holder()), tuple(id(r()) for r in self.co_holders))


@_frozen
class ScalarInput:
    """A Python number lifted to a program input (its value is compared via ``Record.scalars``)."""

    scalar: Scalar

    def key(self) -> tuple:
        return ("scalar",)


@_frozen
class ConstInput:
    """Data made inside the function from host values: frozen like a jit constant."""

    array: jax.Array

    def key(self) -> tuple:
        return ("const",) + _const_key(self.array)


InputRole = ArgInput | StorageInput | ScalarInput | ConstInput


# -- program outputs: which storage each output goes to ------------------------


@_frozen
class FreshOutput:
    """A tensor the function made and returned: a new storage per call (result leaf ``result_index``)."""

    result_index: int

    def key(self) -> tuple:
        return ("fresh", self.result_index)


@_frozen
class StorageOutput:
    """A storage the function wrote (``created``: it made the storage and kept it outside its result)."""

    storage: weakref.ref
    created: bool

    def key(self) -> str:
        return "storage"


OutputTarget = FreshOutput | StorageOutput


# -- returned leaves: rebuilt per call ------------------------------------------


@_frozen
class FreshResult:
    """A tensor on the storage of program output ``output_index``."""

    output_index: int
    mk: MetaKey
    chain: tuple

    def key(self) -> tuple:
        return ("fresh", self.output_index, self.mk)


@_frozen
class ArgResult:
    """A tensor on the storage of flat argument ``arg_index``."""

    arg_index: int
    mk: MetaKey
    chain: tuple

    def key(self) -> tuple:
        return ("arg", self.arg_index, self.mk)


@_frozen
class AliasResult:
    """A tensor on a storage that existed before the call."""

    storage: weakref.ref
    mk: MetaKey
    chain: tuple

    def key(self) -> tuple:
        return ("alias", id(self.storage()), self.mk)


@_frozen
class ConstResult:
    """A CPU tensor returned as is."""

    tensor: torch.Tensor

    def key(self) -> tuple:
        return ("const", id(self.tensor))


@_frozen
class ValueResult:
    """A non-tensor value returned as is."""

    value: Any

    def key(self) -> tuple:
        try:
            hash(self.value)
            return ("value", self.value)
        except TypeError:
            return ("value", repr(self.value))


ResultLeaf = FreshResult | ArgResult | AliasResult | ConstResult | ValueResult


@_frozen
class Record:
    """What one trace computed: the program and the role of each input and output.

    Attributes:
        prog: the executor's program (None when the function recorded nothing).
        plan_key: the program's graph key.
        leaf_roles: an ``InputRole`` per program input.
        out_targets: an ``OutputTarget`` per program output.
        result_spec: the pytree spec of the function's result.
        result_leaves: a ``ResultLeaf`` per leaf of the result.
        scalars: ``(type, value)`` of each lifted Python number.
        optimizers: ``{id: (weakref to optimizer, hyper-parameters)}`` seen while tracing.
        compare_key: what two traces must share to be the same program.
    """

    prog: Any
    plan_key: Any
    leaf_roles: tuple
    out_targets: tuple
    result_spec: Any
    result_leaves: tuple
    scalars: tuple
    optimizers: dict
    compare_key: tuple = dataclasses.field(init=False)

    def __post_init__(self):
        key = (
            self.plan_key,
            tuple(r.key() for r in self.leaf_roles),
            tuple(t.key() for t in self.out_targets),
            self.scalars,
            self.result_spec,
            tuple(r.key() for r in self.result_leaves),
        )
        object.__setattr__(self, "compare_key", key)


def _const_key(arr) -> tuple:
    """What makes two host-made constants of two traces the same: placement and contents.

    Each trace makes its own array from the same host values (a rope table, a
    mask built on the CPU): by identity no two traces would ever agree, and
    ``fn`` would never replay. Read back only while tracing (a few calls).
    """
    if arr.is_deleted() or not arr.is_fully_addressable:
        # Donated by the program itself (then the next trace makes another one
        # anyway), or another host holds part of it: keep it distinct.
        return (id(arr),)
    data = np.asarray(arr)
    return (data.shape, str(data.dtype), arr.sharding, hashlib.blake2b(data.tobytes(), digest_size=16).digest())
