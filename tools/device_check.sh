#!/usr/bin/env bash
# The GPU checks of the "Performance" issue in one command, sized for a
# 15-minute device lease (about 6 minutes on an H200, start not counted):
#
#   1. tests/accelerator (float32 matmul precision mapping, bf16 products,
#      cuDNN attention, .cpu() of an xla tensor on the GPU);
#   2. benchmarks/train_step.py --configs 1b (the 1.1B decoder in bf16,
#      spmdtorch compiled vs the JAX twin, 2 rounds; tokens/s, MFU, and the
#      GPU's idle share read off a profiler trace, "device idle");
#   3. benchmarks/train_step.py --configs tiny (host-bound size), if time is left.
#
# Runs from the repository root on the device machine, in its own Python
# (torch and jax with CUDA are installed there; spmdtorch from this tree).
# Logs and --json results go to $OUT (or ./device_out when OUT is unset).
# Each step has its own time limit, so one hang cannot eat the lease.
#
# Usage (the device tool):  bash tools/device_check.sh [1b modes, default: compiled]
set -u
OUT=${OUT:-device_out}
mkdir -p "$OUT"
MODES=${1:-compiled}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())"

echo "== tests/accelerator"
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/accelerator -rs >"$OUT/accel.log" 2>&1
echo "rc=$?"
tail -4 "$OUT/accel.log"

export JAX_PLATFORMS=cuda PJRT_DEVICE=CUDA
echo "== train_step 1b ($MODES)"
timeout 330 python3 benchmarks/train_step.py --configs 1b --rounds 2 --blocks 5 --steps 10 \
    --modes "$MODES" --json "$OUT/1b.json" --markdown >"$OUT/bench1b.log" 2>&1
echo "rc=$?"
cut -c1-400 "$OUT/bench1b.log" | tail -20

echo "== train_step tiny"
timeout 90 python3 benchmarks/train_step.py --configs tiny --rounds 1 --blocks 5 --steps 20 \
    --modes lazy,compiled --json "$OUT/tiny.json" >"$OUT/benchtiny.log" 2>&1
echo "rc=$?"
tail -12 "$OUT/benchtiny.log"
