"""spmdtorch.scan / scan_layers / models.scan_decoder_layers against eager CPU torch.

Every test compares values and gradients with the same computation written as
a Python loop and run eagerly on CPU. The structural tests check what scanning
is for: the program does not grow with depth, the stacked weights keep the
per-layer sharding, remat reaches the loop body.
"""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch
from training_helpers import assert_adamw_params_close

import spmdtorch
from spmdtorch import debug
from spmdtorch.fsdp import FSDPv2, checkpoint_module, transformer_auto_wrap_policy
from spmdtorch.lazy import executor
from spmdtorch.mesh import Mesh
from spmdtorch.models import LlamaConfig, LlamaForCausalLM, scan_decoder_layers, unscan_decoder_layers
from spmdtorch.models.llama import DecoderLayer, causal_lm_loss
from spmdtorch.programs._scan import _param_spec
from spmdtorch.sharding import mark_sharding
from spmdtorch.tensor.dispatch import read_value

TOL = {"rtol": 1e-5, "atol": 1e-5}


def loop_scan(fn, init, xs):
    carry, ys = init, []
    for i in range(xs[0].shape[0] if isinstance(xs, tuple) else xs.shape[0]):
        x = tuple(t[i] for t in xs) if isinstance(xs, tuple) else xs[i]
        carry, y = fn(carry, x)
        ys.append(y)
    return carry, ys


def step_fn(carry, x):
    h, total = carry
    a, b = x
    h = torch.tanh(h @ a + b)
    return (h, total + h.sum()), (h * 2, h.mean(-1))


def test_scan_forward_and_backward_match_eager_loop(devices8):
    torch.manual_seed(0)
    h0, a, b = torch.randn(2, 3), torch.randn(5, 3, 3) * 0.5, torch.randn(5, 3)
    refs = [t.clone().requires_grad_() for t in (h0, a, b)]
    (hc, tc), ys = loop_scan(step_fn, (refs[0], torch.zeros(())), (refs[1], refs[2]))
    y0, y1 = torch.stack([y[0] for y in ys]), torch.stack([y[1] for y in ys])
    (hc.sum() + tc * 0.5 + y0.pow(2).sum() + y1.sum()).backward()

    xla = [t.to("xla").requires_grad_() for t in (h0, a, b)]
    (h, t), (z0, z1) = spmdtorch.scan(step_fn, (xla[0], torch.zeros((), device="xla")), (xla[1], xla[2]))
    (h.sum() + t * 0.5 + z0.pow(2).sum() + z1.sum()).backward()
    assert tuple(z0.shape) == (5, 2, 3) and tuple(z1.shape) == (5, 2)
    for got, want in [(h, hc), (t, tc), (z0, y0), (z1, y1)]:
        torch.testing.assert_close(got.detach().cpu(), want.detach(), **TOL)
    for got, want in zip(xla, refs):
        torch.testing.assert_close(got.grad.cpu(), want.grad, **TOL)


def test_scan_without_grad_and_with_captured_constant(devices8):
    w = torch.randn(3, 3)
    init, xs = torch.randn(3), torch.randn(4, 3)
    fn = lambda c, x: (c @ w.to(c.device) + x, c)
    want_c, want_ys = loop_scan(fn, init, xs)
    c, ys = spmdtorch.scan(fn, init.to("xla"), xs.to("xla"))
    torch.testing.assert_close(c.cpu(), want_c, **TOL)
    torch.testing.assert_close(ys.cpu(), torch.stack(want_ys), **TOL)


class Block(torch.nn.Module):
    def __init__(self, dim=8, p=0.0):
        super().__init__()
        self.lin = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x, scale=None):
        h = self.norm(x + torch.tanh(self.lin(x)))
        return self.drop(h if scale is None else h * scale)


def make_blocks(n=4, **kw):
    torch.manual_seed(0)
    return torch.nn.ModuleList(Block(**kw) for _ in range(n))


def test_scan_layers_gradients_land_in_each_layer(devices8):
    ref = make_blocks()
    layers = copy.deepcopy(ref).to("xla")
    x = torch.randn(2, 8)
    scale = torch.randn(8)
    ref_scale, xla_scale = scale.clone().requires_grad_(), scale.to("xla").requires_grad_()
    h = x
    for layer in ref:
        h = layer(h, scale=ref_scale)
    h.square().sum().backward()
    out = spmdtorch.scan_layers(layers, x.to("xla"), layer_kwargs={"scale": xla_scale})
    out.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), h.detach(), **TOL)
    torch.testing.assert_close(xla_scale.grad.cpu(), ref_scale.grad, **TOL)
    for (name, p), q in zip(layers.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m, name=name: f"{name}: {m}")


