"""The PyTorch/XLA-style training scripts in examples/torch_xla_style/ run unchanged under ``python -m spmdtorch.compat``.

Each runs in a fresh subprocess with a hard timeout and small sizes; the child
inherits the 8-CPU-device environment of tests/conftest.py. The 2-D sharded
DCP script also runs as a 2 x 4 job of ``python -m spmdtorch.launch`` (no
init call in it) and must end where the single-process run ends.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from spmdtorch.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "torch_xla_style"
RUN_TIMEOUT_S = 300


def _run(script: str, *args: str) -> str:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    # The gloo group of `init_method="xla://"` listens on MASTER_PORT: a free one, not the shared default.
    env["MASTER_PORT"] = str(free_port())
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "spmdtorch.compat", str(EXAMPLES / script), *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script} did not finish in {RUN_TIMEOUT_S}s: {str(e.stdout)[-3000:]} {str(e.stderr)[-3000:]}")
    assert proc.returncode == 0, f"{script}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _first_last(out: str) -> tuple[float, float]:
    m = re.search(r"first -> last loss: (\d+\.\d+) -> (\d+\.\d+)", out)
    assert m, out
    return float(m.group(1)), float(m.group(2))


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
@pytest.mark.slow
def test_fsdpv2_decoder_script_trains():
    out = _run("train_fsdpv2_decoder.py", "--steps", "6", "--batch-size", "8", "--seq", "16", "--dim", "32")
    first, last = _first_last(out)
    assert last < first, out
    assert "weight sharding: {devices=[8,1]0,1,2,3,4,5,6,7}" in out, out
    assert out.count("step ") == 6 and "Counter: MarkStep" in out, out


# Slow tier (14 s): data-parallel convolution nets train against eager by default
# in tests/models/test_resnet.py; the compat names in the decoder script's test.
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_data_parallel_cnn_script_trains():
    out = _run("train_cnn_data_parallel.py", "--epochs", "2", "--samples", "128")
    first, last = _first_last(out)
    assert last < first, out
    assert "input sharding: {devices=[8,1,1,1]0,1,2,3,4,5,6,7}" in out, out
    assert float(re.search(r"train accuracy: (\d\.\d+)", out).group(1)) > 0.5, out


# --- 2-D sharded model, CheckpointManager resume, DCP export (train_2d_sharded_dcp.py) ---

DCP_SCRIPT = "train_2d_sharded_dcp.py"
DCP_ARGS = ("--steps", "6", "--save-interval", "2")
LAUNCH_LIMIT_S = 150


def _dcp_run(tmp: Path, name: str, *extra: str) -> tuple[str, Path]:
    params = tmp / f"{name}.pt"
    out = _run(DCP_SCRIPT, "--ckpt-dir", str(tmp / name), *DCP_ARGS, *extra, "--params-out", str(params))
    return out, params


def _assert_finished(out: str, processes: int) -> None:
    for rank in range(processes):
        assert f"process {rank} of {processes}: runtime devices 8" in out, out[-4000:]
    assert "fc1 weight sharding: {devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}" in out, out[-4000:]
    assert "fc2 weight sharding: {devices=[1,2,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}" in out, out[-4000:]
    assert "DCP export reloaded equal: True" in out and "final steps: 6" in out, out[-4000:]


def _losses(out: str) -> dict[int, float]:
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r"step (\d+) loss (\d+\.\d+)", out)}


class DcpRun(NamedTuple):
    out: str
    params: dict[str, torch.Tensor]
    ckpt_dir: Path


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> DcpRun:
    """One uninterrupted single-process run of 6 steps: its output, final parameters and checkpoint directory."""
    tmp = tmp_path_factory.mktemp("dcp")
    out, params = _dcp_run(tmp, "uninterrupted")
    _assert_finished(out, 1)
    return DcpRun(out, torch.load(params), tmp / "uninterrupted")


def _assert_same_params(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], exact: bool) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        if exact:
            assert torch.equal(got[name], want[name]), name
        else:  # across processes the partitioner's all-reduces add in another order
            torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-6, msg=name)


def _eager_reference(steps: int) -> dict[str, torch.Tensor]:
    """The script's training in eager CPU torch, from the script's own model and batches."""
    spec = importlib.util.spec_from_file_location("train_2d_sharded_dcp", EXAMPLES / DCP_SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # imports torch_xla (compat is installed) and defines; main() does not run
    torch.manual_seed(0)
    model = script.MLP(16, 32, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = script.batch(step, 16, 16)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


def _truncated_copy(ckpt_dir: Path, step: int, dest: Path) -> Path:
    """``ckpt_dir``'s CheckpointManager directory holding only ``step``: what a run stopped before the next save leaves."""
    (dest / "train").mkdir(parents=True)
    shutil.copytree(ckpt_dir / "train" / str(step), dest / "train" / str(step))
    return dest


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_2d_sharded_dcp_script_trains_like_eager_torch(uninterrupted):
    out, params, _ = uninterrupted
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6] and losses[6] < losses[1], out
    assert "checkpoint taken at step 2" in out and "checkpoint taken at step 6" in out, out
    _assert_same_params(params, _eager_reference(6), exact=False)


