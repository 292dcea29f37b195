"""Hugging Face training runs, each as a user writes it, for tests/compat/test_hf_*.py.

Run as a script in a fresh process: with ``python -m spmdtorch.compat`` it takes
transformers' and accelerate's XLA paths (they import ``torch_xla``, which
compat provides); with plain ``python`` it is the CPU reference. Nothing is
downloaded: the models are built from small configs with a fixed seed.

    python [-m spmdtorch.compat] _hf_runs.py trainer OUT {cpu,fsdpv2,fsdpv2_ckpt}
    python [-m spmdtorch.compat] _hf_runs.py trainer_eval OUT {cpu,fsdpv2}
    python [-m spmdtorch.compat] _hf_runs.py accelerate OUT

Each run writes ``OUT/result.json`` (the per-step losses, the device it ran
on; the ``trainer_eval`` run its eval losses and the steps they were taken at) and ``OUT/trained.pt`` (the trained weights, read back to the CPU under the
unwrapped model's names), plus what the library saved (the Trainer run also
``OUT/reloaded.pt``: ``from_pretrained`` of its ``save_pretrained`` folder).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

STEPS = 3
BATCH = 8  # one process: the global batch; FSDPv2 splits it over the 8 devices


def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg)


class _Tokens(torch.utils.data.Dataset):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, 64, (BATCH * STEPS, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _write(out: Path, losses: list[float], device: str, trained: dict[str, torch.Tensor], **extra: object) -> None:
    torch.save(trained, out / "trained.pt")
    (out / "result.json").write_text(json.dumps({"losses": losses, "device": device, **extra}))


def _trainer_class():
    from transformers import Trainer

    class _Trainer(Trainer):
        # transformers 5.x (seen in 5.25) never creates the optimizer when an XLA
        # FSDP wrapper is in use (its `_prepare_for_training` delays creation and
        # then skips it), so `create_scheduler` meets None; 4.57 creates it there.
        def create_scheduler(self, num_training_steps, optimizer=None):
            if optimizer is None and self.optimizer is None:
                self.create_optimizer()
                self.optimizer = self.accelerator.prepare(self.optimizer)
            return super().create_scheduler(num_training_steps, optimizer)

    return _Trainer


def _training_args(out: Path, mode: str, **extra):
    from transformers import TrainingArguments

    kwargs = {}
    if mode != "cpu":
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = {"xla": True, "xla_fsdp_v2": True, "xla_fsdp_grad_ckpt": mode == "fsdpv2_ckpt"}
    extra.setdefault("save_strategy", "no")
    return TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=BATCH,
        max_steps=STEPS,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        seed=0,
        # transformers' default on torch >= 2.8 is the fused AdamW, which torch
        # allows on its own device types only (PyTorch/XLA fails there too).
        optim="adamw_torch",
        use_cpu=mode == "cpu",
        disable_tqdm=True,
        **kwargs,
        **extra,
    )


def run_trainer(out: Path, mode: str) -> None:
    from transformers import LlamaForCausalLM
    from transformers.modeling_utils import unwrap_model

    trainer = _trainer_class()(model=_tiny_llama(), args=_training_args(out, mode), train_dataset=_Tokens())
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # What PyTorch/XLA users get from Trainer.save_model under FSDPv2: the
    # wrapper's state dict (keys under `_orig_module.`) in pytorch_model.bin.
    trainer.save_model(str(out / "saved"))
    # The fix transformers#36004 gives: unwrap the FSDPv2 wrappers, then save_pretrained.
    model = unwrap_model(trainer.model, recursive=True)
    model.save_pretrained(str(out / "pretrained"))
    trained = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    # ... and loads back with from_pretrained (onto the CPU, as by default)
    reloaded = LlamaForCausalLM.from_pretrained(str(out / "pretrained")).state_dict()
    torch.save({k: v.detach().clone() for k, v in reloaded.items()}, out / "reloaded.pt")
    _write(out, losses, str(next(model.parameters()).device), trained)


def _eval_at_last_step_callback():
    from transformers import IntervalStrategy, TrainerCallback

    class _EvalAtLastStep(TrainerCallback):
        # transformers 5.x's DefaultFlowCallback also evaluates at the last step under a "steps"
        # strategy (when that step is not a multiple of eval_steps); 4.57's does not. Asking for
        # it here makes both versions evaluate at the same steps (on 5.x it is already asked for).
        def on_step_end(self, args, state, control, **kwargs):
            if (
                args.eval_strategy == IntervalStrategy.STEPS
                and state.global_step >= state.max_steps
                and args.eval_delay <= state.global_step
            ):
                control.should_evaluate = True
            return control

    return _EvalAtLastStep()


def run_trainer_eval(out: Path, mode: str) -> None:
    """Training with evaluation and a checkpoint every 2 steps (the eval loop, xm.save of the optimizer).

    It evaluates at step 2 and at the last step, and records those steps in ``eval_steps``.
    """
    args = _training_args(
        out,
        mode,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        per_device_eval_batch_size=BATCH,
    )
    trainer = _trainer_class()(
        model=_tiny_llama(),
        args=args,
        train_dataset=_Tokens(),
        eval_dataset=_Tokens(),
        callbacks=[_eval_at_last_step_callback()],
    )
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    trained = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    _write(
        out,
        [h["eval_loss"] for h in evals],
        str(next(trainer.model.parameters()).device),
        trained,
        eval_steps=[h["step"] for h in evals],
    )


def run_accelerate(out: Path) -> None:
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    acc = Accelerator(cpu=os.environ.get("HF_RUNS_CPU") == "1", gradient_accumulation_steps=2)
    set_seed(0)
    # Three layers of one shape: equal-size parameters must not be taken for aliases when saving.
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g)
    # No shuffling: on XLA accelerate reseeds a shuffling loader's generator (its design), so orders would differ.
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    losses = []
    for xb, yb in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            if acc.sync_gradients:
                acc.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(acc.gather(loss.detach()).mean().item())
    acc.wait_for_everyone()
    acc.save_model(model, str(out / "saved"))
    trained = {k: v.detach().cpu() for k, v in acc.unwrap_model(model).state_dict().items()}
    # save_state / load_state round trip: perturb the weights, load, and the trained ones are back
    acc.save_state(str(out / "state"))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(str(out / "state"))
    restored = {k: v.detach().cpu() for k, v in acc.unwrap_model(model).state_dict().items()}
    torch.save(restored, out / "restored.pt")
    _write(out, losses, f"{acc.device} {acc.distributed_type}", trained)


def main(argv: list[str]) -> None:
    kind, out = argv[0], Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if kind == "trainer":
        run_trainer(out, argv[2])
    elif kind == "trainer_eval":
        run_trainer_eval(out, argv[2])
    elif kind == "accelerate":
        run_accelerate(out)
    else:
        raise SystemExit(f"unknown run {kind!r}: trainer, trainer_eval or accelerate")


if __name__ == "__main__":
    main(sys.argv[1:])
