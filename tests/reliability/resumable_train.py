"""A training job that resumes from its newest checkpoint: the subject of the kill-and-resume tests.

An FSDPv2 Llama decoder on 8 simulated CPU devices, AdamW with a learning
rate schedule (set every step), random token masking on
the device (xla random numbers), a shuffled ``DataLoader`` behind
``MpDeviceLoader``, and async checkpoints every ``--save-every`` steps that
hold the model, the optimizer, the loader's position and torch's generator.
On start it checks that every listed checkpoint step restores, restores the
newest, and trains to ``--steps``; then it writes the final parameters and
optimizer state to ``--out`` (``torch.save`` of CPU tensors).

It prints one line per event (``pid P``, ``restoring N``, ``restored N``,
``step N``, ``saving N``, ``saved N``, ``done``) so that a test can kill it
at a chosen moment.

The same file runs as a multi-process job (``python -m spmdtorch.launch
--nprocs 2 --devices-per-proc 4 resumable_train.py ...``): the mesh spans the
job's 8 devices, every process prints its events (the launcher prefixes
them with ``[rank i]``; ``pid P`` says which process to kill), and only
process 0 writes ``OUT``.

Usage: python tests/reliability/resumable_train.py DIR OUT [--steps 40] [--save-every 10] [--mode compiled|lazy]
"""

from __future__ import annotations

import os
import sys

from spmdtorch import runtime
from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

if __name__ == "__main__" and runtime.ENV_NUM_PROCESSES not in os.environ:
    simulate_cpu_devices(8)  # one process; under the launcher, its devices (importing spmdtorch joined the job)

import argparse
import functools
import math

EXIT_UNRESTORABLE = 3  # a listed checkpoint step did not restore


def _say(line: str) -> None:
    print(line, flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--mode", choices=("compiled", "lazy"), default="compiled")
    p.add_argument("--compile-cache", default=None, help="JAX's persistent compilation cache (restarts skip compiling)")
    args = p.parse_args(argv)
    _say(f"pid {os.getpid()}")
    if args.compile_cache:
        # Process 0 writes, the others only read (runtime.initialize_cache's advice for a shared directory).
        runtime.initialize_cache(args.compile_cache, readonly=runtime.process_index() != 0)

    import numpy as np
    import torch

    import spmdtorch
    from spmdtorch.checkpoint import CheckpointError, CheckpointManager, init_optimizer_state
    from spmdtorch.data import MpDeviceLoader
    from spmdtorch.mesh import Mesh
    from spmdtorch.models.llama import DecoderLayer, LlamaConfig, LlamaForCausalLM, causal_lm_loss
    from spmdtorch.partition import FSDPv2, ShardingSpec, transformer_auto_wrap_policy

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(LlamaForCausalLM(cfg), mesh=mesh, auto_wrap_policy=policy)
    # Compiled: the learning rate is a 0-d xla tensor that the loop fills (the
    # form a compiled step replays); lazy: a float, as lazy training loops set it.
    lr = torch.tensor(0.0, device="xla") if args.mode == "compiled" else 0.0
    opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def set_lr(value: float) -> None:
        if isinstance(lr, torch.Tensor):
            lr.fill_(value)
        else:
            for group in opt.param_groups:
                group["lr"] = value

    def schedule(step: int) -> float:  # warm-up then cosine, a function of the step alone
        return 1e-2 * min(1.0, (step + 1) / 5) * (0.55 + 0.45 * math.cos(math.pi * min(step, 200) / 200))

    tokens = torch.randint(0, cfg.vocab_size, (48, 16), generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(tokens, batch_size=8, shuffle=True)
    loader = MpDeviceLoader(data, "xla", input_sharding=ShardingSpec(mesh, ("fsdp", None)))

    def train_step(batch):
        opt.zero_grad()
        masked = batch.masked_fill(torch.rand(batch.shape, device="xla") < 0.15, 0)
        loss = causal_lm_loss(model(masked), batch)
        loss.backward()
        opt.step()
        return loss

    compiled = spmdtorch.compile(train_step)

    def run(batch):
        if args.mode == "compiled":
            return compiled(batch)
        with spmdtorch.step():
            return train_step(batch)

    def state(step: int) -> dict:
        return {
            "model": model.state_dict(),
            "optim": opt.state_dict(),
            "loader": loader.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "step": step,
        }

    step = 0
    with CheckpointManager(args.dir, save_interval_steps=args.save_every, max_to_keep=2) as mgr:
        listed = mgr.all_steps()
        if listed:
            init_optimizer_state(opt)  # entries for the restore to fill
            for s in listed:  # every listed step must restore (the newest last: it is the one kept)
                _say(f"restoring {s}")
                try:
                    restored = mgr.restore(state(0), step=s)
                except CheckpointError as e:
                    _say(f"unrestorable {s}: {type(e).__name__}: {e}")
                    return EXIT_UNRESTORABLE
            step = restored["step"]
            loader.load_state_dict(restored["loader"])
            torch.set_rng_state(restored["torch_rng"])
            _say(f"restored {step}")
        while step < args.steps:
            for batch in loader:
                set_lr(schedule(step))
                loss = run(batch).item()
                step += 1
                _say(f"step {step} loss {loss!r} batch {int(batch.sum())}")
                if mgr.should_save(step):
                    _say(f"saving {step}")
                    mgr.save(step, state(step))
                    _say(f"saved {step}")
                if step >= args.steps:
                    break
        mgr.wait_until_finished()
    final = {f"model.{k}": v.cpu() for k, v in model.state_dict().items()}
    for i, s in opt.state_dict()["state"].items():
        final.update({f"optim.{i}.{k}": v.cpu() for k, v in s.items()})
    if runtime.process_index() == 0:  # every process gathered the same values (.cpu() is collective)
        torch.save(final, args.out)
    _say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
