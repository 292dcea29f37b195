"""The lazy engine: storages, graph recording, graph keys, compile cache, execution, metrics.

Layer: above ``spmdtorch.ops`` (pure JAX lowerings), below ``spmdtorch.tensor``
(the torch tensor subclass). Nothing in here imports torch-tensor code; the
engine's data model is ``Storage`` (one mutable cell per base array) with view
chains of ``ViewStep``, and ``record`` is the one way to add a node.

The names below are the package's internal API for the layers above.
"""

from spmdtorch.lazy import _precision as precision
from spmdtorch.lazy import _profiling as profiling
from spmdtorch.lazy import trace_records
from spmdtorch.lazy._engine import ENGINE, CompileCache
from spmdtorch.lazy._gc import paused_gc
from spmdtorch.lazy._placement import replicated_sharding
from spmdtorch.lazy._record import Part, Select, record, record_batch
from spmdtorch.lazy._storage import PENDING, SEQ, TRACE_HOOK, Storage, ViewStep, holder_of, holders_of
from spmdtorch.lazy.constraint import ConstraintStep

# precision, profiling and trace_records are modules: torch's matmul precision
# as JAX names it, the profiler's state and annotations, and the typed roles of
# a traced function's inputs and outputs (spmdtorch.compile).
__all__ = [
    "ENGINE",
    "CompileCache",
    "ConstraintStep",
    "PENDING",
    "Part",
    "Select",
    "SEQ",
    "TRACE_HOOK",
    "Storage",
    "ViewStep",
    "holder_of",
    "holders_of",
    "paused_gc",
    "precision",
    "profiling",
    "record",
    "record_batch",
    "replicated_sharding",
    "trace_records",
]
