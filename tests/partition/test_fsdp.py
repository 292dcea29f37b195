"""FSDPv2 (SpmdFullyShardedDataParallel) and the auto-wrap policies.

On an 8-way "fsdp" mesh: each parameter is split on its largest dim, each
wrapper's output on dim 0 (the batch); an MLP and a Llama-style decoder
(auto-wrapped per DecoderLayer) train to the same losses and parameters as
the unwrapped model in eager CPU torch, lazily and under ``spmdtorch.compile``.
"""

from __future__ import annotations

import collections
import copy
import doctest
import functools
import importlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from training_helpers import assert_adamw_params_close, train_eager

import spmdtorch
from spmdtorch import debug
from spmdtorch.fsdp import (
    FSDPv2,
    FSDPv2Error,
    FSDPv2MeshError,
    FSDPv2OutputError,
    FSDPv2WrapError,
    SpmdFullyShardedDataParallel,
    lambda_auto_wrap_policy,
    load_plain_state_dict,
    plain_state_dict,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)
from spmdtorch.mesh import Mesh, set_global_mesh
from spmdtorch.models.llama import (
    DecoderLayer,
    LlamaConfig,
    LlamaForCausalLM,
    causal_lm_loss,
)
from spmdtorch.partition import get_sharding_spec, local_shards, mark_sharding

STEPS = 5
ALL8 = "0,1,2,3,4,5,6,7"
ROWS = f"{{devices=[8,1]{ALL8}}}"  # 2-D, dim 0 over fsdp
COLS = f"{{devices=[1,8]{ALL8}}}"  # 2-D, dim 1 over fsdp
VEC = f"{{devices=[8]{ALL8}}}"  # 1-D
BATCH3 = f"{{devices=[8,1,1]{ALL8}}}"  # 3-D activations, dim 0 over fsdp

LLAMA_SPECS = {  # LlamaConfig.tiny(): dim 64, kv 32, ffn 172, vocab 256
    "tok_embeddings.weight": ROWS,  # (256, 64)
    "attention_norm.weight": VEC,
    "attention.wq.weight": ROWS,  # (64, 64): a tie, the first dim
    "attention.wk.weight": COLS,  # (32, 64)
    "attention.wv.weight": COLS,
    "attention.wo.weight": ROWS,
    "ffn_norm.weight": VEC,
    "feed_forward.w1.weight": ROWS,  # (172, 64): uneven, padded
    "feed_forward.w2.weight": COLS,  # (64, 172)
    "feed_forward.w3.weight": ROWS,
    "norm.weight": VEC,
    "output.weight": ROWS,  # (256, 64)
}


@pytest.fixture
def mesh():
    return Mesh(np.arange(8), (8,), ("fsdp",))


@pytest.fixture(autouse=True)
def no_global_mesh():
    set_global_mesh(None)
    yield
    set_global_mesh(None)


def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 64),
        torch.nn.GELU(),
        torch.nn.Linear(64, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 32),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 4),
    )


MLP_SPECS = {
    "0.weight": ROWS,
    "0.bias": VEC,  # (64, 16)
    "2.weight": COLS,
    "2.bias": VEC,  # (32, 64)
    "4.weight": ROWS,
    "4.bias": VEC,  # (32, 32): a tie, the first dim
    "6.weight": COLS,
    "6.bias": VEC,  # (4, 32); the bias (4,) is uneven, padded
}


def make_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig.tiny())


def decoder_policy():
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})


def mlp_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]


def llama_batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 256, (8, 16), generator=g),) for _ in range(STEPS)]


def mlp_loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def llama_loss(model, batch):
    (tokens,) = batch
    return causal_lm_loss(model(tokens), tokens)


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
}


