"""End-to-end: the README's main example runs, trains, and reports its loss.

Each run is a fresh subprocess (the example must configure XLA before JAX
starts), with a few steps of the tiny model so that it stays well under a
minute on a 2-core CPU machine. The child inherits the 8-CPU-device
environment that ``tests/conftest.py`` sets.
"""

from __future__ import annotations

import re
import subprocess

import pytest
from example_runner import RUN_TIMEOUT_S, run_example


def _run(*args: str) -> subprocess.CompletedProcess:
    return run_example("train_llama.py", *args)


# pytest-timeout (pyproject: 300 s) would kill the whole session first; give the
# subprocess timeout room to report which run hung.
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "flags,mesh,embedding_spec",
    [
        # FSDP over all 8 devices: (256, 64) embedding split on dim 0.
        (("--mode", "compiled"), "fsdp=8", "{devices=[8,1]0,1,2,3,4,5,6,7}"),
        # Hybrid: fsdp=4 shards, replicated over data=2; bf16 compute and
        # checkpointed layers, lazily, each layer recorded once (assume_pure).
        # Slow tier (16 s): hybrid meshes, bf16 compute, checkpoint_module and
        # assume_pure each train against eager by default in their own tests.
        pytest.param(
            ("--mode", "lazy", "--mesh", "2,4", "--mixed-precision", "bf16", "--checkpoint-layers", "--assume-pure"),
            "data=2 x fsdp=4",
            "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}",
            marks=pytest.mark.slow,
        ),
        # Deeper, the layer loop as one scan, bf16 compute and remat inside the scan body, compiled.
        # Slow tier (14 s): tests/programs/test_scan.py trains scanned Llamas against eager by default.
        pytest.param(
            ("--mode", "compiled", "--layers", "4", "--scan", "--mixed-precision", "bf16", "--checkpoint-layers"),
            "fsdp=8",
            "{devices=[8,1]0,1,2,3,4,5,6,7}",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["fsdp8-compiled", "hybrid-bf16-remat-lazy", "scan-bf16-remat-compiled"],
)
def test_train_llama_loss_decreases(flags, mesh, embedding_spec, tmp_path):
    ckpt = tmp_path / "ckpt"
    proc = _run("--steps", "8", "--seed", "0", "--checkpoint-dir", str(ckpt), *flags)
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
    assert "devices: 8 x CPU" in out, out
    assert f"mesh: {mesh}" in out, out
    # The sharding table: the embedding's row, with its HLO sharding string.
    row = next(line for line in out.splitlines() if "tok_embeddings.weight" in line)
    assert embedding_spec in row, out
    assert re.search(r"final loss\s*│\s*\d+\.\d+", out), out
    m = re.search(r"first -> last loss\s*│\s*(\d+\.\d+) -> (\d+\.\d+)", out)
    assert m, out
    first, last = float(m.group(1)), float(m.group(2))
    assert last < first, out
    assert "UncachedCompile" in out, out
    assert "OK: loss decreased" in out, out
    # The final sharded checkpoint is a complete Orbax step (listed only once finalised).
    assert f"checkpoint: step 8 saved to {ckpt / '8'}" in out, out
    # Only step 8 (the writer's lock file, .spmdtorch-writer.lock, stays beside the steps: docs/checkpoint.md).
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["8"], list(ckpt.iterdir())


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_train_llama_rejects_bad_mesh():
    proc = _run("--steps", "2", "--mesh", "3,3")
    assert proc.returncode != 0
    assert "--mesh" in proc.stderr, proc.stderr


# examples/train_dtensor.py: torch's FSDP2 + tensor-parallel API through spmdtorch.dtensor (issue 43).
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "flags,mesh",
    [
        # FSDP over dp=2, TP over tp=4, compiled steps, losses checked against an eager CPU copy.
        (("--steps", "4", "--compare-eager"), "dp=2 x tp=4"),
        # FSDP only, lazy steps, 2 micro-batches per step through accumulate_gradients.
        # Slow tier: accumulate_gradients trains against eager in tests/partition and tests/dtensor.
        pytest.param(
            ("--steps", "3", "--mesh", "8,1", "--mode", "lazy", "--grad-accum", "2", "--compare-eager"),
            "dp=8 x tp=1",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["fsdp-tp-compiled", "fsdp-accumulate-lazy"],
)
def test_train_dtensor_matches_eager(flags, mesh):
    proc = run_example("train_dtensor.py", *flags)
    out = proc.stdout
    assert proc.returncode == 0, (
        f"exit code {proc.returncode}\n--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    )
    assert f"mesh: {mesh}" in out, out
    # The parameter table: a column-wise weight carries FSDP's and TP's placements.
    row = next(line for line in out.splitlines() if "layers.0.attention.wq.weight" in line)
    assert "Shard(dim=0)" in row, out
    m = re.search(r"max \|loss - eager loss\|: (\S+)", out)
    assert m and float(m.group(1)) <= 1e-3, out
    if "--mode" not in flags:  # compiled: traced until two traces agree, then replayed
        m = re.search(r"compiled steps replayed: (\d+) of 4", out)
        assert m and int(m.group(1)) >= 1, out
    assert "OK: loss decreased" in out, out


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_train_dtensor_rejects_bad_mesh():
    proc = run_example("train_dtensor.py", "--mesh", "3")
    assert proc.returncode != 0
    assert "--mesh" in proc.stderr, proc.stderr


# Each example as one job of 2 processes x 4 devices under python -m spmdtorch.launch: the devices come from
# the launcher (the example simulates none of its own), the mesh spans the job's 8 devices and the processes
# share process 0's files. Slow tier (~50 s each on a loaded 2-core machine: two processes, each compiling).
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.parametrize(
    "name,flags,expected",
    [
        # No --checkpoint-dir: both processes save into process 0's default directory.
        ("train_llama.py", ("--steps", "3", "--mode", "lazy"), ("mesh: fsdp=8", "OK: loss decreased")),
        ("generate.py", ("--new-tokens", "4", "--layers", "1"), ("mesh: tp=8", "OK: tokens equal eager CPU")),
        ("finetune_hf.py", ("--steps", "2", "--layers", "1"), ("mesh: fsdp=8", "reloaded max |param diff| │ 0 ")),
    ],
    ids=["train_llama", "generate", "finetune_hf"],
)
def test_example_runs_as_two_process_job(name, flags, expected, tmp_path):
    proc = run_example(name, *flags, nprocs=2, devices_per_proc=4, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit code {proc.returncode}\n{out[-6000:]}"
    for rank in (0, 1):
        lines = "\n".join(line for line in out.splitlines() if line.startswith(f"[rank {rank}] "))
        assert "devices: 8 x CPU" in lines, out[-6000:]
        for text in expected:
            assert text in lines, out[-6000:]
    if name == "train_llama.py":
        (ckpt,) = (tmp_path / "checkpoints").iterdir()  # one directory: process 0's name
        assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["3"], list(ckpt.iterdir())
