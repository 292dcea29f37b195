"""parallelize_llama: torchtitan's FSDP + TP + loss-parallel + AC recipe for spmdtorch's and transformers' Llama.

Trained against eager CPU (lazy and compiled), and its step program's collectives compared with those of the
mark_sharding program that lays the parameters out the same way.
"""

from __future__ import annotations

import collections
import copy
import functools
import gc
import math
import re

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import loss_parallel

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import (
    DTensorError,
    UnknownModelFamilyError,
    XlaDTensor,
    init_device_mesh,
    parallelize_llama,
    spmd_mesh,
)
from spmdtorch.fsdp import checkpoint_module
from spmdtorch.models import LlamaConfig, LlamaForCausalLM
from spmdtorch.sharding import get_sharding_spec, mark_sharding

VOCAB, SEQ, BATCH = 64, 8, 4

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint_module on the CPU backend:RuntimeWarning")


def _spmdtorch_llama() -> nn.Module:
    return LlamaForCausalLM(
        LlamaConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=64, max_seq_len=SEQ)
    )


def _hf_llama() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
        # A KV cache would be appended to again by the checkpointed layers' recomputation (HF's own gradient
        # checkpointing turns it off in training too).
        use_cache=False,
    )
    return transformers.LlamaForCausalLM(cfg)


# family -> (builder, forward, the parameter names of one layer's roles and the root's)
FAMILIES = {
    "spmdtorch": (_spmdtorch_llama, lambda m, x: m(x)),
    "transformers": (_hf_llama, lambda m, x: m(input_ids=x).logits),
}

# The layout parallelize_llama gives each parameter, as mark_sharding specs over ("dp", "tp"): TP's Shard(0) of
# column-wise weights, the embedding (row-wise on the vocabulary) and the head (column-wise), composed with FSDP's
# Shard(0) over dp, splits dim 0 over (dp, tp); row-wise weights are Shard(1) over tp and Shard(0) over dp; the
# norms are replicated over tp and split over dp.
_SPECS = [
    (r"(tok_embeddings|embed_tokens|output|lm_head)\.weight$", (("dp", "tp"), None)),
    (r"(wq|wk|wv|w1|w3|q_proj|k_proj|v_proj|gate_proj|up_proj)\.weight$", (("dp", "tp"), None)),
    (r"(wo|w2|o_proj|down_proj)\.weight$", ("dp", "tp")),
    (r"norm\.weight$|layernorm\.weight$", ("dp",)),
]


def _spec_for(name: str) -> tuple:
    for pattern, spec in _SPECS:
        if re.search(pattern, name):
            return spec
    raise AssertionError(f"no expected layout for parameter {name}")


@pytest.fixture
def mesh(devices8):
    return init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def _on_xla(mesh, x: torch.Tensor) -> torch.Tensor:
    # The global batch, split over dp as torchtitan's per-rank data loaders split it.
    return mark_sharding(x.to("xla"), spmd_mesh(mesh), ("dp", None))