def llama_batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (8, 16), generator=g) for _ in range(n)]


def make_llama(n_layers=3):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(n_layers=n_layers))


def train_eager(model, batches):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches:
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# Lazily in the slow tier (23 s); the Hugging Face scan tests run lazily by default.
@pytest.mark.parametrize("mode", [pytest.param("lazy", marks=pytest.mark.slow), "compiled"])
def test_scanned_llama_trains_like_eager(devices8, mode):
    ref = make_llama()
    model = copy.deepcopy(ref).to("xla")
    scan_decoder_layers(model)
    batches = llama_batches(3)
    ref_losses = train_eager(ref, batches)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(tokens):
        opt.zero_grad()
        loss = causal_lm_loss(model(tokens), tokens)
        loss.backward()
        opt.step()
        return loss

    before = debug.counter_value("UncachedCompile")
    if mode == "lazy":
        losses = []
        for tokens in batches:
            with spmdtorch.step():
                losses.append(step(tokens.to("xla")))
    else:
        compiled = spmdtorch.compile(step)
        losses = [compiled(tokens.to("xla")) for tokens in batches]
    losses = [loss.item() for loss in losses]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    assert_adamw_params_close(dict(model.named_parameters()), ref, lr=1e-2, steps=3)
    assert debug.counter_value("UncachedCompile") - before <= 2


@pytest.mark.slow
def test_fsdpv2_scanned_llama_matches_eager_and_keeps_shardings(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    ref = make_llama()
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=policy)
    scan_decoder_layers(model.module)
    batches = llama_batches(2)
    ref_losses = train_eager(ref, batches)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    specs_before = {n: spmdtorch.sharding.get_sharding_spec(p) for n, p in model.named_parameters()}
    # The stacked weight inside the scan: one layer's sharding plus a replicated leading (layer) dim.
    wq = model.module.layers[1].module.attention.wq.weight  # (64, 64): split on dim 0
    _, stacked_spec = _param_spec(wq)
    assert tuple(stacked_spec) == (None, "fsdp", None)
    losses = []
    for tokens in batches:
        tokens = mark_sharding(tokens.to("xla"), mesh, ("fsdp", None))
        with spmdtorch.step():
            opt.zero_grad()
            loss = causal_lm_loss(model(tokens), tokens)
            loss.backward()
            opt.step()
        losses.append(loss.item())
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-5)
    plain = spmdtorch.fsdp.plain_state_dict(model, keep_vars=True)
    assert_adamw_params_close({n: plain[n] for n, _ in ref.named_parameters()}, ref, lr=1e-2, steps=2)
    specs_after = {n: spmdtorch.sharding.get_sharding_spec(p) for n, p in model.named_parameters()}
    assert specs_after == specs_before
    assert any(s.startswith("{devices=[8") for n, s in specs_after.items() if "layers.1" in n)


def lowered_step_text(n_layers, scanned, remat=False):
    model = make_llama(n_layers).to("xla")
    if remat:
        for layer in model.layers:
            checkpoint_module(layer)
    if scanned:
        scan_decoder_layers(model)
    tokens = llama_batches(1)[0].to("xla")
    loss = causal_lm_loss(model(tokens), tokens)
    loss.backward()
    outs = [loss] + [p.grad for p in model.parameters()]
    text = executor.lower([read_value(t) for t in outs]).as_text()
    spmdtorch.sync()
    return text


def count_ops(text):
    return sum(1 for line in text.splitlines() if "stablehlo." in line)


@pytest.mark.slow
def test_program_does_not_grow_with_depth(devices8):
    unrolled = [count_ops(lowered_step_text(n, scanned=False)) for n in (2, 4)]
    scanned = [count_ops(lowered_step_text(n, scanned=True)) for n in (2, 8)]
    # Unrolled: every layer's forward and backward ops again (~300 per layer
    # here). Scanned: the body once; per layer only its parameters' inputs
    # (stacked, gradients unstacked) are added: a few ops per parameter.
    per_layer_unrolled = (unrolled[1] - unrolled[0]) / 2
    per_layer_scanned = (scanned[1] - scanned[0]) / 6
    n_params_per_layer = len(list(DecoderLayer(LlamaConfig()).parameters()))
    assert per_layer_scanned <= 6 * n_params_per_layer, scanned
    assert per_layer_unrolled > 5 * per_layer_scanned, (unrolled, scanned)