# Slow tier: two processes saving and resuming through DCP are also covered by
# tests/multiprocess/test_auto_join.py (DCP) and test_multiprocess_compat.py (the names).
@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + LAUNCH_LIMIT_S + 90)
def test_2d_sharded_dcp_script_two_process_job_without_init_call_resumes_to_the_uninterrupted_run(
    uninterrupted, tmp_path
):
    ref_out, ref_params, ref_dir = uninterrupted
    # The job starts from the one-process run's step-2 checkpoint (a move from 1 x 8 to 2 x 4: restore reshards).
    job = _truncated_copy(ref_dir, 2, tmp_path / "job")
    params = tmp_path / "job.pt"
    out = _launch("--ckpt-dir", str(job), *DCP_ARGS, "--params-out", str(params))
    # One job of 2 processes x 4 devices, not two jobs of 4: each process sees 8 runtime devices.
    _assert_finished(out, 2)
    assert "[rank 0] process 0 of 2" in out and "[rank 1] process 1 of 2" in out, out[-4000:]
    assert "resumed from step 2" in out and "step 1 loss" not in out, out[-4000:]
    want = {s: v for s, v in _losses(ref_out).items() if s > 2}
    assert _losses(out) == pytest.approx(want, rel=1e-5), out[-4000:]
    _assert_same_params(torch.load(params), ref_params, exact=False)


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_TIMEOUT_S + 60)
def test_2d_sharded_dcp_script_resumes_bit_for_bit(uninterrupted, tmp_path):
    ref_out, ref_params, _ = uninterrupted
    # Preempted after 3 steps: the last checkpoint is step 2 (interval 2).
    out = _run(DCP_SCRIPT, "--ckpt-dir", str(tmp_path / "run"), *DCP_ARGS, "--stop-after", "3")
    assert "checkpoint taken at step 2" in out and "stopped after step 3 of 6" in out, out
    assert "final steps" not in out, out
    out, params = _dcp_run(tmp_path, "run")
    assert "resumed from step 2" in out and "step 1 loss" not in out, out
    _assert_finished(out, 1)
    # The resumed run repeats step 3 from the checkpoint and sees the same batches: the same losses, bit for bit.
    assert _losses(out) == {s: v for s, v in _losses(ref_out).items() if s > 2}, out
    _assert_same_params(torch.load(params), ref_params, exact=True)


def _launch(*args: str) -> str:
    """``python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 -m spmdtorch.compat SCRIPT args``, bounded.

    The launcher SIGKILLs its children at ``--timeout`` (JAX traps SIGTERM);
    if the launcher itself hangs, its whole session is SIGKILLed.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [
        sys.executable, "-m", "spmdtorch.launch", "--nprocs", "2", "--devices-per-proc", "4",
        "--timeout", str(LAUNCH_LIMIT_S), "--grace-period", "5",
        "-m", "spmdtorch.compat", str(EXAMPLES / DCP_SCRIPT), *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=LAUNCH_LIMIT_S + 30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the launched job did not finish:\n" + out[-4000:])
    out = "\n".join(line for line in out.splitlines() if "[Gloo]" not in line)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
@pytest.mark.timeout(3 * LAUNCH_LIMIT_S + 120)
def test_2d_sharded_dcp_script_two_process_job_from_scratch_and_preempted(uninterrupted, tmp_path):
    ref_out, ref_params, _ = uninterrupted
    params = tmp_path / "job.pt"
    out = _launch("--ckpt-dir", str(tmp_path / "job"), *DCP_ARGS, "--params-out", str(params))
    _assert_finished(out, 2)
    assert _losses(out) == pytest.approx(_losses(ref_out), rel=1e-5), out[-4000:]
    _assert_same_params(torch.load(params), ref_params, exact=False)
    # Preempted 2 x 4 job, resumed as a 2 x 4 job.
    out = _launch("--ckpt-dir", str(tmp_path / "again"), *DCP_ARGS, "--stop-after", "3")
    assert "stopped after step 3 of 6" in out, out[-4000:]
    params = tmp_path / "again.pt"
    out = _launch("--ckpt-dir", str(tmp_path / "again"), *DCP_ARGS, "--params-out", str(params))
    assert "resumed from step 2" in out, out[-4000:]
    _assert_finished(out, 2)
    _assert_same_params(torch.load(params), ref_params, exact=False)


def test_launcher_hands_the_compat_module_and_the_script_its_arguments():
    from spmdtorch.launch.__main__ import _split

    argv = ["--nprocs", "2", "--devices-per-proc=4", "-m", "spmdtorch.compat", "train.py", "--nprocs", "9", "-m", "x"]
    assert _split(argv) == (["--nprocs", "2", "--devices-per-proc=4"], argv[3:])
