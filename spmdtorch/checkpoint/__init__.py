"""Distributed checkpoints on Orbax: save on one mesh, restore on any other.

* :func:`save` / :func:`load`: one state (dicts/lists of xla tensors, CPU
  tensors and plain values) to one checkpoint directory and back, in place,
  into the targets' own shardings;
* :class:`CheckpointManager`: periodic, asynchronous, preemption-aware saves
  that never list a half-written step, with fallback to the newest intact one;
* :func:`export` / :func:`import_state_dict`: plain single-file torch and
  safetensors state_dicts, streamed one tensor at a time;
* :func:`load_pretrained` / :func:`save_pretrained`: Hugging Face model
  directories (``model.safetensors`` or an index and its shards), loaded one
  shard file at a time straight into sharded parameters, and saved back in
  the same layout.
* :mod:`spmdtorch.checkpoint.distributed_checkpoint`: PyTorch/XLA's
  ``SPMDSavePlanner``/``SPMDLoadPlanner`` (``torch.distributed.checkpoint``'s
  format) and its ``CheckpointManager`` signature, ``prime_optimizer``.

Example:
    >>> import tempfile, torch, spmdtorch
    >>> from spmdtorch import checkpoint
    >>> model = torch.nn.Linear(4, 2).to("xla")
    >>> d = tempfile.mkdtemp() + "/ckpt"
    >>> checkpoint.save(d, {"model": model.state_dict(), "step": 3})
    >>> checkpoint.load(d, {"model": model.state_dict(), "step": 0})["step"]
    3
"""

from spmdtorch.checkpoint import distributed_checkpoint
from spmdtorch.checkpoint._hf_layout import HfLayout
from spmdtorch.checkpoint._hf_load import PretrainedLoad, UninitializedTensorsError, load_pretrained
from spmdtorch.checkpoint._hf_save import save_pretrained
from spmdtorch.checkpoint._planners import SPMDLoadPlanner, SPMDSavePlanner
from spmdtorch.checkpoint._xla_manager import XlaCheckpointManager, prime_optimizer
from spmdtorch.checkpoint.errors import (
    CheckpointArgumentError,
    CheckpointArgumentTypeError,
    CheckpointCorruptionError,
    CheckpointError,
    CheckpointExistsError,
    CheckpointSaveError,
    CheckpointWriterError,
    DtypeMismatchError,
    KeyMismatchError,
    MissingKeysError,
    NotACheckpointError,
    OverwriteRefusedError,
    ShapeMismatchError,
    StepNotFoundError,
    UnexpectedKeysError,
    UnsafeEntryError,
    UnsupportedValueError,
    ValueKindMismatchError,
)
from spmdtorch.checkpoint.export import export
from spmdtorch.checkpoint.import_state import import_state_dict
from spmdtorch.checkpoint.io import load, save
from spmdtorch.checkpoint.manager import CheckpointManager
from spmdtorch.checkpoint.optim import init_optimizer_state

__all__ = [
    "CheckpointArgumentError",
    "CheckpointArgumentTypeError",
    "CheckpointCorruptionError",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointManager",
    "CheckpointSaveError",
    "CheckpointWriterError",
    "DtypeMismatchError",
    "HfLayout",
    "KeyMismatchError",
    "MissingKeysError",
    "NotACheckpointError",
    "OverwriteRefusedError",
    "PretrainedLoad",
    "SPMDLoadPlanner",
    "SPMDSavePlanner",
    "ShapeMismatchError",
    "StepNotFoundError",
    "UnexpectedKeysError",
    "UninitializedTensorsError",
    "UnsafeEntryError",
    "UnsupportedValueError",
    "ValueKindMismatchError",
    "XlaCheckpointManager",
    "distributed_checkpoint",
    "export",
    "import_state_dict",
    "init_optimizer_state",
    "load",
    "load_pretrained",
    "prime_optimizer",
    "save",
    "save_pretrained",
]
