"""What every implementation of ``train_step.py``'s step shares, and the worker side of its protocol.

The configs, AdamW's hyper-parameters, the torch model and its token batch,
the FLOP count, and ``serve``: the loop a worker process runs for the driver.
It imports neither jax nor the ``spmdtorch`` package, so that the PyTorch/XLA
worker (``_ptxla_worker.py``), which runs in an interpreter with torch_xla and
an older torch but without jax or spmdtorch, builds exactly the same model and
batch and speaks the same protocol.

Protocol (one worker process per mode, driven over stdin/stdout): the worker
sets up and runs its first step; with ``--first-only`` it prints ``FIRST
{"first_s": ...}`` and exits; otherwise it prints ``READY``, answers each
``BLOCK n`` line with ``BLOCK [wall s, CPU s]`` per step of ``n`` steps
launched back to back, and on ``FINISH`` prints ``RESULT {...}`` and exits.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
import time
from pathlib import Path

CONFIGS = {"tiny": (8, 64), "small": (8, 128), "deep": (8, 64), "1b": (4, 1024)}  # batch, sequence length
# Each config's LlamaConfig preset and field overrides: "deep" is tiny's sizes
# at 32 layers (depth without width: the per-layer costs of tracing,
# compiling, recording and the optimizer dominate); "1b" is TinyLlama-1.1B's
# shape (1.1e9 parameters), for an accelerator.
PRESETS = {
    "tiny": ("tiny", {}),
    "small": ("small", {}),
    "deep": ("tiny", {"n_layers": 32}),
    "1b": (
        "tiny",
        {"vocab_size": 32000, "dim": 2048, "n_layers": 22, "n_heads": 32, "n_kv_heads": 4, "ffn_dim": 5632},
    ),
}
# Parameter dtype per config unless --dtype says otherwise.
DTYPES = {"1b": "bfloat16"}
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 1e-2  # torch.optim.AdamW defaults
HOST_STEPS = 5  # steps whose host time ``finish`` takes, each launched on an idle device
# Steps launched back to back under a profiler trace, apart from the timed
# blocks (tracing costs the host time), for the devices' idle share.
TRACE_STEPS = 5
# Steps before the timed blocks, the same in every worker so that the final losses agree too
# (lazy modes compile twice, once AdamW's state exists; spmdtorch.compile replays from its fourth call).
WARMUP_STEPS = 4

_LLAMA_FILE = Path(__file__).resolve().parent.parent / "spmdtorch" / "models" / "llama.py"


def now() -> float:
    return time.perf_counter()


def dtype_name(cfg_name: str, dtype: str | None) -> str:
    return dtype or DTYPES.get(cfg_name, "float32")


def llama_module():
    """``spmdtorch.models.llama``, loaded from its file when the package cannot be imported.

    The module is plain torch (it imports nothing of spmdtorch); importing it
    through the package would start jax, which the PyTorch/XLA worker's
    interpreter does not have.
    """
    if "spmdtorch" in sys.modules or importlib.util.find_spec("jax") is not None:
        from spmdtorch.models import llama

        return llama
    name = "_train_setup_llama"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _LLAMA_FILE)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load the decoder from {_LLAMA_FILE}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


def setup(cfg_name: str, n_devices: int, seq: int | None = None, dtype: str | None = None):
    """The config, the torch model (seed 0, in ``dtype``) and a token batch; ``seq`` overrides the sequence length.

    ``n_devices``: the devices the step runs on. JAX cannot shard a dim n ways
    unless n divides it (spmdtorch pads it): tiny's ffn_dim 172 becomes 176 on
    8 devices, so that every implementation shards identically.
    """
    import torch

    llama = llama_module()
    preset, overrides = PRESETS[cfg_name]
    cfg = dataclasses.replace(getattr(llama.LlamaConfig, preset)(), **overrides)
    cfg = dataclasses.replace(cfg, ffn_dim=-(-cfg.ffn_dim // n_devices) * n_devices)
    batch, seq_len = CONFIGS[cfg_name]
    seq_len = seq or seq_len
    cfg = dataclasses.replace(cfg, max_seq_len=max(cfg.max_seq_len, seq_len))
    torch.manual_seed(0)
    model = llama.LlamaForCausalLM(cfg).to(getattr(torch, dtype_name(cfg_name, dtype)))
    tokens = torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=torch.Generator().manual_seed(1))
    return cfg, model, tokens


def make_train_step(model, opt, zero_grad_after: bool = False):
    """The step every torch implementation times: ``step(tokens) -> loss``, without the barrier.

    ``zero_grad_after``: the step ends with ``opt.zero_grad()`` (as Hugging
    Face's ``Trainer`` does) instead of starting with it: the gradients then
    die inside the step, so a compiled program need not return them.
    """
    loss_fn = llama_module().causal_lm_loss

    def train_step(tokens):
        if not zero_grad_after:
            opt.zero_grad()
        loss = loss_fn(model(tokens), tokens)
        loss.backward()
        opt.step()
        if zero_grad_after:
            opt.zero_grad()
        return loss

    return train_step


def model_flops(cfg, batch: int, seq: int) -> float:
    """Matmul FLOPs of one training step (forward + backward), PaLM's count.

    6 per matmul weight per token, plus attention's two (seq x seq) products,
    12 * layers * dim * seq per token, counted whole as the model computes
    them (the causal mask is applied after the product).
    """
    per_layer = cfg.dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim + 3 * cfg.dim * cfg.ffn_dim
    weights = cfg.n_layers * per_layer + cfg.dim * cfg.vocab_size  # the embedding lookup is no matmul
    tokens = batch * seq
    return 6.0 * weights * tokens + 12.0 * cfg.n_layers * cfg.dim * seq * tokens


class Session:
    """One mode set up in this process: first step and warm-up done, ready to time blocks."""

    def __init__(self, first, warm, losses, run_block, finish):
        self.first, self.warm, self.losses = first, warm, losses
        self._run_block, self._finish = run_block, finish

    def block(self, steps: int) -> tuple[float, float]:
        """``steps`` steps launched back to back, then one wait: (wall s, process CPU s) per step."""
        t0, c0 = now(), time.process_time()
        self._run_block(steps)
        return (now() - t0) / steps, (time.process_time() - c0) / steps

    def finish(self) -> dict:
        return {"first_s": self.first, "warmup_s": self.warm, **self._finish(), "losses": self.losses}


def serve(sess: Session, first_only: bool) -> None:
    """The worker's side of the protocol (module docstring), on stdin/stdout."""
    if first_only:  # the first step alone (the driver's first phase): report it and exit
        print("FIRST " + json.dumps({"first_s": sess.first}), flush=True)
        return
    print("READY", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "BLOCK":
            wall, cpu = sess.block(int(cmd[1]))
            print("BLOCK " + json.dumps([wall, cpu]), flush=True)
        elif cmd and cmd[0] == "FINISH":
            print("RESULT " + json.dumps(sess.finish()), flush=True)
            return
