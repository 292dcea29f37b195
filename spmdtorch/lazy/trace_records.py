"""The roles of a compiled function's inputs, outputs and returned values.

A trace of an ``spmdtorch.compile`` function records, for its program, where
each input comes from on the next call (:data:`InputRole`), where each output
goes (:data:`OutputTarget`) and how each returned value is rebuilt
(:data:`ResultRecipe`). A replay reads them with ``match``, in the manner of
JAX's trace recipes (``jax/_src/interpreters/partial_eval.py``).

Every record is a frozen, slotted dataclass: made once per trace, read per
replay (attribute reads on slots), and equal only to a record of the *same*
class (a ``NamedTuple`` would make ``ArgInput(1) == FreshOutput(1)``), which
the stability check (two traces recording the same roles) relies on.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spmdtorch.lazy._storage import Storage, ViewStep

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
    "ResultRecipe",
    "ScalarInput",
    "StorageInput",
    "StorageOutput",
    "TensorMeta",
    "ValueResult",
]


@dataclasses.dataclass(frozen=True, slots=True)
class TensorMeta:
    """The view a returned tensor had when traced (``XlaTensor``'s constructor arguments)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: Any  # torch.dtype
    chain: tuple[ViewStep, ...]

    def layout(self) -> tuple[Any, ...]:
        """What must match between two traces (the view chain is compared through the program)."""
        return (self.shape, self.stride, self.offset, self.dtype)


# -- inputs: where each program leaf comes from on the next call ---------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ArgInput:
    """The value of the call's flat argument ``index`` (an xla tensor).

    Attributes:
        index: the position in the flat arguments.
        placement: None, or the replicated sharding the traced program moved
            the argument's default-placed array to (onto the mesh of sharded
            state: ``executor.rehome``); a replay moves it the same way.
    """

    index: int
    placement: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class StorageInput:
    """The current value of a storage that existed before the call (a parameter, optimizer state).

    Attributes:
        storage: the storage (weakly: a dead one forces a re-trace).
        co_holders: other storages that held the same array when traced; the
            replay is valid only while they still hold one array.
    """

    storage: weakref.ref[Storage]
    co_holders: tuple[weakref.ref[Storage], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ScalarInput:
    """A Python number frozen at trace time (its value is part of the stability check)."""

    leaf: Any  # lazy.graph.Scalar


@dataclasses.dataclass(frozen=True, slots=True)
class ConstInput:
    """Data made inside the function from host values: frozen like a jit constant."""

    array: Any  # jax.Array


InputRole = ArgInput | StorageInput | ScalarInput | ConstInput


# -- outputs: where each program output goes ------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FreshOutput:
    """A tensor the function made and returned: a new storage per call (``FreshResult``)."""

    result_index: int


@dataclasses.dataclass(frozen=True, slots=True)
class StorageOutput:
    """A storage the function wrote (in place, or a new tensor it kept, e.g. in ``p.grad``).

    Attributes:
        storage: the storage (weakly).
        created: the function made it; if it has died since (``zero_grad()``
            outside the function), replaying would write nowhere: re-trace.
    """

    storage: weakref.ref[Storage]
    created: bool


OutputTarget = FreshOutput | StorageOutput


# -- returned values: how each leaf of the result is rebuilt ---------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FreshResult:
    """A new tensor over program output ``output``."""

    output: int
    meta: TensorMeta


@dataclasses.dataclass(frozen=True, slots=True)
class ArgResult:
    """A view of the call's flat argument ``index``'s storage."""

    index: int
    meta: TensorMeta


@dataclasses.dataclass(frozen=True, slots=True)
class AliasResult:
    """A view of a storage that outlives the call (a parameter returned as is)."""

    storage: weakref.ref[Storage]
    meta: TensorMeta


@dataclasses.dataclass(frozen=True, slots=True)
class ConstResult:
    """A CPU tensor returned as is."""

    tensor: Any  # torch.Tensor


@dataclasses.dataclass(frozen=True, slots=True)
class ValueResult:
    """A non-tensor value returned as is."""

    value: Any


ResultRecipe = FreshResult | ArgResult | AliasResult | ConstResult | ValueResult