def check_specs(model, expected):
    """Every parameter's HLO sharding string, by its unwrapped name."""
    got = {}
    for name, p in plain_state_dict(model, keep_vars=True).items():
        got[name] = get_sharding_spec(p)
        for suffix, spec in expected.items():
            if name == suffix or name.endswith("." + suffix):
                assert got[name] == spec, (name, got[name], spec)
                break
        else:
            raise AssertionError(f"no expected spec for {name}")
    # and the data really is split: each device holds 1/8 of the sharded dim
    for name, p in plain_state_dict(model, keep_vars=True).items():
        dim = 0 if got[name] in (ROWS, VEC) else 1
        for shard in local_shards(p):
            assert shard.data.shape[dim] <= -(-p.shape[dim] // 8), (name, shard)


def test_mlp_parameters_on_their_largest_dim_and_output_on_dim_0(mesh):
    model = FSDPv2(make_mlp(), mesh=mesh)
    check_specs(model, MLP_SPECS)
    assert all(p.device.type == "xla" for p in model.parameters())
    out = model(torch.randn(8, 16, device="xla"))
    assert get_sharding_spec(out) == ROWS
    spmdtorch.sync()
    assert get_sharding_spec(out) == ROWS
    assert local_shards(out)[0].data.shape == (1, 4)


def test_llama_auto_wrapped_per_decoder_layer(mesh):
    model = FSDPv2(make_llama(), mesh=mesh, auto_wrap_policy=decoder_policy())
    assert [type(layer) for layer in model.layers] == [FSDPv2, FSDPv2]
    assert [type(layer.module) for layer in model.layers] == [DecoderLayer, DecoderLayer]
    # nothing else was wrapped
    wrapped = [name for name, m in model.named_modules() if isinstance(m, FSDPv2)]
    assert wrapped == ["", "_orig_module.layers.0", "_orig_module.layers.1"]
    check_specs(model, LLAMA_SPECS)

    layer_outputs = []
    for layer in model.layers:
        layer.register_forward_hook(lambda m, args, out: layer_outputs.append(get_sharding_spec(out)))
    logits = model(torch.randint(0, 256, (8, 16), device="xla"))
    assert layer_outputs == [BATCH3, BATCH3]
    assert get_sharding_spec(logits) == BATCH3


# Every optimizer and mode on the MLP; the decoder (~10 s of XLA compiles per
# case on 8 CPU devices) with AdamW compiled, to stay in budget (SGD lazily in
# the slow tier).
@pytest.mark.parametrize(
    "model_name,opt_name,mode",
    [
        ("mlp", "sgd", "lazy"),
        ("mlp", "sgd", "compiled"),
        ("mlp", "adamw", "lazy"),
        ("mlp", "adamw", "compiled"),
        pytest.param("llama", "sgd", "lazy", marks=pytest.mark.slow),
        ("llama", "adamw", "compiled"),
    ],
)
def test_training_matches_unwrapped_eager(mesh, model_name, opt_name, mode):
    make, batches, loss_fn, specs, policy = {
        "mlp": (make_mlp, mlp_batches, mlp_loss, MLP_SPECS, None),
        "llama": (make_llama, llama_batches, llama_loss, LLAMA_SPECS, decoder_policy()),
    }[model_name]
    data = batches()
    ref = make()
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=policy)
    ref_losses = train_eager(ref, OPTIMIZERS[opt_name](ref.parameters()), data, loss_fn)
    opt = OPTIMIZERS[opt_name](model.parameters())

    def step(*b):
        opt.zero_grad()
        loss = loss_fn(model, b)
        loss.backward()
        opt.step()
        return loss

    def shard_batch(b):  # the batch dim over "fsdp", as the outputs are
        return tuple(mark_sharding(t.to("xla"), mesh, ("fsdp",) + (None,) * (t.dim() - 1)) for t in b)

    before = debug.counter_value("UncachedCompile")
    if mode == "lazy":
        losses = []
        for b in data:
            b = shard_batch(b)
            with spmdtorch.step():
                losses.append(step(*b))
    else:
        compiled = spmdtorch.compile(step)
        losses = [compiled(*shard_batch(b)) for b in data]
    losses = [loss.item() for loss in losses]
    compiles = debug.counter_value("UncachedCompile") - before

    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
    # Gradients agree with eager to float32 rounding (~6e-7 relative); the
    # partitioned program sums partial matmuls in another order: every
    # element within rtol=1e-5. Adam divides by sqrt(v), which amplifies that
    # rounding for the decoder's weights whose gradients are near zero (see
    # assert_adamw_params_close); the MLP has none and holds to 1e-5 as well.
    got = plain_state_dict(model, keep_vars=True)
    if (model_name, opt_name) == ("llama", "adamw"):
        assert_adamw_params_close(got, ref, lr=1e-2, steps=STEPS)
    else:
        ref_params = dict(ref.named_parameters())
        assert set(got) == set(ref_params)
        for name, p_ref in ref_params.items():
            torch.testing.assert_close(
                got[name].cpu(), p_ref.detach(), rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
            )
    check_specs(model, specs)  # the optimizer's overwrites kept the shardings
    assert compiles <= 2, f"{compiles} compilations for {STEPS} steps"


