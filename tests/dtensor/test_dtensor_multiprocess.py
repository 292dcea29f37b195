"""examples/train_dtensor.py gives the single-process losses as a 2-process job, under both launchers (issue 43, item 7).

The same script and flags run three ways: one process with 8 simulated CPU
devices, ``python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4`` and
``torchrun --nproc-per-node 2`` with ``SPMDTORCH_CPU_DEVICES=4``; each
process of a job prints the losses of the whole (dp=2 x tp=4) job. Each run
is a fresh process group killed with SIGKILL when it passes its limit: JAX
traps SIGTERM in a multi-process job, so a hung collective would otherwise
outlive the test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest
from example_runner import EXAMPLES, ROOT

from spmdtorch.launch import free_port

# Seconds each run may take (about 20 s alone, 30-40 s as a job, on an idle 2-core machine).
RUN_LIMIT_S = 240
# Few steps of the example's tiny model: enough for AdamW to move the loss and for a compiled replay.
FLAGS = ["--mesh", "2,4", "--steps", "3"]


def _env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (each launcher sets its own), plus ``extra``."""
    launcher = ("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR", "SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in ("RANK", "WORLD_SIZE")}
    env.update(extra)
    return env


def _run(cmd: list[str], env: dict[str, str]) -> str:
    """Runs ``cmd`` in its own process group; SIGKILLs the group after RUN_LIMIT_S. Returns stdout + stderr."""
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=RUN_LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every worker
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish in {RUN_LIMIT_S} s:\n{out[-4000:]}", pytrace=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}: exit status {proc.returncode}\n{out[-4000:]}"
    return out


def _losses(out: str, prefix: str) -> list[tuple[str, list[float]]]:
    """``(line prefix, losses)`` of every ``losses:`` line; ``prefix`` matches what a launcher puts before it."""
    found = re.findall(rf"^({prefix})losses: (.*)$", out, flags=re.MULTILINE)
    return [(who, [float(v) for v in values.split()]) for who, values in found]


@pytest.mark.slow
@pytest.mark.timeout(3 * RUN_LIMIT_S + 60)
def test_train_dtensor_two_processes_give_the_single_process_losses():
    script = str(EXAMPLES / "train_dtensor.py")
    single = _run([sys.executable, script, *FLAGS], _env())
    assert "devices: 8 x CPU" in single, single[-4000:]
    ((_, expected),) = _losses(single, "")
    assert len(expected) == 3 and expected[-1] < expected[0], expected

    launched = _run(
        [sys.executable, "-m", "spmdtorch.launch", "--nprocs", "2", "--devices-per-proc", "4", script, *FLAGS],
        _env(),
    )
    torchrun = _run(
        [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
            "--tee", "3", script, *FLAGS,
        ],
        _env(SPMDTORCH_CPU_DEVICES="4"),
    )  # fmt: skip
    # spmdtorch.launch prefixes each line "[rank i] ", torchrun's --tee "[default<i>]:".
    for out, prefix, ranks in (
        (launched, r"\[rank \d\] ", ["[rank 0] ", "[rank 1] "]),
        (torchrun, r"\[default\d\]:", ["[default0]:", "[default1]:"]),
    ):
        found = _losses(out, prefix)
        assert sorted(who for who, _ in found) == ranks, out[-4000:]
        assert "devices: 8 x CPU over 2 processes" in out, out[-4000:]
        # The processes of one job hold the same replicated loss: bit for bit.
        assert found[0][1] == found[1][1], found
        # Against the single process: the same program, but the cross-process part of each all-reduce
        # goes through gloo, which may add the two processes' partial sums in another order than XLA:CPU
        # does in one process, so allow float32 rounding. Measured on this stack: bit for bit the same.
        assert found[0][1] == pytest.approx(expected, rel=1e-5, abs=0), (found, expected)
