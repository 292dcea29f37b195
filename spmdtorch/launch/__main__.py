"""``python -m spmdtorch.launch``: run a script as N local processes of one job.

Usage:
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 train.py --steps 5
    python -m spmdtorch.launch --nprocs 2 -m mypkg.train
    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 -m spmdtorch.compat torch_xla_script.py

The last runs an unchanged PyTorch/XLA script: ``-m spmdtorch.compat`` is the
module each process runs, and it runs the script after installing the
compatibility layer (docs/migrating-from-torch-xla.md).

The exit status is 0 when every process succeeded, else that of the first
process that failed.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from spmdtorch.launch.local import DEFAULT_GRACE_PERIOD_S, launch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spmdtorch.launch",
        usage="python -m spmdtorch.launch [options] (script.py | -m module) [args...]",
        description="Run a script as N processes of one spmdtorch job on this machine, each with "
        "K simulated CPU devices. Importing spmdtorch joins the job (no init call needed).",
        epilog="A PyTorch/XLA script (import torch_xla...) runs unchanged through the compatibility layer: "
        "python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 -m spmdtorch.compat train.py [args...] "
        "(see docs/migrating-from-torch-xla.md).",
    )
    p.add_argument("--nprocs", type=int, required=True, help="number of processes")
    p.add_argument("--devices-per-proc", type=int, default=1, help="simulated CPU devices per process")
    p.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        help="seconds between the first failure and SIGKILL for the others",
    )
    p.add_argument("--port", type=int, default=None, help="coordinator port (default: a free one)")
    p.add_argument(
        "--heartbeat-timeout", type=int, default=None, help="seconds without a heartbeat before a peer counts as dead"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="stop every process after this many seconds (exit status 124)"
    )
    return p


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Launcher options, then the child's command: from the script (or ``-m``) on.

    Everything after the script belongs to it, even options the launcher
    also has (``--help``, ``--port``...).
    """
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "-m" or not tok.startswith("-"):
            return argv[:i], argv[i:]
        i += 1 if ("=" in tok or tok in ("-h", "--help")) else 2
    return argv, []


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    ours, command = _split(list(sys.argv[1:] if argv is None else argv))
    ns = p.parse_args(ours)
    if ns.nprocs < 1 or ns.devices_per_proc < 1:
        p.error("--nprocs and --devices-per-proc must be >= 1")
    if not command or command == ["-m"]:
        p.error("give a script to run (or -m module) after the launcher's options")
    try:
        result = launch(
            command,
            nprocs=ns.nprocs,
            devices_per_proc=ns.devices_per_proc,
            grace_period_s=ns.grace_period,
            port=ns.port,
            heartbeat_timeout_s=ns.heartbeat_timeout,
            timeout_s=ns.timeout,
        )
    except KeyboardInterrupt:
        return 130
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
