"""Run PyTorch/XLA's ``examples/`` unchanged under ``spmdtorch.compat`` with small sizes; compare losses with eager CPU.

Usage::

    python tools/torch_xla_examples.py /path/to/pytorch-xla [--only NAME ...] [--timeout 900]

Each example script runs in its own process, as ``python -m spmdtorch.compat
script.py`` would run it, on 8 simulated CPU devices. The scripts are not
edited; the harness only makes them small before they run: the fake batch
that ``xu.SampleGenerator`` repeats is cut to 8 samples (sequences to 128
tokens, images to 32x32), it yields 11 batches, and the decoder examples'
default ``DecoderOnlyConfig`` is a tiny one (hidden 64, 2 layers). Torch's
seed is 42 before the script starts (the FSDPv2 and ResNet scripts do not
seed), so the same script logic run eagerly on CPU (the reference, computed
here from the checkout's ``decoder_only_model.py`` or torchvision's ResNet-50)
gives the losses the script must print at steps 0 and 10. The examples'
inputs are all-zero batches, so every sample is the same and the loss does
not depend on the batch size: the reference holds for the scripts that
scale the batch by the device count too.

Prints one line per example: ``ok`` with its losses beside the reference,
``refused`` (a multiprocess example and the named error, by design), or
``FAIL`` with the last error line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import runpy
import subprocess
import sys
from typing import NamedTuple

SAMPLES, BATCH, SEQ, IMG = 11, 8, 128, 32
TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_FLAGS = ["--hidden-size", "64", "--intermediate-size", "128", "--num-attention-heads", "4"]
TINY_FLAGS += ["--num-key-value-heads", "2"]


class Example(NamedTuple):
    """One example: its name, script and arguments, and what it is compared with."""

    name: str
    script: str
    args: tuple[str, ...]
    reference: str  # "decoder", "resnet", "resnet-amp", "scan", "runs" or "refused"


EXAMPLES = (
    Example("decoder", "train_decoder_only_base.py", tuple(TINY_FLAGS), "decoder"),
    Example(
        "decoder+scan_layers",
        "train_decoder_only_base.py",
        ("scan.decoder_with_scan.DecoderWithScan", *TINY_FLAGS),
        "decoder",
    ),
    Example("fsdp_v2", "fsdp/train_decoder_only_fsdp_v2.py", (), "decoder"),
    Example("eager", "eager/train_decoder_only_eager.py", (), "decoder"),
    Example("eager_spmd_data_parallel", "eager/train_decoder_only_eager_spmd_data_parallel.py", (), "decoder"),
    Example("eager_with_compile", "eager/train_decoder_only_eager_with_compile.py", (), "decoder"),
    Example("flash_attention", "flash_attention/train_decoder_only_flash_attention.py", (), "decoder"),
    Example("flash_attention_fsdp_v2", "flash_attention/train_decoder_only_flash_attention_fsdp_v2.py", (), "decoder"),
    Example("scan_examples", "scan/scan_examples.py", (), "scan"),
    Example("resnet", "train_resnet_base.py", (), "resnet"),
    Example("resnet_amp", "train_resnet_amp.py", (), "resnet-amp"),
    Example("resnet_spmd_data_parallel", "data_parallel/train_resnet_spmd_data_parallel.py", (), "resnet"),
    Example("resnet_benchmark", "debug/train_resnet_benchmark.py", (), "runs"),
    Example("eager_multi_process", "eager/train_decoder_only_eager_multi_process.py", (), "refused"),
    Example("resnet_ddp", "data_parallel/train_resnet_ddp.py", (), "refused"),
    Example("resnet_xla_ddp", "data_parallel/train_resnet_xla_ddp.py", (), "refused"),
    Example("resnet_fsdp_auto_wrap", "fsdp/train_resnet_fsdp_auto_wrap.py", (), "refused"),
)

_LOSS = re.compile(r"step: (\d+), loss: ([-0-9.eE+naif]+)")


def _shrink(t):
    t = t[:BATCH]
    if t.dim() == 4:
        t = t[:, :, :IMG, :IMG]
    elif t.dim() == 2 and not t.dtype.is_floating_point:
        t = t[:, :SEQ]
    return t.contiguous()


def child(examples_dir: str, script: str, args: list[str]) -> None:
    """Run ``script`` under compat with the small sizes (in this process)."""
    import torch

    import spmdtorch.compat

    spmdtorch.compat.install()
    xu = importlib.import_module("torch_xla.utils.utils")

    base = xu.SampleGenerator

    class SmallSampleGenerator(base):  # type: ignore[misc,valid-type]  # a class only known at run time
        def __init__(self, data, sample_count):
            super().__init__(tuple(_shrink(t) for t in data), min(sample_count, SAMPLES))

    setattr(xu, "SampleGenerator", SmallSampleGenerator)  # noqa: B010  # the alias module scripts import
    path = os.path.join(examples_dir, script)
    sys.path[:0] = [os.path.dirname(path), examples_dir]
    torch.manual_seed(42)
    if script.startswith(("fsdp/train_decoder", "eager/", "flash_attention/")):
        dm = importlib.import_module("decoder_only_model")
        tb = importlib.import_module("train_decoder_only_base")
        tb.TrainDecoderOnlyBase.__init__.__defaults__ = (
            dm.DecoderOnlyModel,
            200,
            dm.DecoderOnlyConfig(intermediate_size=128, **TINY),
        )
    sys.argv = [path, *args]
    runpy.run_path(path, run_name="__main__")


def reference(examples_dir: str, kind: str) -> dict[int, float]:
    """The eager-CPU losses at steps 0 and 10 of the examples' training loop."""
    import torch
    from torch import nn

    torch.manual_seed(42)
    if kind == "decoder":
        sys.path.insert(0, examples_dir)
        dm = importlib.import_module("decoder_only_model")
        cfg = dm.DecoderOnlyConfig(intermediate_size=128, **TINY)
        model: nn.Module = dm.DecoderOnlyModel(cfg)
        opt: torch.optim.Optimizer = torch.optim.Adam(model.parameters(), lr=0.0001)
        data, target = torch.zeros(BATCH, SEQ, dtype=torch.int64), torch.zeros(BATCH, SEQ, dtype=torch.int64)
    else:
        model = importlib.import_module("torchvision.models").resnet50()
        opt = torch.optim.SGD(model.parameters(), weight_decay=1e-4)
        data, target = torch.zeros(BATCH, 3, IMG, IMG), torch.zeros(BATCH, dtype=torch.int64)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    out = {}
    for step in range(SAMPLES):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=kind == "resnet-amp"):
            logits = model(data)
            loss = loss_fn(logits.view(-1, logits.shape[-1]), target.view(-1))
        loss.backward()
        opt.step()
        if step % 10 == 0:
            out[step] = loss.item()
    return out


