"""``torch_xla.distributed.xla_backend``: the ``xla://`` rendezvous for CPU process groups, no ``xla`` backend.

Importing it (as PyTorch/XLA scripts do) registers with ``torch.distributed``:

* the ``xla://`` init method, which finds rank, world size and master address
  from the job (``xr.process_index()``, ``xr.process_count()``, process 0's
  host; port ``MASTER_PORT`` or 12355), as PyTorch/XLA's SPMD mode does for the
  ``gloo`` group that distributed checkpointing uses;
* a ``xla`` backend that raises :class:`XlaBackendNotSupportedError` (a
  :class:`MultiprocessNotSupportedError`, and an ``AssertionError`` as
  PyTorch/XLA's refusal of it in SPMD mode is): it is multiprocess DDP's
  collective backend, which an SPMD program does not use.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from spmdtorch import config, runtime
from spmdtorch.compat.errors import MultiprocessNotSupportedError

__all__ = ["XLA_INIT_METHOD", "XlaBackendNotSupportedError", "register"]

XLA_INIT_METHOD = "xla://"


class XlaBackendNotSupportedError(MultiprocessNotSupportedError, AssertionError):
    """``dist.init_process_group('xla')``: refused, as PyTorch/XLA refuses it in SPMD mode (an ``AssertionError``)."""


_DEFAULT_PORT = 12355


def _master_host() -> str:
    addr = config.read_one("coordinator_address") or config.read_one("master_addr")
    if addr:
        return str(addr).rsplit(":", 1)[0]
    return "localhost"


def _xla_rendezvous(
    url: str, timeout: datetime.timedelta = datetime.timedelta(minutes=5), **kwargs: Any
) -> Iterator[Any]:
    rank, world = runtime.process_index(), runtime.process_count()
    port = config.read_one("master_port") or _DEFAULT_PORT
    store = dist.TCPStore(_master_host(), int(port), world, rank == 0, timeout=timeout)
    yield store, rank, world


def _xla_backend(*args: Any, **kwargs: Any) -> Any:
    raise XlaBackendNotSupportedError(
        "dist.init_process_group('xla', ...) is PyTorch/XLA's multiprocess DDP backend; spmdtorch runs SPMD only "
        "and its programs need no process-group collectives on devices. Drop DDP and the 'xla' process group: "
        "shard the batch over a mesh (xs.mark_sharding or pl.MpDeviceLoader(..., input_sharding=...)) and call "
        "optimizer.step(); the partitioner all-reduces the gradients. A CPU group for checkpoints is still "
        "fine: dist.init_process_group('gloo', init_method='xla://')"
    )


def register() -> None:
    """Registers ``xla://`` and the refusing ``xla`` backend with ``torch.distributed`` (idempotent)."""
    if not dist.is_available():  # pragma: no cover - torch built without distributed
        return
    try:
        dist.register_rendezvous_handler("xla", _xla_rendezvous)
    except RuntimeError:
        pass  # already registered
    if "xla" not in dist.Backend.backend_list:
        dist.Backend.register_backend("xla", _xla_backend, devices=["cpu"])


register()
