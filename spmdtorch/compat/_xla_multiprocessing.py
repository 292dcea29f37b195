"""``torch_xla.distributed.xla_multiprocessing`` (``xmp``): multiprocess mode, refused with the SPMD way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from spmdtorch.compat.errors import MultiprocessNotSupportedError

__all__ = ["spawn"]


def spawn(
    fn: Callable[..., Any],
    args: tuple[Any, ...] = (),
    nprocs: int | None = None,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
) -> Any:
    """Refused: ``xmp.spawn`` starts one process per device (multiprocess mode).

    Raises:
        MultiprocessNotSupportedError: always; the message gives the SPMD equivalent.
    """
    raise MultiprocessNotSupportedError(
        f"xmp.spawn({getattr(fn, '__name__', 'fn')}, ...) starts one process per device (PyTorch/XLA's "
        "multiprocess mode); spmdtorch runs SPMD only, where one process per host drives every device. Call "
        f"{getattr(fn, '__name__', 'fn')}(0, *args) directly and make the step data parallel by sharding its "
        "batch: mesh = xs.Mesh(np.arange(xr.global_runtime_device_count()), (n, 1), ('data', 'model')); "
        "pl.MpDeviceLoader(loader, device, input_sharding=xs.ShardingSpec(mesh, ('data', None))); replace "
        "xm.optimizer_step's gradient all-reduce by nothing (the partitioner reduces). Several hosts: run the "
        "script once per host (python -m spmdtorch.launch --nprocs N simulates that)"
    )