def test_extra_data_axis_shards_batch_over_both_axes_and_weights_over_fsdp():
    mesh = Mesh(np.arange(8), (2, 4, 1), ("data", "fsdp", "tensor"))
    ref = make_llama()
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh, auto_wrap_policy=decoder_policy(), extra_data_axis="data")
    # weights: "fsdp" only, replicated over "data": fsdp block j on devices j and 4 + j
    rows = "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    cols = "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    vec = "{devices=[4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    check = {
        "tok_embeddings.weight": rows,
        "attention.wk.weight": cols,
        "feed_forward.w2.weight": cols,
        "feed_forward.w1.weight": rows,
        "norm.weight": vec,
        "output.weight": rows,
    }
    specs = {n: get_sharding_spec(p) for n, p in plain_state_dict(model, keep_vars=True).items()}
    for name, spec in specs.items():
        for suffix, expected in check.items():
            if name.endswith(suffix):
                assert spec == expected, (name, spec, expected)
    ref_spec = mark_sharding(torch.zeros(64, 64, device="xla"), mesh, ("fsdp", None))
    assert specs["layers.0.attention.wq.weight"] == get_sharding_spec(ref_spec) == rows

    # outputs (the decoder layers' too): dim 0 over ("data", "fsdp") = all 8 devices in order
    outs = []
    for layer in model.layers:
        layer.register_forward_hook(lambda m, args, out: outs.append(get_sharding_spec(out)))
    tokens = torch.randint(0, 256, (8, 16))
    logits = model(mark_sharding(tokens.to("xla"), mesh, (("data", "fsdp"), None)))
    both = get_sharding_spec(mark_sharding(torch.zeros(8, 2, 2, device="xla"), mesh, (("data", "fsdp"), None, None)))
    assert get_sharding_spec(logits) == both == BATCH3
    assert outs == [BATCH3, BATCH3]
    assert local_shards(logits)[0].data.shape == (1, 16, 256)
    torch.testing.assert_close(logits.cpu(), ref(tokens).detach(), rtol=1e-5, atol=1e-5)


def test_global_mesh_is_used_when_no_mesh_is_given(mesh):
    set_global_mesh(mesh)
    model = SpmdFullyShardedDataParallel(torch.nn.Linear(16, 64))
    assert model.mesh is mesh
    assert get_sharding_spec(model.module.weight) == ROWS


def test_parameters_already_sharded_are_left_alone(mesh):
    inner = make_mlp().to("xla")
    mark_sharding(inner[0].weight, mesh, (None, "fsdp"))  # not its largest dim
    mark_sharding(inner[2].weight, mesh, (None, None))  # annotated replicated
    model = FSDPv2(inner, mesh=mesh)
    assert get_sharding_spec(model.module[0].weight) == COLS
    assert get_sharding_spec(model.module[2].weight) == "{replicated}"
    assert get_sharding_spec(model.module[4].weight) == ROWS


