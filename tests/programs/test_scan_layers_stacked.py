"""``spmdtorch.scan_layers`` on a layer list made by ``scan_decoder_layers`` (issue 46, item 6).

A model written the PyTorch/XLA way calls ``scan_layers(self.layers, h)`` in
its forward. ``scan_decoder_layers(model, layers=model.layers,
stack_parameters=True)`` then gives it the stacked form (one Parameter per
weight kind, so AdamW updates 9 arrays at any depth); before, ``scan_layers``
refused such a list (its iteration yields one callable, not the modules).
Everything is compared with the same model trained eagerly on CPU.
"""

from __future__ import annotations

import pytest
import torch
from training_helpers import assert_adamw_params_close

import spmdtorch
from spmdtorch import debug
from spmdtorch.lazy import executor
from spmdtorch.models import LlamaConfig, LlamaForCausalLM, scan_decoder_layers
from spmdtorch.models.llama import causal_lm_loss, rope_tables
from spmdtorch.programs import SCAN_LAYERS_HOOK
from spmdtorch.tensor.dispatch import read_value

TOL = {"rtol": 1e-5, "atol": 1e-5}
LR = 1e-2


class ScanLayersLlama(LlamaForCausalLM):
    """spmdtorch's Llama with its layer loop written as PyTorch/XLA's ``scan_layers`` call."""

    def forward(self, tokens):
        cos, sin = rope_tables(self.cfg, tokens.shape[1], device=tokens.device)
        h = spmdtorch.scan_layers(self.layers, self.tok_embeddings(tokens), layer_args=(cos, sin))
        return self.output(self.norm(h))


def make(n_layers=3):
    torch.manual_seed(0)
    model = ScanLayersLlama(LlamaConfig(n_layers=n_layers))
    ref = LlamaForCausalLM(LlamaConfig(n_layers=n_layers))  # the eager reference: a Python loop
    ref.load_state_dict(model.state_dict())
    return model, ref


def batches(n):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 256, (8, 16), generator=g) for _ in range(n)]


def train_step(model, opt):
    def step(tokens):
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        return loss

    return step


@pytest.mark.parametrize("stack_parameters", [False, True])
def test_scan_layers_of_a_scanned_list_trains_like_eager(devices8, stack_parameters):
    model, ref = make()
    model = model.to("xla")
    layers = scan_decoder_layers(model, layers=model.layers, stack_parameters=stack_parameters)
    assert callable(getattr(layers, SCAN_LAYERS_HOOK))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    n_layer_params = sum(1 for n, _ in model.named_parameters() if n.startswith("layers."))
    assert n_layer_params == (9 if stack_parameters else 27)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    data = batches(4)
    # The first step lazily, its gradients compared; then compiled steps (two traces, a replay).
    ref_opt.zero_grad()
    want = causal_lm_loss(ref(data[0]), data[0])
    want.backward()
    tx = data[0].to("xla")
    with spmdtorch.step():
        opt.zero_grad()
        loss = causal_lm_loss(model(tx), tx)
        loss.backward()
    torch.testing.assert_close(loss.item(), want.item(), **TOL)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    if stack_parameters:
        wq = layers.stacked__attention__wq__weight
        for i in range(3):
            torch.testing.assert_close(wq.grad[i].cpu(), ref_grads[f"layers.{i}.attention.wq.weight"], **TOL)
    for n, p in model.named_parameters():
        if not n.startswith("layers.stacked"):
            torch.testing.assert_close(p.grad.cpu(), ref_grads[n], **TOL, msg=lambda m, n=n: f"{n}: {m}")
    ref_opt.step()
    with spmdtorch.step():
        opt.step()
    compiled = spmdtorch.compile(train_step(model, opt))
    ref_step = train_step(ref, ref_opt)
    for tokens in data[1:]:
        want = ref_step(tokens)
        torch.testing.assert_close(compiled(tokens.to("xla")).item(), want.item(), **TOL)
    # state_dict() has the per-layer keys in the stacked form too.
    assert_adamw_params_close(dict(model.state_dict()), ref, lr=LR, steps=len(data))


def test_scan_layers_of_a_stacked_list_keeps_the_program_flat_in_depth(devices8):
    def program_inputs(n_layers):
        # last_executable() is the program spmdtorch compiled last: an earlier test's identical
        # 2-layer step would be a compile-cache hit and leave another program there.
        spmdtorch.sync(wait=True)
        debug.clear_caches()
        model, _ = make(n_layers)
        model = model.to("xla")
        scan_decoder_layers(model, layers=model.layers, stack_parameters=True)
        opt = torch.optim.AdamW(model.parameters(), lr=LR)
        tokens = batches(1)[0].to("xla")
        with spmdtorch.step():
            train_step(model, opt)(tokens)
        spmdtorch.sync(wait=True)
        return len(debug.last_executable().input_shardings[0])

    # The step's program reads the same arrays (9 stacked parameters, their
    # AdamW state) at any depth; per-layer parameters would add 9 x 3 per layer.
    assert program_inputs(2) == program_inputs(4)


def test_scan_layers_checks_its_arguments_for_a_scanned_list(devices8):
    model, _ = make(2)
    model = model.to("xla")
    scan_decoder_layers(model, layers=model.layers, stack_parameters=True)
    with pytest.raises(spmdtorch.ScanError, match="input_data"):
        spmdtorch.scan_layers(model.layers, "not a tensor")
    with pytest.raises(spmdtorch.ScanError, match="layer_args"):
        spmdtorch.scan_layers(model.layers, torch.ones(1, 8, 64, device="xla"), layer_args="x")


@pytest.mark.parametrize("stack_parameters", [False, True])
def test_scan_layers_follows_the_lists_remat_unless_told(devices8, stack_parameters):
    def lowered(list_remat, **scan_kwargs):
        model, _ = make(2)
        model = model.to("xla")
        scan_decoder_layers(model, layers=model.layers, remat=list_remat, stack_parameters=stack_parameters)
        tokens = batches(1)[0].to("xla")
        cos, sin = rope_tables(model.cfg, tokens.shape[1], device=tokens.device)
        h = spmdtorch.scan_layers(model.layers, model.tok_embeddings(tokens), layer_args=(cos, sin), **scan_kwargs)
        h.square().sum().backward()
        grads = [p.grad for p in model.layers.parameters()]
        text = executor.lower([read_value(t) for t in [h, *grads]]).as_text()
        spmdtorch.sync()
        return text

    barrier = "optimization_barrier"  # jax.checkpoint's, inside the loop
    assert barrier not in lowered(None)
    assert barrier in lowered(True)
    assert barrier not in lowered(True, remat=False)
