"""Local multi-process launcher: simulate a multi-host job on one machine.

``python -m spmdtorch.launch --nprocs N --devices-per-proc K script.py args...``
starts N processes on 127.0.0.1, each with K simulated CPU devices, that
join one job when the script imports spmdtorch (no init call needed; see
:func:`spmdtorch.runtime.auto_initialize_distributed`). See :mod:`.local`.

Example:
    >>> from spmdtorch.launch import launch
    >>> launch(["-c", "print('hi')"], nprocs=2).returncode     # doctest: +SKIP
    0
"""

from spmdtorch.launch.local import (
    LaunchError,
    LaunchResult,
    RankResult,
    child_env,
    describe_exit,
    free_port,
    launch,
)

__all__ = ["LaunchError", "LaunchResult", "RankResult", "child_env", "describe_exit", "free_port", "launch"]