@pytest.mark.slow
def test_remat_with_checkpoint_module_matches_eager(devices8):
    text = lowered_step_text(2, scanned=True, remat=True)
    assert "optimization_barrier" in text  # jax.checkpoint's barrier inside the loop
    assert "optimization_barrier" not in lowered_step_text(2, scanned=True)
    ref = make_llama()
    model = copy.deepcopy(ref).to("xla")
    for layer in model.layers:
        checkpoint_module(layer)
    scan_decoder_layers(model)
    tokens = llama_batches(1)[0]
    causal_lm_loss(ref(tokens), tokens).backward()
    tx = tokens.to("xla")
    causal_lm_loss(model(tx), tx).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")


def test_mixed_precision_autocast_matches_eager(devices8):
    ref = make_blocks()
    layers = copy.deepcopy(ref).to("xla")
    x = torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = x
        for layer in ref:
            h = layer(h)
    h.float().square().sum().backward()
    with torch.autocast("xla", dtype=torch.bfloat16):
        out = spmdtorch.scan_layers(layers, x.to("xla"))
    out.float().square().sum().backward()
    assert out.dtype == h.dtype
    torch.testing.assert_close(out.detach().float().cpu(), h.detach().float(), rtol=2e-2, atol=2e-2)
    for p, q in zip(layers.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=5e-2, atol=5e-2)


def _tiny_hf_llama_config(transformers):
    """A 3-layer Hugging Face Llama config small enough for the scan tests."""
    return transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def test_hf_llama_scanned_matches_eager(devices8):
    transformers = pytest.importorskip("transformers")
    cfg = _tiny_hf_llama_config(transformers)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg)
    model = copy.deepcopy(ref).to("xla")
    layers = scan_decoder_layers(model)
    assert layers is model.model.layers and len(layers) == 3
    tokens = torch.randint(0, 128, (2, 16))
    want = ref(tokens, labels=tokens)
    want.loss.backward()
    got = model(tokens.to("xla"), labels=tokens.to("xla"))
    got.loss.backward()
    torch.testing.assert_close(got.logits.detach().cpu(), want.logits.detach(), **TOL)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, **TOL, msg=lambda m, n=name: f"{n}: {m}")
    unscan_decoder_layers(layers)
    assert len(list(iter(model.model.layers))) == 3


def test_layers_that_differ_are_named(devices8):
    layers = make_blocks(3).to("xla")
    layers[2].lin = torch.nn.Linear(8, 8, bias=False).to("xla")
    with pytest.raises(spmdtorch.ScanError, match=r"layer 2 differs from layer 0 in parameter 'lin.bias'"):
        spmdtorch.scan_layers(layers, torch.ones(2, 8, device="xla"))
    layers = make_blocks(3).to("xla")
    layers[1].drop.p = 0.5
    with pytest.raises(spmdtorch.ScanError, match=r"layer 1 differs from layer 0 in drop: attribute 'p'"):
        spmdtorch.scan_layers(layers, torch.ones(2, 8, device="xla"))


def test_layer_hooks_must_be_the_same_functions(devices8):
    # One hook function on every layer: the recorded layer 0 stands for all, as unrolled.
    ref = make_blocks(3)
    layers = copy.deepcopy(ref).to("xla")

    def flip(mod, args, out):
        return -out

    for blocks in (ref, layers):
        for b in blocks:
            b.lin.register_forward_hook(flip)
    x = torch.randn(2, 8)
    want = x
    for b in ref:
        want = b(want)
    got = spmdtorch.scan_layers(layers, x.to("xla"))
    torch.testing.assert_close(got.cpu(), want, **TOL)
    # Per-layer closures may compute differently: layer 0's would stand for the others.
    layers = make_blocks(3).to("xla")
    for i, b in enumerate(layers):
        b.lin.register_forward_hook(lambda mod, args, out, i=i: out * i)
    with pytest.raises(spmdtorch.ScanError, match=r"layer 1 differs from layer 0 in lin: forward hooks"):
        spmdtorch.scan_layers(layers, torch.ones(2, 8, device="xla"))
    # A backward hook could never run inside the loop's jax.vjp.
    layers = make_blocks(2).to("xla")
    layers[1].lin.register_full_backward_hook(lambda mod, gin, gout: None)
    with pytest.raises(spmdtorch.ScanError, match="lin of a layer has a backward hook"):
        spmdtorch.scan_layers(layers, torch.ones(2, 8, device="xla"))


