"""spmdtorch.assume_pure against eager CPU torch: values, gradients, training, reuse, and what it refuses."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch
import transformers
from torch import nn

import spmdtorch
from spmdtorch import debug
from spmdtorch.fsdp import FSDPv2, checkpoint_module, transformer_auto_wrap_policy
from spmdtorch.mesh import Mesh
from spmdtorch.models import LlamaConfig, LlamaForCausalLM
from spmdtorch.models.llama import DecoderLayer, causal_lm_loss, rope_tables
from spmdtorch.programs._pure import AssumePureTypeError
from spmdtorch.sharding import get_sharding_spec

TOL = {"rtol": 1e-5, "atol": 1e-5}


def _ops(fn):
    """ATen ops dispatched while ``fn()`` runs, and its result."""
    before = debug.counter_value("DispatchedOps")
    out = fn()
    return debug.counter_value("DispatchedOps") - before, out


def mlp(x, w1, w2, scale: float):
    h = torch.nn.functional.silu(x @ w1)
    return (h @ w2) * scale, h.argmax(-1)


def test_function_values_gradients_and_one_recording(devices8):
    torch.manual_seed(0)
    x, w1, w2 = torch.randn(4, 8), torch.randn(8, 16) * 0.3, torch.randn(16, 8) * 0.3
    ref = [t.clone().requires_grad_() for t in (x, w1, w2)]
    y_ref, idx_ref = mlp(*ref, 0.5)
    y_ref.pow(2).sum().backward()

    pure = spmdtorch.assume_pure(mlp)
    counts = []
    for _ in range(3):
        xla = [t.to("xla").requires_grad_() for t in (x, w1, w2)]
        n, (y, idx) = _ops(functools.partial(pure, *xla, 0.5))
        counts.append(n)
        y.pow(2).sum().backward()
        torch.testing.assert_close(y.cpu(), y_ref.detach(), **TOL)
        assert torch.equal(idx.cpu(), idx_ref) and not idx.requires_grad
        for got, want in zip(xla, ref):
            torch.testing.assert_close(got.grad.cpu(), want.grad, **TOL)
    assert pure.cache_size() == 1
    # The first call records the body (and dispatches its ops); later calls dispatch none of them.
    assert counts[0] >= 4 and counts[1] == counts[2] == 0


def test_signature_decides_the_recording(devices8):
    pure = spmdtorch.assume_pure(mlp)
    w1, w2 = torch.ones(8, 16, device="xla") * 0.1, torch.ones(16, 8, device="xla") * 0.1
    x = torch.ones(4, 8, device="xla")
    a = pure(x, w1, w2, 0.5)[0]
    b = pure(x, w1, w2, 2.0)[0]  # another constant: another recording, not the first one's 0.5
    c = pure(torch.ones(2, 8, device="xla"), w1, w2, 0.5)[0]  # another shape
    with torch.no_grad():
        pure(x, w1, w2, 0.5)  # grad mode is part of the signature
    assert pure.cache_size() == 4
    torch.testing.assert_close(b.cpu(), a.cpu() * 4)
    assert tuple(c.shape) == (2, 8)
    pure.cache_clear()
    assert pure.cache_size() == 0
    pure(x, w1, w2, 0.5)
    debug.clear_caches()  # the recordings are among the engine's caches
    assert pure.cache_size() == 0


def test_module_reads_each_steps_parameters_and_buffers(devices8):
    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.register_buffer("shift", torch.zeros(4))

        def forward(self, x):
            return self.lin(x) + self.shift

    torch.manual_seed(0)
    cpu = Scaled()
    mod = spmdtorch.assume_pure(copy.deepcopy(cpu).to("xla"))
    assert spmdtorch.assume_pure(mod) is mod  # marking twice is harmless
    x = torch.randn(3, 4)
    for step in range(3):
        with torch.no_grad():  # both change between calls: the recording must not keep the old values
            cpu.lin.weight.mul_(0.5)
            mod.lin.weight.mul_(0.5)
            cpu.shift.fill_(step)
            mod.shift.fill_(step)
        torch.testing.assert_close(mod(x.to("xla")).cpu(), cpu(x), **TOL)
    assert mod.forward.cache_size() == 1
    assert set(mod.state_dict()) == set(cpu.state_dict())


def _llama(n_layers=2):
    cfg = LlamaConfig(vocab_size=64, dim=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg), torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(1))


# Without checkpoint_module in the slow tier (13 s); the default case covers both together.
@pytest.mark.parametrize(
    "remat", [pytest.param(False, marks=pytest.mark.slow), True], ids=["plain", "checkpoint_module"]
)
def test_fsdpv2_llama_trains_like_eager_with_fewer_ops(devices8, remat):
    model, tokens = _llama()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    wrap = (lambda m, *a, **k: FSDPv2(checkpoint_module(m), *a, **k)) if remat else None
    sharded = FSDPv2(copy.deepcopy(model).to("xla"), mesh=mesh, auto_wrap_policy=policy, auto_wrapper_callable=wrap)
    for layer in sharded.layers:
        spmdtorch.assume_pure(layer)
    opt = torch.optim.AdamW(sharded.parameters(), lr=1e-2)
    tok = tokens.to("xla")
    for _ in range(3):
        ref_opt.zero_grad()
        want = causal_lm_loss(ref(tokens), tokens)
        want.backward()
        ref_opt.step()
        with spmdtorch.step():
            opt.zero_grad()
            loss = causal_lm_loss(sharded(tok), tok)
            loss.backward()
            opt.step()
        torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(ref.named_parameters(), sharded.parameters()):
        torch.testing.assert_close(q.cpu(), p.detach(), rtol=1e-3, atol=2e-4, msg=name)
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=name)  # the last step's
    assert [layer.forward.cache_size() for layer in sharded.layers] == [1, 1]
    assert all(entry.remat == remat for layer in sharded.layers for entry in layer.forward._cache.values())
    # FSDPv2's output annotation, made inside the recorded layer, is on the layer's output.
    with torch.no_grad():
        h = sharded.layers[0](sharded.tok_embeddings(tok), *rope_tables(sharded.cfg, 16, device=tok.device))
    assert get_sharding_spec(h) == "{devices=[8,1,1]0,1,2,3,4,5,6,7}"


@pytest.mark.slow  # docs/training.md's assume_pure block (tests/test_docs_blocks.py) asserts the same drop in the default suite
def test_one_node_per_layer_call_after_the_first_step(devices8):
    model, tokens = _llama(n_layers=4)
    model = model.to("xla")
    tok = tokens.to("xla")

    def step():
        with spmdtorch.step():
            causal_lm_loss(model(tok), tok).backward()

    # A process's very first step dispatches one op more (one-time set-up): count from the second.
    plain = [_ops(step)[0] for _ in range(3)][1:]
    for layer in model.layers:
        spmdtorch.assume_pure(layer)
    pure = [_ops(step)[0] for _ in range(3)]
    assert plain[0] == plain[1]
    # Four layers' forward and backward ops (~100 each) are no longer dispatched after the first call.
    assert pure[1] == pure[2] and plain[1] - pure[1] > 4 * 100, (plain, pure)


def test_works_under_compile_and_nested(devices8):
    inner = spmdtorch.assume_pure(lambda a, b: a * b + 1)

    @spmdtorch.assume_pure
    def outer(a, b):
        return inner(a, b).sin() + inner(b, a)

    def step(a, b):
        return outer(a, b).sum()

    compiled = spmdtorch.compile(step)
    a, b = torch.randn(5), torch.randn(5)
    want = ((a * b + 1).sin() + (b * a + 1)).sum()
    for _ in range(4):
        torch.testing.assert_close(compiled(a.to("xla"), b.to("xla")).cpu(), want, **TOL)


def test_unused_output_gets_zero_cotangent(devices8):
    pure = spmdtorch.assume_pure(lambda x: (x * 2, x.exp()))
    x_ref = torch.randn(3, requires_grad=True)
    (x_ref * 2).sum().backward()
    x = x_ref.detach().to("xla").requires_grad_()
    y, _ = pure(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), x_ref.grad)


# -- what it refuses, by name -----------------------------------------------------------


def test_refuses_random_numbers(devices8):
    layer = spmdtorch.assume_pure(nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).to("xla"))
    with pytest.raises(spmdtorch.AssumePureError, match="draws random numbers"):
        layer(torch.ones(2, 4, device="xla"))
    layer.eval()  # no dropout in eval mode: the training flag is part of the signature
    torch.testing.assert_close(layer(torch.ones(2, 4, device="xla")).cpu(), layer[0].cpu()(torch.ones(2, 4)))


def test_refuses_buffer_updates_in_place(devices8):
    bn = spmdtorch.assume_pure(nn.BatchNorm1d(4).to("xla"))
    with pytest.raises(spmdtorch.AssumePureError, match="in place"):
        bn(torch.randn(8, 4).to("xla"))
    assert torch.equal(bn.running_mean.cpu(), torch.zeros(4))  # nothing half-applied


def test_refuses_a_pending_tensor_from_a_closure(devices8):
    outside = torch.ones(3, device="xla") * 2  # pending: computed in this step
    pure = spmdtorch.assume_pure(lambda x: x + outside)
    with pytest.raises(spmdtorch.AssumePureError, match="computed outside it"):
        pure(torch.ones(3, device="xla"))


def test_refuses_a_closed_over_tensor_that_requires_grad(devices8):
    w = torch.ones(3, device="xla").requires_grad_()
    spmdtorch.sync()
    pure = spmdtorch.assume_pure(lambda x: x * w)
    with pytest.raises(spmdtorch.AssumePureError, match="requires grad"):
        pure(torch.ones(3, device="xla"))


def test_refuses_host_reads(devices8):
    pure = spmdtorch.assume_pure(lambda x: x * 2 if x.sum().item() > 0 else x)
    with pytest.raises(spmdtorch.AssumePureError, match="on the host"):
        pure(torch.ones(3, device="xla"))


class _Scaled(nn.Module):
    """A forward that branches on a plain attribute."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 3)
        self.scale = 2.0
        self.relu = True

    def forward(self, x):
        y = self.inner(x) * self.scale
        return torch.relu(y) if self.relu else y