def _eager_losses(ref: nn.Module, forward, steps: int) -> list[float]:
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    out = []
    for step in range(steps):
        x, y = _batch(step)
        loss = _ce(forward(ref, x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(float(loss.detach()))
    return out


def _check_params(model: nn.Module, ref: nn.Module) -> None:
    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in ref.named_parameters()]
    for name in names[:2] + names[-3:]:  # the embedding, a norm, a layer weight, the final norm and the head
        p = model.get_parameter(name)
        assert isinstance(p, XlaDTensor), name
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), atol=2e-5, rtol=2e-5, msg=name
        )


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_lazy_training_equals_eager(mesh, family):
    build, forward = FAMILIES[family]
    torch.manual_seed(0)
    ref = build()
    model = parallelize_llama(copy.deepcopy(ref), mesh)
    for name, p in model.named_parameters():
        want = get_sharding_spec(mark_sharding(torch.zeros(p.shape, device="xla"), spmd_mesh(mesh), _spec_for(name)))
        assert get_sharding_spec(p.to_local()) == want, name
    layer0 = model.get_submodule("layers.0" if family == "spmdtorch" else "model.layers.0")
    wq = layer0.get_submodule("attention.wq" if family == "spmdtorch" else "self_attn.q_proj").weight
    assert wq.placements == (Shard(0), Shard(0)) and wq.device_mesh.mesh_dim_names == ("dp", "tp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(3):
        x, y = _batch(step)
        with spmdtorch.step():
            logits = forward(model, _on_xla(mesh, x))
            # loss_parallel=True: the logits stay split over the vocabulary.
            assert isinstance(logits, DTensor) and logits.placements == (Shard(2),)
            with loss_parallel():
                loss = _ce(logits, y.to("xla"))
                loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(float(loss.full_tensor().detach().cpu()))
    want = _eager_losses(ref, forward, 3)
    torch.testing.assert_close(losses, want, atol=2e-5, rtol=2e-5)
    _check_params(model, ref)


def _compiled_training_replays(mesh, model: nn.Module, ref: nn.Module, forward) -> None:
    """Six compiled AdamW steps of ``model`` equal eager ``ref``'s; three traces at most, then replays."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    @spmdtorch.compile
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with loss_parallel():
            loss = _ce(forward(model, x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.full_tensor().detach()

    traces = debug.counter_value("CompiledTrace") or 0
    replays = debug.counter_value("CompiledReplay") or 0
    losses = []
    for i in range(6):
        x, y = _batch(i)
        losses.append(float(step(_on_xla(mesh, x), y.to("xla")).cpu()))
        # A collection between calls, as a training loop's allocations soon make one: the checkpointed layers'
        # outputs were cyclic garbage that the traced program kept as state, so every later call traced again.
        gc.collect()
    torch.testing.assert_close(losses, _eager_losses(ref, forward, 6), atol=2e-5, rtol=2e-5)
    # AdamW makes its state on the first call; the next two traces agree, then the program replays.
    traced = (debug.counter_value("CompiledTrace") or 0) - traces
    replayed = (debug.counter_value("CompiledReplay") or 0) - replays
    assert traced <= 3 and replayed >= 3, (traced, replayed)
    _check_params(model, ref)


@pytest.mark.parametrize("activation_checkpoint", [True, False])
def test_compiled_training_equals_eager(mesh, activation_checkpoint):
    build, forward = FAMILIES["spmdtorch"]
    torch.manual_seed(1)
    ref = build()
    model = parallelize_llama(copy.deepcopy(ref), mesh, activation_checkpoint=activation_checkpoint)
    _compiled_training_replays(mesh, model, ref, forward)


def _torch_checkpointed(model: nn.Module, use_reentrant: bool) -> nn.Module:
    """Each decoder layer under torch.utils.checkpoint, as torchtitan's checkpoint_wrapper runs it."""
    for layer in model.layers:
        layer.forward = functools.partial(
            torch.utils.checkpoint.checkpoint, layer.forward, use_reentrant=use_reentrant, preserve_rng_state=False
        )
    return model


@pytest.mark.parametrize(
    "use_reentrant",
    [
        pytest.param(True, marks=pytest.mark.slow),  # ~20 s
        False,  # torchtitan's default (~7 s)
    ],
)
def test_compiled_training_with_torch_checkpoint_replays(mesh, use_reentrant):
    build, forward = FAMILIES["spmdtorch"]
    torch.manual_seed(1)
    ref = build()
    model = _torch_checkpointed(parallelize_llama(copy.deepcopy(ref), mesh, activation_checkpoint=False), use_reentrant)
    _compiled_training_replays(mesh, model, ref, forward)


_COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%\S+ = (.+?) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\((.*)$",
    re.M,
)


def _group_size(attrs: str) -> int:
    """Devices per replica group (or source-target pairs of a permute), whatever notation XLA printed."""
    if m := re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", attrs):
        return m.group(1).count("{")
    if m := re.search(r"replica_groups=mesh\[(.*?)\](?:, device_ids=\(.*?\))? \{(.*?)\}", attrs):
        sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
        return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
    if m := re.search(r"replica_groups=\[([\d,]+)\]<=", attrs):
        return int(m.group(1).split(",")[-1])
    if m := re.search(r"replica_groups=\{\{([\d,]*)\}", attrs):
        return len(m.group(1).split(","))
    raise AssertionError(f"no replica groups in {attrs[:200]}")


def _collectives(hlo: str) -> list[tuple[str, str, int]]:
    """(kind, array shape without layout, group size) of every array every collective of an HLO module moves.

    Arrays, not instructions: XLA's combiners merge independent collectives into tuple-shaped ones differently
    from one program to another; layouts ({1,0} / {0,1}) are XLA's choice too.
    """
    out = []
    for shape, kind, attrs in _COLLECTIVE.findall(hlo):
        size = _group_size(attrs)
        for array in re.findall(r"\w+\[[\d,]*\]", shape):
            out.append((kind, array, size))
    return sorted(out)


def _step_hlo(model: nn.Module, forward, mesh, *, parallel_loss: bool) -> str:
    """The optimized HLO of one training step (forward, backward, AdamW) on a dp-split batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batch(0)
    logits = forward(model, _on_xla(mesh, x))
    if parallel_loss:
        with loss_parallel():
            loss = _ce(logits, y.to("xla"))
            loss.backward()
    else:
        loss = _ce(logits, y.to("xla"))
        loss.backward()
    opt.step()
    outs = [loss.to_local() if isinstance(loss, DTensor) else loss]
    for p in model.parameters():
        outs.append(p.to_local() if isinstance(p, DTensor) else p)
        outs.extend(v.to_local() if isinstance(v, DTensor) else v for v in opt.state[p].values() if v.dim())
    hlo = debug.get_hlo_text([o.detach() for o in outs], optimized=True)
    spmdtorch.sync()
    return hlo


def _marked(ref: nn.Module, mesh, family: str) -> nn.Module:
    """The mark_sharding program's model: the same layouts, the same checkpointed layers."""
    model = copy.deepcopy(ref).to("xla")
    for name, p in model.named_parameters():
        mark_sharding(p, spmd_mesh(mesh), _spec_for(name))
    for layer in model.get_submodule("layers" if family == "spmdtorch" else "model.layers"):
        checkpoint_module(layer)
    return model


def _summary(found: list[tuple[str, str, str]]) -> dict[str, int]:
    return dict(collections.Counter(kind for kind, _, _ in found))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_step_has_the_collectives_of_the_mark_sharding_program(mesh, family):
    # The first step, as the other steps: fully_shard lays the tensor-parallel parameters' data out in the
    # composed layout at once; a pending copy reshards them in the first step program instead (for spmdtorch's
    # Llama, 12 more collective-permutes of the wq/wk/wv/w1/w3/embedding/head shards, from tp-only to (dp, tp)).
    build, forward = FAMILIES[family]
    torch.manual_seed(2)
    ref = build()
    titan = _collectives(_step_hlo(parallelize_llama(copy.deepcopy(ref), mesh), forward, mesh, parallel_loss=True))
    marked = _collectives(_step_hlo(_marked(ref, mesh, family), forward, mesh, parallel_loss=False))
    assert titan, "the FSDP + TP step has no collective"
    assert _summary(titan) == _summary(marked)
    assert titan == marked


def test_named_errors(mesh):
    with pytest.raises(UnknownModelFamilyError, match=r"tok_embeddings.*embed_tokens"):
        parallelize_llama(nn.Sequential(nn.Linear(4, 4)), mesh)
    with pytest.raises(DTensorError, match="2-D with dims named dp_dim='dp' and tp_dim='tp'"):
        parallelize_llama(_spmdtorch_llama(), mesh["tp"])
    tied = _spmdtorch_llama()
    tied.output.weight = tied.tok_embeddings.weight
    with pytest.raises(DTensorError, match="tied embeddings"):
        parallelize_llama(tied, mesh)