def test_bodies_that_cannot_be_a_loop_raise_named_errors(devices8):
    def branchy(c, x):
        return (c + x if (c.sum() > 0) else c - x), c

    with pytest.raises(spmdtorch.ScanError, match="data-dependent"):
        spmdtorch.scan(branchy, torch.ones(2, device="xla"), torch.ones(3, 2, device="xla"))
    with pytest.raises(spmdtorch.ScanError, match="random numbers"):
        spmdtorch.scan_layers(make_blocks(2, p=0.5).to("xla"), torch.ones(2, 8, device="xla"))
    w = torch.ones(2, device="xla", requires_grad=True)
    with pytest.raises(spmdtorch.ScanError, match="requires grad"):
        spmdtorch.scan(lambda c, x: (c * w + x, c), torch.ones(2, device="xla"), torch.ones(3, 2, device="xla"))
    with pytest.raises(spmdtorch.ScanError, match="carry shaped like `init`"):
        spmdtorch.scan(lambda c, x: (c.sum(), c), torch.ones(2, device="xla"), torch.ones(3, 2, device="xla"))
    bn = torch.nn.ModuleList(torch.nn.BatchNorm1d(2) for _ in range(2)).to("xla")
    with pytest.raises(spmdtorch.ScanError, match="in place"):
        spmdtorch.scan_layers(bn, torch.ones(4, 2, device="xla"))
    # Nothing of the failed recordings is left pending: an unrelated step still runs.
    assert (torch.ones(2, device="xla") * 3).sum().item() == 6.0


def distinct_fusion_kernels(text):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    from hlo_compare import distinct_fusion_kernels as count

    return count(text)


def train_step_kernels(n_layers, stack_parameters=False):
    """Distinct fusion kernels of one lazy AdamW training step of the scanned Llama."""
    model = make_llama(n_layers).to("xla")
    scan_decoder_layers(model, stack_parameters=stack_parameters)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = llama_batches(1)[0].to("xla")
    with spmdtorch.step():
        causal_lm_loss(model(tokens), tokens).backward()
        opt.step()
    spmdtorch.sync(wait=True)
    return distinct_fusion_kernels(debug.last_executable().as_text())


@pytest.mark.parametrize("stack_parameters", [pytest.param(False, marks=pytest.mark.slow), True])
def test_compiled_kernels_do_not_grow_with_depth(devices8, stack_parameters):
    # Each layer's gradient is a dynamic_slice of the stacked gradient at a
    # runtime index, so every layer's optimizer update is the same kernel;
    # with static slices each layer's was its own (2 -> 6 layers added ~70).
    # Stacked parameters: no per-layer arrays at all.
    small, deep = (train_step_kernels(n, stack_parameters) for n in (2, 6))
    assert deep == small, (small, deep)


def make_fsdp_llama(ref, mesh, stack_parameters):
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=policy)
    scan_decoder_layers(model.module, stack_parameters=stack_parameters)
    return model