def _eager_twin(marked: nn.Module) -> nn.Module:
    """A CPU copy of a marked module, unmarked (same weights, attributes and hooks)."""
    twin = copy.deepcopy(marked).cpu()
    del twin.forward  # the marked forward is an instance attribute; the class's runs
    return twin


def test_submodule_forward_hooks_and_plain_attributes_are_part_of_the_signature(devices8):
    torch.manual_seed(0)
    m = spmdtorch.assume_pure(_Scaled().to("xla"))
    x = torch.randn(5, 4)

    def check():
        torch.testing.assert_close(m(x.to("xla")).cpu(), _eager_twin(m)(x), **TOL)

    check()
    # A hook added after the first recording changes what the body computes:
    # it must record again, not replay the recording made without it.
    handle = m.inner.register_forward_hook(lambda mod, args, out: out * -1.0)
    check()
    assert m.forward.cache_size() == 2
    handle.remove()
    check()  # the first recording again
    assert m.forward.cache_size() == 2
    m.scale = 0.5  # a plain attribute the forward reads
    check()
    m.relu = False  # ... and branches on
    check()
    assert m.forward.cache_size() == 4
    pre = torch.nn.modules.module.register_module_forward_pre_hook(lambda mod, args: (args[0] * 3.0,))
    try:
        check()  # a global hook runs on the submodules inside the body too
    finally:
        pre.remove()
    assert m.forward.cache_size() == 5


