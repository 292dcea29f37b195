"""``benchmarks/_train_setup.py`` and the PyTorch/XLA worker's helpers, without PyTorch/XLA.

The PyTorch/XLA worker of ``benchmarks/train_step.py`` runs in an interpreter
with torch_xla and without jax or spmdtorch: the shared setup must build the
same model and batch there as in spmdtorch's own workers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCH))

import _ptxla_worker  # noqa: E402
import _train_setup  # noqa: E402


def _fingerprint(model, tokens) -> list:
    return [sum(float(p.detach().double().sum()) for p in model.parameters()), int(tokens.sum())]


@pytest.mark.timeout(120)
def test_setup_without_jax_builds_the_same_model():
    # sys.modules["jax"] = None: find_spec and import both say jax is absent, as
    # in PyTorch/XLA's interpreter; the decoder then loads from its file.
    code = (
        "import json, sys; sys.modules['jax'] = None; "
        f"sys.path.insert(0, {str(_BENCH)!r}); import _train_setup as s; "
        "cfg, model, tokens = s.setup('tiny', 8); "
        "print(json.dumps([sum(float(p.detach().double().sum()) for p in model.parameters()), int(tokens.sum()), "
        "cfg.ffn_dim, type(model).__module__, 'spmdtorch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    weights, token_sum, ffn_dim, module, imported_spmdtorch = json.loads(out.stdout.strip().splitlines()[-1])
    assert not imported_spmdtorch and module == "_train_setup_llama"
    cfg, model, tokens = _train_setup.setup("tiny", 8)  # here spmdtorch is imported: the package's module
    assert type(model).__module__ == "spmdtorch.models.llama"
    assert ffn_dim == cfg.ffn_dim == 176  # 172 rounded up to a multiple of 8 devices
    assert [weights, token_sum] == pytest.approx(_fingerprint(model, tokens), rel=1e-12)


@pytest.mark.parametrize(
    "shape,spec,expected",
    [
        ((256, 64), "{devices=[8,1]0,1,2,3,4,5,6,7}", 32 * 64),
        ((64, 176), "{devices=[1,8]0,1,2,3,4,5,6,7}", 64 * 22),
        ((10,), "{devices=[8]0,1,2,3,4,5,6,7}", 2),  # uneven: the largest shard
        ((64, 64), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", 16 * 64),
        ((64,), "{replicated}", 64),
        ((3, 5), "", 15),
    ],
)
def test_ptxla_shard_numel_reads_the_tile_assignment(shape, spec, expected):
    assert _ptxla_worker._shard_numel(torch.empty(shape), spec) == expected
