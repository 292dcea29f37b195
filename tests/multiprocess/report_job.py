"""Prints what this process joined, without any init call: ``RESULT [index, count, global, local, source]``.

Run under any launcher (tests/multiprocess/test_auto_join.py runs it under real torchrun).
"""

import json
import os

import spmdtorch.runtime as xr

if __name__ == "__main__":
    cfg = xr._distributed._DISTRIBUTED[0]
    counts = [
        xr.process_index(),
        xr.process_count(),
        xr.global_runtime_device_count(),
        xr.addressable_runtime_device_count(),
    ]
    # One write(2) of the whole line: torchrun's workers share one stdout pipe, and print() under
    # PYTHONUNBUFFERED writes the text and its newline separately, so two ranks' lines could interleave.
    line = "RESULT " + json.dumps([*counts, None if cfg is None else cfg.source]) + "\n"
    os.write(1, line.encode())
