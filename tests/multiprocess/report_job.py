"""Prints what this process joined, without any init call: ``RESULT [index, count, global, local, source]``.

Run under any launcher (tests/multiprocess/test_auto_join.py runs it under real torchrun).
"""

import json

import spmdtorch.runtime as xr

if __name__ == "__main__":
    cfg = xr._DISTRIBUTED[0]
    counts = [
        xr.process_index(),
        xr.process_count(),
        xr.global_runtime_device_count(),
        xr.addressable_runtime_device_count(),
    ]
    print("RESULT " + json.dumps([*counts, None if cfg is None else cfg.source]), flush=True)
