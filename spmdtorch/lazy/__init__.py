"""The lazy engine: storages, graph recording, graph keys, compile cache, execution, metrics.

Layer: above ``spmdtorch.ops`` (pure JAX lowerings), below ``spmdtorch.tensor``
(the torch tensor subclass). Nothing in here imports torch-tensor code; the
engine's data model is ``Storage`` (one mutable cell per base array) with view
chains of ``ViewStep``, and ``record`` is the one way to add a node.

The names below are the package's internal API for the layers above.
"""

from spmdtorch.lazy._gc import paused_gc
from spmdtorch.lazy._placement import replicated_sharding
from spmdtorch.lazy._record import Part, record, record_batch
from spmdtorch.lazy._storage import PENDING, SEQ, TRACE_HOOK, Storage, ViewStep, holder_of, holders_of
from spmdtorch.lazy.constraint import ConstraintStep

__all__ = [
    "ConstraintStep",
    "PENDING",
    "Part",
    "SEQ",
    "TRACE_HOOK",
    "Storage",
    "ViewStep",
    "holder_of",
    "holders_of",
    "paused_gc",
    "record",
    "record_batch",
    "replicated_sharding",
]