def _run(argv: list[str], timeout: float) -> tuple[int, str]:
    env = dict(os.environ, PJRT_DEVICE="CPU", JAX_PLATFORMS="cpu")
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    try:
        p = subprocess.run(
            [sys.executable, os.path.abspath(__file__), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:.0f} s"
    return p.returncode, p.stdout + p.stderr


def _last_error(text: str) -> str:
    lines = [ln for ln in text.splitlines() if re.match(r"^[\w.]+(Error|Exception)\b", ln)]
    return (lines[-1] if lines else (text.strip().splitlines() or ["(no output)"])[-1])[:300]


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4:])
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--reference":
        print(json.dumps(reference(sys.argv[2], sys.argv[3])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", help="a PyTorch/XLA checkout (its examples/ folder is run)")
    ap.add_argument("--only", nargs="*", help="example names to run (default: all)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per example")
    a = ap.parse_args()
    examples_dir = os.path.join(os.path.abspath(a.checkout), "examples")
    if not os.path.isdir(examples_dir):
        ap.error(f"{examples_dir} does not exist: pass the root of a PyTorch/XLA checkout")
    refs: dict[str, dict[int, float] | str] = {}
    failures = 0
    for ex in EXAMPLES:
        if a.only and ex.name not in a.only:
            continue
        rc, out = _run(["--child", examples_dir, ex.script, *ex.args], a.timeout)
        losses = {int(s): float(v) for s, v in _LOSS.findall(out)}
        if ex.reference == "refused":
            ok = rc != 0 and "MultiprocessNotSupportedError" in out
            print(f"{ex.name:28} {'refused' if ok else 'FAIL'}: {_last_error(out)}", flush=True)
            failures += not ok
            continue
        if rc != 0:
            print(f"{ex.name:28} FAIL (exit {rc}): {_last_error(out)}", flush=True)
            failures += 1
            continue
        if ex.reference == "scan":
            ok = "Final sum: tensor([6.]" in out and "'sum': tensor([15.]" in out
            print(f"{ex.name:28} {'ok' if ok else 'FAIL'}: cumsum and running-mean results", flush=True)
            failures += not ok
            continue
        if ex.reference == "runs":
            print(f"{ex.name:28} ok: runs", flush=True)
            continue
        if ex.reference not in refs:
            rrc, rout = _run(["--reference", examples_dir, ex.reference], a.timeout)
            if rrc == 0:
                refs[ex.reference] = {int(k): v for k, v in json.loads(rout.strip().splitlines()[-1]).items()}
            else:
                refs[ex.reference] = _last_error(rout)
        ref = refs[ex.reference]
        if isinstance(ref, str):
            print(f"{ex.name:28} ran ({losses}); no CPU reference: {ref}", flush=True)
            continue
        close = set(ref) <= set(losses) and all(abs(losses[s] - ref[s]) <= 1e-4 * max(1.0, abs(ref[s])) for s in ref)
        shown = ", ".join(f"step {s}: {losses.get(s)} (CPU {ref[s]:.6f})" for s in sorted(ref))
        print(f"{ex.name:28} {'ok' if close else 'FAIL'}: {shown}", flush=True)
        failures += not close
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
