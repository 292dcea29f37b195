"""``python -m spmdtorch.compat script.py args...``: run a PyTorch/XLA script on spmdtorch.

Installs the compatibility layer, sets ``sys.argv`` to ``[script.py, args...]``
and runs the script as ``__main__`` (``runpy.run_path``), so it runs unchanged.
``-m module`` runs a module instead (``python -m spmdtorch.compat -m pkg.train``).
A multi-process job runs it as the launcher's module:
``python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 -m spmdtorch.compat script.py args...``.
"""

from __future__ import annotations

import runpy
import sys

import spmdtorch.compat

USAGE = "usage: python -m spmdtorch.compat script.py [args...] | -m module [args...]"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        raise SystemExit(0 if args else 2)
    spmdtorch.compat.install()
    if args[0] == "-m":
        if len(args) < 2:
            print(USAGE, file=sys.stderr)
            raise SystemExit(2)
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    sys.argv = args
    # The script's directory goes first on the path, as `python script.py` does.
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
    runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main()