class Pair(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y, y.sum()


Out = collections.namedtuple("Out", "logits aux")


class Named(Pair):
    def forward(self, x):
        y = self.lin(x)
        return Out(y.t(), y.sum())  # element 0 a view


class Dict(Pair):
    def forward(self, x):
        return {"logits": self.lin(x)}


class Identity(torch.nn.Module):
    def forward(self, x):
        return x


def test_tuple_output_shards_element_0_with_a_warning(mesh):
    model = FSDPv2(Pair(), mesh=mesh)
    with pytest.warns(UserWarning, match="only element 0 is sharded"):
        y, s = model(torch.randn(16, 8, device="xla"))
    assert get_sharding_spec(y) == ROWS
    assert get_sharding_spec(s) == ""


def test_view_outputs_and_returned_inputs_are_sharded_through_a_copy(mesh):
    model = FSDPv2(Named(), mesh=mesh)
    x = torch.randn(16, 8)
    with pytest.warns(UserWarning):
        out = model(x.to("xla"))
    assert isinstance(out, Out)
    assert get_sharding_spec(out.logits) == ROWS
    torch.testing.assert_close(out.logits.cpu(), model.module.lin(x.to("xla")).t().cpu())

    ident = FSDPv2(Identity(), mesh=mesh)
    xx = mark_sharding(torch.randn(8, 4).to("xla"), mesh, (None, "fsdp"))
    y = ident(xx)
    assert get_sharding_spec(y) == ROWS
    assert get_sharding_spec(xx) == COLS  # the input keeps its own sharding


def test_other_outputs_need_a_user_shard_output(mesh):
    model = FSDPv2(Dict(), mesh=mesh)
    with pytest.raises(FSDPv2OutputError, match=r"returned a dict.*shard_output="):
        model(torch.randn(16, 8, device="xla"))

    calls = []

    def shard_output(output, mesh):
        calls.append(mesh)
        mark_sharding(output["logits"], mesh, (None, "fsdp"))

    model = FSDPv2(Dict(), mesh=mesh, shard_output=shard_output)
    out = model(torch.randn(16, 8, device="xla"))
    assert calls == [mesh]
    assert get_sharding_spec(out["logits"]) == COLS


def test_error_no_mesh():
    with pytest.raises(FSDPv2MeshError, match=r"no global mesh.*set_global_mesh"):
        FSDPv2(torch.nn.Linear(4, 4))


def test_error_no_fsdp_axis():
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    with pytest.raises(FSDPv2MeshError, match=r"axis named 'fsdp'.*\('data', 'model'\)"):
        FSDPv2(torch.nn.Linear(4, 4), mesh=mesh)
    with pytest.raises(FSDPv2MeshError, match="axis named 'fsdp'"):
        FSDPv2(torch.nn.Linear(4, 4), mesh=Mesh(np.arange(8), (8,)))  # unnamed


def test_error_unknown_extra_data_axis(mesh):
    two = Mesh(np.arange(8), (2, 4), ("data", "fsdp"))
    with pytest.raises(FSDPv2MeshError, match=r"extra_data_axis='batch'.*\['data'\]"):
        FSDPv2(torch.nn.Linear(4, 4), mesh=two, extra_data_axis="batch")
    with pytest.raises(FSDPv2MeshError, match="extra_data_axis='fsdp'"):
        FSDPv2(torch.nn.Linear(4, 4), mesh=two, extra_data_axis="fsdp")
    with pytest.raises(FSDPv2MeshError, match="extra_data_axis='data'"):
        FSDPv2(torch.nn.Linear(4, 4), mesh=mesh, extra_data_axis="data")


def test_error_wrapping_twice(mesh):
    model = FSDPv2(torch.nn.Linear(4, 4), mesh=mesh)
    with pytest.raises(FSDPv2WrapError, match="already wrapped.*inner children first"):
        FSDPv2(model, mesh=mesh)
    outer = torch.nn.Sequential(model, torch.nn.Linear(4, 4))
    FSDPv2(outer, mesh=mesh)  # nesting by hand is fine
    with pytest.raises(FSDPv2WrapError, match=r"submodule '0'.*already an FSDPv2.*auto_wrap_policy"):
        FSDPv2(
            torch.nn.Sequential(FSDPv2(torch.nn.Linear(4, 4), mesh=mesh)), mesh=mesh, auto_wrap_policy=decoder_policy()
        )


def test_error_module_without_forward(mesh):
    with pytest.raises(
        FSDPv2WrapError, match=r"ModuleList does not.*defines forward\(\)|defines forward\(\).*ModuleList"
    ):
        FSDPv2(torch.nn.ModuleList([torch.nn.Linear(4, 4)]), mesh=mesh)
    assert issubclass(FSDPv2WrapError, RuntimeError) and issubclass(FSDPv2MeshError, FSDPv2Error)
    assert issubclass(FSDPv2Error, ValueError)


def test_module_and_attribute_forwarding(mesh):
    inner = make_llama()
    model = FSDPv2(inner, mesh=mesh, auto_wrap_policy=decoder_policy())
    assert model.module is inner
    assert model.cfg is inner.cfg  # a plain attribute of the wrapped module
    assert model.layers is inner.layers  # a submodule
    assert model.output.weight is inner.output.weight
    assert model.layers[0].attention is inner.layers[0].module.attention
    with pytest.raises(AttributeError, match="no_such_thing"):
        _ = model.no_such_thing
    seq = FSDPv2(make_mlp(), mesh=mesh)
    assert seq[0] is seq.module[0]
    assert "mesh_shape=(8,)" in repr(seq)


def test_state_dict_keys_and_plain_state_dict(mesh):
    ref = make_mlp()
    model = FSDPv2(copy.deepcopy(ref), mesh=mesh)
    assert list(model.state_dict()) == ["_orig_module." + k for k in ref.state_dict()]  # as PyTorch/XLA
    plain = plain_state_dict(model)
    assert list(plain) == list(ref.state_dict())
    # into an unwrapped CPU model
    cpu = make_mlp()
    with torch.no_grad():
        for p in cpu.parameters():
            p.zero_()
    cpu.load_state_dict({k: v.cpu() for k, v in plain.items()})
    for k, v in cpu.state_dict().items():
        torch.testing.assert_close(v, ref.state_dict()[k])
    # and back into a wrapped one, whose parameters keep their shardings
    other = FSDPv2(torch.nn.Sequential(*[copy.deepcopy(m) for m in make_mlp()]), mesh=mesh)
    with torch.no_grad():
        for p in other.parameters():
            p.zero_()
    result = load_plain_state_dict(other, ref.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    check_specs(other, MLP_SPECS)
    for k, v in plain_state_dict(other).items():
        torch.testing.assert_close(v.cpu(), ref.state_dict()[k])
    with pytest.raises(RuntimeError, match="bogus"):
        load_plain_state_dict(other, {**ref.state_dict(), "bogus": torch.zeros(1)})


# ---- auto-wrap policies --------------------------------------------------------------------


def test_policies_agree_with_torch():
    wrap = pytest.importorskip("torch.distributed.fsdp.wrap")
    model = make_llama()
    ours_theirs = [
        (
            functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer}),
            functools.partial(wrap.transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer}),
        ),
        (
            functools.partial(size_based_auto_wrap_policy, min_num_params=5000),
            functools.partial(wrap.size_based_auto_wrap_policy, min_num_params=5000),
        ),
        (
            functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, torch.nn.Linear)),
            functools.partial(wrap.lambda_auto_wrap_policy, lambda_fn=lambda m: isinstance(m, torch.nn.Linear)),
        ),
    ]
    for ours, theirs in ours_theirs:
        for m in model.modules():
            n = sum(p.numel() for p in m.parameters())
            for recurse in (True, False):
                for numel in (n, n // 3):
                    kw = {"module": m, "recurse": recurse, "nonwrapped_numel": numel}
                    assert ours(**kw) == theirs(**kw), (type(m).__name__, recurse, numel)


def test_size_based_policy_wraps_large_children(mesh):
    # Each DecoderLayer holds 12,288 (attention) + 33,024 (feed-forward) + 128 = 45,440
    # parameters; the embedding and the output 16,384 each.
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=20_000)
    model = FSDPv2(make_llama(), mesh=mesh, auto_wrap_policy=policy)
    wrapped = sorted(
        name.replace("_orig_module.", "") for name, m in model.named_modules() if isinstance(m, FSDPv2) and name
    )
    # the layers' feed-forwards are large; each layer's leftover (attention + norms) is not
    assert wrapped == ["layers.0.feed_forward", "layers.1.feed_forward"]
    check_specs(model, LLAMA_SPECS)


def test_torch_policy_and_auto_wrapper_callable(mesh):
    wrap = pytest.importorskip("torch.distributed.fsdp.wrap")
    seen = []

    def wrapper(m, **kwargs):
        seen.append((type(m).__name__, sorted(kwargs)))
        return FSDPv2(m, **kwargs)

    policy = functools.partial(wrap.transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(make_llama(), mesh=mesh, auto_wrap_policy=policy, auto_wrapper_callable=wrapper)
    assert seen == [("DecoderLayer", ["extra_data_axis", "mesh", "shard_output"])] * 2
    assert all(isinstance(layer, FSDPv2) for layer in model.layers)


def test_deepcopy_keeps_wrapper_and_shardings(mesh):
    model = FSDPv2(make_mlp(), mesh=mesh)
    twin = copy.deepcopy(model)
    assert isinstance(twin, FSDPv2) and twin.mesh == mesh and twin.module is not model.module
    check_specs(twin, MLP_SPECS)


@pytest.mark.parametrize("name", ["spmdtorch.fsdp._fsdpv2", "spmdtorch.fsdp._wrap"])
def test_doctests(devices8, name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
