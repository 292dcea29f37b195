"""Hugging Face Trainer (FSDPv2 on XLA) and accelerate run unchanged under ``python -m spmdtorch.compat``.

Each XLA run is a fresh process of ``tests/compat/_hf_runs.py`` under compat on
the 8 simulated CPU devices (transformers and accelerate decide at import
whether torch_xla exists, so they cannot share this process); the reference is
the same script under plain ``python`` on the CPU, same data and seed. Losses
must agree to 4 decimals, and what the libraries saved must equal the weights
the run ended with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_hf_runs.py")
RUN_TIMEOUT_S = 240
WRAPPER_PREFIX = "_orig_module."  # PyTorch/XLA's FSDPv2 keeps the wrapped module there, so its keys carry it


def _run(out: Path, *args: str, compat: bool, env_extra: dict[str, str] | None = None) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(env_extra or {})
    cmd = [sys.executable, *(["-m", "spmdtorch.compat"] if compat else []), str(SCRIPT), args[0], str(out), *args[1:]]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} did not finish in {RUN_TIMEOUT_S}s: {str(e.stderr)[-3000:]}")
    assert proc.returncode == 0, f"{args} (compat={compat}): exit {proc.returncode}\n{proc.stderr[-4000:]}"
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    result["trained"] = torch.load(out / "trained.pt")
    return result


def _strip(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k.replace(WRAPPER_PREFIX, ""): v for k, v in state.items()}


def _assert_same_weights(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], **tol: float) -> None:
    assert sorted(actual) == sorted(expected)
    for k in expected:
        torch.testing.assert_close(actual[k], expected[k], msg=lambda m, k=k: f"{k}: {m}", **tol)


@pytest.fixture(scope="module")
def trainer_cpu(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("cpu"), "trainer", "cpu", compat=False)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
# the gradient-checkpointing variant (~45 s here) runs in the slow tier, keeping the default one under a minute
@pytest.mark.parametrize("mode", ["fsdpv2", pytest.param("fsdpv2_ckpt", marks=pytest.mark.slow)])
def test_trainer_fsdpv2_matches_cpu_trainer_and_saves_what_it_trained(mode, tmp_path, trainer_cpu):
    xla = _run(tmp_path, "trainer", mode, compat=True)
    assert xla["device"] == "xla:0"
    assert len(xla["losses"]) == len(trainer_cpu["losses"]) > 1
    assert xla["losses"] == pytest.approx(trainer_cpu["losses"], abs=1e-4)
    # trained weights: the CPU run's, to float32 noise (8-way sharded sums in another order, which Adam's
    # normalised update amplifies where a gradient is near 0; each weight moved ~3e-2 from its start)
    _assert_same_weights(xla["trained"], trainer_cpu["trained"], rtol=1e-4, atol=1e-4)

    # Trainer.save_model writes what PyTorch/XLA's FSDPv2 gives: the wrapper's keys, the trained values
    saved = torch.load(tmp_path / "saved" / "pytorch_model.bin")
    assert all(k.startswith(WRAPPER_PREFIX) for k in saved)
    _assert_same_weights(_strip(saved), xla["trained"], rtol=0, atol=0)
    # (stripped of the prefix, the keys are the plain model's: the documented one-line fix)

    # save_pretrained of the unwrapped xla model round-trips through from_pretrained
    assert (tmp_path / "pretrained" / "config.json").exists()
    _assert_same_weights(torch.load(tmp_path / "reloaded.pt"), xla["trained"], rtol=0, atol=0)


@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_accelerate_xla_loop_matches_cpu_and_saves_every_key(tmp_path):
    from safetensors.torch import load_file

    cpu = _run(tmp_path / "cpu", "accelerate", compat=False, env_extra={"HF_RUNS_CPU": "1"})
    xla = _run(tmp_path / "xla", "accelerate", compat=True)
    assert xla["device"] == "xla:0 DistributedType.XLA"
    assert xla["losses"] == pytest.approx(cpu["losses"], abs=1e-4)
    _assert_same_weights(xla["trained"], cpu["trained"], rtol=1e-4, atol=1e-5)
    # every parameter saved (three equal-size layers: none taken for an alias of another), with its trained value
    saved = load_file(tmp_path / "xla" / "saved" / "model.safetensors")
    assert sorted(saved) == [f"{i}.{p}" for i in (0, 2, 4) for p in ("bias", "weight")]
    _assert_same_weights(saved, xla["trained"], rtol=0, atol=0)
    # save_state then load_state (after the weights were changed) brings the trained weights back
    _assert_same_weights(torch.load(tmp_path / "xla" / "restored.pt"), xla["trained"], rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.timeout(2 * RUN_TIMEOUT_S + 60)
def test_trainer_fsdpv2_evaluation_and_checkpoints_match_cpu(tmp_path):
    cpu = _run(tmp_path / "cpu", "trainer_eval", "cpu", compat=False)
    xla = _run(tmp_path / "xla", "trainer_eval", "fsdpv2", compat=True)
    # evaluated at step 2 and at the last step (3), in both runs
    assert xla["eval_steps"] == cpu["eval_steps"] == [2, 3]
    assert len(xla["losses"]) == len(cpu["losses"]) == 2
    assert xla["losses"] == pytest.approx(cpu["losses"], abs=1e-4)
    _assert_same_weights(_strip(xla["trained"]), cpu["trained"], rtol=1e-4, atol=1e-4)
    # the step-2 checkpoint: xm.save wrote the optimizer state as CPU tensors, equal to the CPU run's
    opt_xla = torch.load(tmp_path / "xla" / "checkpoint-2" / "optimizer.pt")
    opt_cpu = torch.load(tmp_path / "cpu" / "checkpoint-2" / "optimizer.pt")
    assert opt_xla["param_groups"] == opt_cpu["param_groups"]
    assert sorted(opt_xla["state"]) == sorted(opt_cpu["state"])
    for i, state in opt_cpu["state"].items():
        for key, value in state.items():
            got = opt_xla["state"][i][key]
            assert got.device.type == "cpu"
            torch.testing.assert_close(got, value, rtol=1e-3, atol=1e-6, msg=lambda m, i=i, key=key: f"{i}.{key}: {m}")
