"""PyTorch/XLA's ``torch_xla.experimental.distributed_checkpoint`` names.

* ``SPMDSavePlanner`` / ``SPMDLoadPlanner``: planners for
  ``torch.distributed.checkpoint.save/load`` that write each process's shards
  of spmdtorch tensors and read them back into any sharding, in place
  (DCP's file format).
* ``CheckpointManager(path, save_interval, max_to_keep=0, ...)``: ``save``,
  ``save_async``, ``restore(step, state_dict)``, ``all_steps``, ``join``,
  ``reached_preemption`` (spmdtorch's Orbax format).
* ``prime_optimizer(optimizer)``: state entries for a fresh optimizer.
* ``sharded_cpu_state_dict(state_dict)``: a host snapshot without gathering
  (sharded tensors as :class:`CpuShards`, this process's shards), which
  ``SPMDSavePlanner`` saves like the tensors themselves; ``is_sharded(value)``.

Example:
    >>> import tempfile, torch, spmdtorch
    >>> import torch.distributed.checkpoint as dist_cp
    >>> import spmdtorch.checkpoint.distributed_checkpoint as xc
    >>> model = torch.nn.Linear(4, 2).to("xla")
    >>> d = tempfile.mkdtemp()
    >>> _ = dist_cp.save({"model": model.state_dict()}, checkpoint_id=d, planner=xc.SPMDSavePlanner())
    >>> state = {"model": torch.nn.Linear(4, 2).to("xla").state_dict()}
    >>> dist_cp.load(state, checkpoint_id=d, planner=xc.SPMDLoadPlanner())
    >>> torch.equal(state["model"]["bias"].cpu(), model.bias.cpu())
    True
"""

from spmdtorch.checkpoint._cpu_shards import CpuShards, is_sharded, sharded_cpu_state_dict
from spmdtorch.checkpoint._planners import SPMDLoadPlanner, SPMDSavePlanner
from spmdtorch.checkpoint._xla_manager import XlaCheckpointManager as CheckpointManager
from spmdtorch.checkpoint._xla_manager import prime_optimizer

__all__ = [
    "CheckpointManager",
    "CpuShards",
    "SPMDLoadPlanner",
    "SPMDSavePlanner",
    "is_sharded",
    "prime_optimizer",
    "sharded_cpu_state_dict",
]