@pytest.mark.slow
def test_stacked_parameters_fsdpv2_train_like_eager(devices8):
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    ref = make_llama()
    model = make_fsdp_llama(ref, mesh, stack_parameters=True)
    layers = model.module.layers
    names = [n for n, _ in model.named_parameters()]
    # One Parameter per weight kind, none per layer; sharded like one layer, layer dim replicated.
    assert sum("layers." in n for n in names) == 9 and not any(".layers.0." in n for n in names)
    wq = layers.stacked__attention__wq__weight
    assert tuple(wq.shape) == (3, 64, 64)
    assert tuple(_param_spec(wq)[1]) == (None, None, "fsdp", None)
    specs_before = {n: spmdtorch.sharding.get_sharding_spec(p) for n, p in model.named_parameters()}
    batches = llama_batches(2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for i, tokens in enumerate(batches):
        ref_opt.zero_grad()
        want = causal_lm_loss(ref(tokens), tokens)
        want.backward()
        tx = mark_sharding(tokens.to("xla"), mesh, ("fsdp", None))
        with spmdtorch.step():
            opt.zero_grad()
            loss = causal_lm_loss(model(tx), tx)
            loss.backward()
        torch.testing.assert_close(loss.item(), want.item(), **TOL)
        if i == 0:  # the stacked gradient holds each layer's
            grads = {n: p.grad for n, p in ref.named_parameters()}
            for layer in range(3):
                got = wq.grad[layer].cpu()
                torch.testing.assert_close(got, grads[f"layers.{layer}.attention.wq.weight"], **TOL)
        ref_opt.step()
        with spmdtorch.step():
            opt.step()
    plain = spmdtorch.fsdp.plain_state_dict(model)
    assert list(plain) == list(ref.state_dict())
    assert_adamw_params_close({n: plain[n] for n, _ in ref.named_parameters()}, ref, lr=1e-2, steps=2)
    specs_after = {n: spmdtorch.sharding.get_sharding_spec(p) for n, p in model.named_parameters()}
    assert specs_after == specs_before


def test_stacked_parameters_state_dict_round_trip(devices8):
    ref = make_llama()
    model = copy.deepcopy(ref).to("xla")
    layers = scan_decoder_layers(model, stack_parameters=True)
    # Saved from the stacked model, loaded into the unstacked one: the same keys and values.
    saved = {k: v.cpu() for k, v in model.state_dict().items()}
    assert list(saved) == list(ref.state_dict())
    fresh = LlamaForCausalLM(LlamaConfig(n_layers=3))
    fresh.load_state_dict(saved)
    for (n, p), q in zip(fresh.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}")
    # The unstacked model's keys load into the stacked model (strict).
    other = make_llama()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(2)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(
        layers.stacked__feed_forward__w2__weight.cpu(), torch.stack([l.feed_forward.w2.weight for l in other.layers])
    )
    tokens = llama_batches(1)[0]
    torch.testing.assert_close(model(tokens.to("xla")).detach().cpu(), other(tokens).detach(), rtol=1e-4, atol=1e-4)
    # Unstacking gives every layer its own parameters back, with the loaded values.
    unscan_decoder_layers(layers)
    assert not [n for n, _ in layers.named_parameters(recurse=False)]
    for (n, p), q in zip(model.named_parameters(), other.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=0, msg=lambda m, n=n: f"{n}: {m}")


class BlockNet(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_stacked_before_fsdpv2_wrap_keeps_layer_dim_replicated(devices8):
    # Stacked first, wrapped after: FSDPv2 shards the stacked weight like one
    # layer's (its own rule would split the 10-long layer dim of (10, 8, 8)).
    torch.manual_seed(0)
    ref = BlockNet(10)
    model = copy.deepcopy(ref).to("xla")
    scan_decoder_layers(model, stack_parameters=True)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FSDPv2(model, mesh=mesh, auto_wrap_policy=policy)
    w = model.module.layers.stacked__lin__weight
    assert spmdtorch.sharding.get_sharding_spec(w).startswith("{devices=[1,8,1]")
    x = torch.randn(8, 8)
    ref(x).square().sum().backward()
    out = model(x.to("xla"))
    out.square().sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref(x).detach(), **TOL)
    want = torch.stack([layer.lin.weight.grad for layer in ref.layers])
    torch.testing.assert_close(w.grad.cpu(), want, **TOL)
    plain = spmdtorch.fsdp.plain_state_dict(model)
    assert list(plain) == list(ref.state_dict())


def test_hf_llama_stacked_with_kv_cache_matches_eager(devices8):
    # A key-value cache runs the layers one by one (each writes its own cache
    # slot), each with its slice of the stacked weights.
    transformers = pytest.importorskip("transformers")
    cfg = _tiny_hf_llama_config(transformers)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).eval()
    model = copy.deepcopy(ref).to("xla")
    scan_decoder_layers(model, stack_parameters=True)
    tokens = torch.randint(0, 128, (2, 8))
    want_cache, got_cache = transformers.DynamicCache(), transformers.DynamicCache()
    with torch.no_grad():
        want = ref(tokens, past_key_values=want_cache, use_cache=True).logits
        got = model(tokens.to("xla"), past_key_values=got_cache, use_cache=True).logits
        torch.testing.assert_close(got.cpu(), want, **TOL)
        nxt = want[:, -1:].argmax(-1)
        want = ref(nxt, past_key_values=want_cache, use_cache=True).logits
        got = model(nxt.to("xla"), past_key_values=got_cache, use_cache=True).logits
    torch.testing.assert_close(got.cpu(), want, **TOL)
    # Without a cache the same model runs as one scan over the stacked weights.
    with torch.no_grad():
        torch.testing.assert_close(model(tokens.to("xla")).logits.cpu(), ref(tokens).logits, **TOL)
