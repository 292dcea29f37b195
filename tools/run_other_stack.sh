#!/usr/bin/env bash
# Runs spmdtorch's core tests against another Python / jax / torch / orbax in a
# throwaway virtual environment (removed afterwards unless --keep), so a
# version bump is tried without touching the environment you work in.
#
#   tools/run_other_stack.sh [--python 3.12.1] [--jax 0.12.1] [--torch 2.14.1]
#                            [--orbax 0.12.8] [--keep DIR]
#                            [-- PYTEST ARGS...]
#
# --python   a version pyenv knows (PYENV_VERSION=... python), or a path to a
#            python executable.
# torch comes with the CUDA wheels (nvidia-*, triton; ~2.9 GB downloaded,
#            ~6 GB venv for 2.14.1) even for CPU-only tests: PyPI's Linux torch
#            wheel links against them (without them `import torch` fails:
#            libcudnn.so.9 not found), and PyTorch's CPU wheel index is not
#            always reachable. Where it is, pass PIP_EXTRA_INDEX_URL.
# --keep DIR build the venv in DIR and keep it (reused when it exists).
# PYTEST ARGS default to the core subset: tests/lazy tests/tensor
#            tests/sharding tests/programs tests/test_jax_private.py
#            tests/test_jax_changes.py tests/ops/test_manual_private_jax.py.
#
# Prints the versions, the install time and the pytest summary; exits with
# pytest's status (or 10 when the install fails), so it can gate a CI step.
# Exact versions only: a range would let a new release change the result.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=3.12.1 JAX=0.12.1 TORCH=2.14.1 ORBAX=0.12.8 KEEP=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY=$2; shift 2 ;;
    --jax) JAX=$2; shift 2 ;;
    --torch) TORCH=$2; shift 2 ;;
    --orbax) ORBAX=$2; shift 2 ;;
    --keep) KEEP=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "run_other_stack.sh: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
if [ $# -eq 0 ]; then
  set -- tests/lazy tests/tensor tests/sharding tests/programs tests/test_jax_private.py \
    tests/test_jax_changes.py tests/ops/test_manual_private_jax.py
fi

if [ -x "$PY" ]; then BASE=("$PY"); else BASE=(env PYENV_VERSION="$PY" python); fi
if [ -n "$KEEP" ]; then
  VENV=$KEEP
else
  VENV=$(mktemp -d -t spmdtorch-stack-XXXXXX)
  trap 'rm -rf "$VENV"' EXIT
fi

start=$(date +%s)
fail_install() { echo "run_other_stack.sh: installing $1 failed (python $PY, jax $JAX, torch $TORCH, orbax $ORBAX)" >&2; exit 10; }
if [ ! -x "$VENV/bin/python" ]; then
  "${BASE[@]}" -m venv "$VENV" || fail_install "the venv"
fi
P=$VENV/bin/python
"$P" -m pip install -q "torch==$TORCH" || fail_install "torch $TORCH"
# spmdtorch's dependencies and test extras at the versions under test; then
# spmdtorch itself without deps (its pins are what this script is checking).
# accelerate requires torch: --no-deps keeps pip from reinstalling torch's CUDA wheels.
"$P" -m pip install -q "jax==$JAX" "jaxlib==$JAX" "orbax-checkpoint==$ORBAX" numpy einops safetensors rich tqdm \
  protobuf pytest expecttest pytest-timeout "pytest-xdist>=3.6" hypothesis "transformers>=4.40" \
  "import-linter==2.17" psutil huggingface-hub pyyaml || fail_install "jax $JAX / orbax $ORBAX / test extras"
"$P" -m pip install -q --no-deps "accelerate>=1.0" || fail_install "accelerate"
# --ignore-requires-python: a Python outside the pins is what this script is for.
"$P" -m pip install -q --no-deps --ignore-requires-python -e . || fail_install "spmdtorch"
installed=$(($(date +%s) - start))

"$P" -c "import sys, torch, jax, jaxlib, orbax.checkpoint as o; print('python', sys.version.split()[0], 'torch', torch.__version__, 'jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'orbax', o.__version__)"
echo "install: ${installed}s, venv $(du -sh "$VENV" | cut -f1)"
start=$(date +%s)
set +e
"$P" -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
echo "tests: $(($(date +%s) - start))s, pytest exit status $rc"
# The editable install left spmdtorch's entry in this venv only; nothing to undo in the tree.
exit $rc