class _Counting(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1  # a side effect on a plain attribute: every call is a new signature
        return self.lin(x)


def test_a_signature_that_keeps_changing_is_reported_once(devices8):
    m = spmdtorch.assume_pure(nn.Sequential(_Counting()).to("xla"))
    x = torch.ones(2, 4, device="xla")
    with pytest.warns(RuntimeWarning, match=r"recorded 16 signatures.*submodule #1.*attribute\(s\) 'calls'") as rec:
        for _ in range(20):
            m(x)
    assert len([w for w in rec if "signatures" in str(w.message)]) == 1
    assert m[0].calls == 20  # recorded again each time, so the forward's effect happened on every call
    f = spmdtorch.assume_pure(lambda x, n: x * n)
    with pytest.warns(RuntimeWarning, match="non-tensor argument's value.*0-d tensor"):
        for i in range(17):
            torch.testing.assert_close(f(x, i).cpu(), torch.full((2, 4), float(i)))


def test_refuses_backward_hooks_inside(devices8):
    m = spmdtorch.assume_pure(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).to("xla"))
    x = torch.ones(2, 4, device="xla", requires_grad=True)
    handle = m[0].register_full_backward_hook(lambda mod, gin, gout: None)
    with pytest.raises(spmdtorch.AssumePureError, match="submodule Linear has a backward hook"):
        m(x)
    handle.remove()
    handle = torch.nn.modules.module.register_module_full_backward_hook(lambda mod, gin, gout: None)
    try:
        with pytest.raises(spmdtorch.AssumePureError, match="global module backward hook"):
            m(x)
    finally:
        handle.remove()
    # The marked module's own backward hook runs around the recorded body: allowed, and it runs.
    seen = []
    m.register_full_backward_hook(lambda mod, gin, gout: seen.append(gout[0].shape))
    m(x).sum().backward()
    assert seen == [torch.Size([2, 2])] and x.grad.shape == (2, 4)


def test_bad_arguments_are_named(devices8):
    pure = spmdtorch.assume_pure(lambda x, opts, past_key_values=None: x)
    with pytest.raises(AssumePureTypeError, match="tensor on cpu as argument 0"):
        pure(torch.ones(2), None)
    with pytest.raises(AssumePureTypeError, match=r"got a set as keyword 'opts'\['a'\]"):
        pure(torch.ones(2, device="xla"), opts={"a": {1, 2}})  # a set is one pytree leaf, and mutable
    with pytest.raises(AssumePureTypeError, match="got a DynamicCache as keyword 'past_key_values'.*use_cache=False"):
        pure(torch.ones(2, device="xla"), opts=None, past_key_values=transformers.DynamicCache())
    with pytest.raises(TypeError, match="fn"):
        spmdtorch.assume_pure(3)


def test_closure_over_concrete_tensor_is_a_constant_like_jax_jit(devices8):
    table = torch.arange(3.0).to("xla")
    spmdtorch.sync()
    pure = spmdtorch.assume_pure(lambda x: x + table)
    torch.testing.assert_close(pure(torch.zeros(3, device="xla")).cpu(), torch.arange(3.0))


def test_hugging_face_llama_layers_train_like_eager(devices8):
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,  # a KV cache is an object the layers update: not a pure argument
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).train()
    ref = copy.deepcopy(model)
    xla = copy.deepcopy(model).to("xla")
    for layer in xla.model.layers:
        spmdtorch.assume_pure(layer)
    tok = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))
    ref_opt, opt = torch.optim.AdamW(ref.parameters(), lr=1e-3), torch.optim.AdamW(xla.parameters(), lr=1e-3)
    for _ in range(2):
        ref_opt.zero_grad()
        want = ref(tok, labels=tok).loss
        want.backward()
        ref_opt.step()
        with spmdtorch.step():
            opt.zero_grad()
            loss = xla(tok.to("xla"), labels=tok.to("xla")).loss
            loss.backward()
            opt.step()
        torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ref.named_parameters(), xla.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-3, atol=1e-5, msg=name)
    assert [layer.forward.cache_size() for layer in xla.model.layers] == [1, 1]
    xla.config.use_cache = True
    with pytest.raises(AssumePureTypeError, match="DynamicCache as keyword 'cache'"):  # transformers 5's name
        xla(tok.to("xla"))


def test_autocast_is_part_of_the_signature(devices8):
    lin = nn.Linear(8, 8)
    pure = spmdtorch.assume_pure(copy.deepcopy(lin).to("xla"))
    x = torch.randn(4, 8)
    full = pure(x.to("xla"))
    with torch.autocast("xla", dtype=torch.bfloat16):
        half = pure(x.to("xla"))
    assert full.dtype == torch.float32 and half.dtype == torch.bfloat16
    assert pure.forward.cache_size() == 2
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = lin(x)
    torch.testing.assert_close(half.cpu(), want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(full.cpu(), lin(x), **TOL)


def test_copies_and_pickles_of_a_marked_module_use_their_own_parameters(devices8, tmp_path):
    torch.manual_seed(0)
    mod = spmdtorch.assume_pure(nn.Linear(4, 4).to("xla"))
    x = torch.ones(2, 4, device="xla")
    y = mod(x).cpu()
    twin = copy.deepcopy(mod)
    with torch.no_grad():
        twin.weight.mul_(2)
    assert twin.forward.cache_size() == 0 and isinstance(twin.__dict__["forward"], type(mod.forward))
    torch.testing.assert_close(twin(x).cpu(), y * 2 - mod.bias.cpu(), **TOL)  # 2Wx + b
    torch.testing.assert_close(mod(x).cpu(), y, **TOL)
    torch.save(mod, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    torch.testing.assert_close(loaded(x).cpu(), y, **TOL)
    assert loaded.forward.cache_size() == 1 and loaded.forward._module is loaded
