"""Hugging Face model directories: load_pretrained / save_pretrained against transformers on the CPU.

Every model is a tiny random config saved locally with transformers'
``save_pretrained`` (nothing is downloaded). A model built on ``meta`` is
loaded sharded over 8 simulated devices and compared with the eager CPU model
(values, logits); saving it back must give the files ``save_pretrained``
writes and reload with ``from_pretrained``.
"""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import spmdtorch
from spmdtorch.checkpoint import (
    DtypeMismatchError,
    MissingKeysError,
    NotACheckpointError,
    ShapeMismatchError,
    UnexpectedKeysError,
    UninitializedTensorsError,
    _hf_load,
    load_pretrained,
    save_pretrained,
)
from spmdtorch.checkpoint._hf_layout import parse_size, read_layout, split_shards
from spmdtorch.mesh import Mesh
from spmdtorch.plan import plan_sharding
from spmdtorch.sharding import ShardingError, get_sharding_spec

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel  # noqa: E402


def _config(tie: bool = True, vocab: int = 128) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tie,
    )


def _saved(tmp_path, config, max_shard_size="20KB", dtype=None, name="src"):
    torch.manual_seed(0)
    ref = LlamaForCausalLM(config)
    if dtype is not None:
        ref = ref.to(dtype)
    out = tmp_path / name
    ref.save_pretrained(out, max_shard_size=max_shard_size)
    return ref, out


def _meta(config, cls=LlamaForCausalLM, dtype=None):
    with torch.device("meta"):
        model = cls(config)
    return model.to(dtype) if dtype is not None else model


def _fsdp_mesh() -> Mesh:
    return Mesh(np.arange(8), (8,), ("fsdp",))


def _assert_same_state(ref: torch.nn.Module, model: torch.nn.Module) -> None:
    ref_state, state = ref.state_dict(), model.state_dict()
    assert list(ref_state) == list(state)
    for name, value in ref_state.items():
        got = state[name].cpu()
        assert got.dtype == value.dtype, name
        assert torch.equal(got, value), name


@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("max_shard_size", ["20KB", "5GB"], ids=["indexed", "single-file"])
def test_load_matches_eager_and_saves_back(tmp_path, tie, max_shard_size):
    config = _config(tie)
    ref, src = _saved(tmp_path, config, max_shard_size)
    assert os.path.isfile(src / "model.safetensors.index.json") == (max_shard_size == "20KB")
    model = _meta(config)
    report = load_pretrained(src, model, _fsdp_mesh(), "fsdp")
    assert report.missing_keys == () and report.unexpected_keys == ()
    # The rotary tables are non-persistent buffers: built by transformers' own _init_weights.
    assert set(report.initialized) == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tie
    assert get_sharding_spec(model.model.layers[0].mlp.up_proj.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    _assert_same_state(ref, model)
    for (name, buf), (_, got) in zip(ref.named_buffers(), model.named_buffers()):
        torch.testing.assert_close(got.cpu(), buf, msg=name)
    ids = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids.to("xla")).logits.cpu(), ref(ids).logits, atol=1e-5, rtol=1e-5)

    # Save back: the same files and index as transformers' save_pretrained.
    out = tmp_path / "out"
    layout = save_pretrained(model, out, max_shard_size=max_shard_size)
    ours = sorted(f for f in os.listdir(out) if "safetensors" in f)
    assert ours == sorted(f for f in os.listdir(src) if "safetensors" in f)
    if layout.indexed:
        assert json.loads((out / "model.safetensors.index.json").read_text()) == json.loads(
            (src / "model.safetensors.index.json").read_text()
        )
    for file in ours:
        if file.endswith(".safetensors"):
            mine, theirs = load_file(out / file), load_file(src / file)
            assert list(mine) == list(theirs)
            assert all(torch.equal(mine[k], theirs[k]) for k in mine), file
    _assert_same_state(ref, LlamaForCausalLM.from_pretrained(out))


def test_blocks_read_per_device_never_whole(tmp_path, monkeypatch):
    """Each device's block is read alone: no host buffer or device holds a whole sharded parameter."""
    config = _config(tie=False)
    ref, src = _saved(tmp_path, config)
    reads: dict[str, list[tuple[int, ...]]] = {}
    real = _hf_load._BlockReader._read

    def spy(self, bounds):
        block = real(self, bounds)
        reads.setdefault(self._key, []).append(block.shape)
        return block

    monkeypatch.setattr(_hf_load._BlockReader, "_read", spy)
    model = _meta(config)
    load_pretrained(src, model, _fsdp_mesh(), "fsdp")
    for name, p in ref.named_parameters():  # FSDPv2's rule: every parameter split 8 ways on its largest dim
        shape = tuple(p.shape)
        dim = shape.index(max(shape))
        want = shape[:dim] + (shape[dim] // 8,) + shape[dim + 1 :]
        assert reads[name] == [want] * 8, name
    rotary = model.model.rotary_emb.inv_freq  # a buffer: replicated, never read from the file
    assert rotary._st.value.is_fully_replicated and "model.rotary_emb.inv_freq" not in reads
    for name, p in model.named_parameters():
        assert all(s.data.size * 8 == p.numel() for s in p._st.value.addressable_shards), name


def test_plan_rules_and_uneven_vocabulary(tmp_path):
    """fsdp+tp rules from plan_sharding, a vocabulary (102) that the tp axis (4) does not divide: padded storage."""
    config = _config(tie=False, vocab=102)
    ref, src = _saved(tmp_path, config)
    mesh = Mesh(np.arange(8), (2, 4), ("fsdp", "tp"))
    model = _meta(config)
    plan = plan_sharding(model, mesh, "fsdp+tp")
    load_pretrained(src, model, mesh, plan.rules)
    emb = model.model.embed_tokens.weight
    assert emb._st.logical_shape == (102, 32) and emb._st.annotated
    _assert_same_state(ref, model)
    ids = torch.randint(0, 102, (2, 8), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(model(ids.to("xla")).logits.cpu(), ref(ids).logits, atol=1e-5, rtol=1e-5)
    out = tmp_path / "out"
    save_pretrained(model, out, max_shard_size="20KB")
    _assert_same_state(ref, LlamaForCausalLM.from_pretrained(out))


def test_bfloat16_checkpoint_cast(tmp_path):
    config = _config()
    ref, src = _saved(tmp_path, config, dtype=torch.bfloat16)
    model = _meta(config)  # float32
    load_pretrained(src, model, _fsdp_mesh(), "fsdp")
    _assert_same_state(copy.deepcopy(ref).float(), model)  # bfloat16 values, widened exactly
    with pytest.raises(DtypeMismatchError, match=r"model.embed_tokens.weight.*cast=True"):
        load_pretrained(src, _meta(config), _fsdp_mesh(), "fsdp", cast=False)
    bf16 = _meta(config, dtype=torch.bfloat16)
    load_pretrained(src, bf16, _fsdp_mesh(), "fsdp", cast=False)
    _assert_same_state(ref, bf16)
    # Save a float32 model in bfloat16: what transformers would load in bfloat16.
    out = tmp_path / "out"
    save_pretrained(model, out, max_shard_size="20KB", dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for f in out.glob("*.safetensors") for t in load_file(f).values())
    _assert_same_state(ref, LlamaForCausalLM.from_pretrained(out, dtype=torch.bfloat16))


def test_missing_and_unexpected_keys(tmp_path):
    config = _config(tie=False)
    ref, src = _saved(tmp_path, config, max_shard_size="5GB")
    state = load_file(src / "model.safetensors")
    head = state.pop("lm_head.weight")
    state["extra.weight"] = torch.zeros(3)
    os.remove(src / "model.safetensors")
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})

    model = _meta(config)
    with pytest.raises(MissingKeysError, match=r"lm_head.weight.*strict=False") as e:
        load_pretrained(src, model, _fsdp_mesh(), "fsdp")
    assert e.value.keys == ("lm_head.weight",)
    assert model.lm_head.weight.is_meta  # a failed load leaves the model as it was
    drop_extra = {"rename": lambda k: None if k == "extra.weight" else k}
    with pytest.raises(UnexpectedKeysError, match=r"extra.weight.*rename=fn"):  # tied: lm_head is not missing
        load_pretrained(src, _meta(_config(tie=True)), _fsdp_mesh(), "fsdp")
    load_pretrained(src, _meta(_config(tie=True)), _fsdp_mesh(), "fsdp", **drop_extra)

    torch.manual_seed(0)
    report = load_pretrained(src, model, _fsdp_mesh(), "fsdp", strict=False)
    assert report.missing_keys == ("lm_head.weight",) and report.unexpected_keys == ("extra.weight",)
    assert "lm_head.weight" in report.initialized
    head_now = model.lm_head.weight.cpu()
    assert not torch.equal(head_now, head) and head_now.std() > 0  # initialised by _init_weights, not zeros
    assert get_sharding_spec(model.lm_head.weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    state.pop("extra.weight")
    assert all(torch.equal(model.state_dict()[k].cpu(), v) for k, v in state.items())

    # A custom init_fn that forgets a tensor: named error, not silent zeros.
    with pytest.raises(UninitializedTensorsError, match=r"lm_head.weight"):
        load_pretrained(src, _meta(config), _fsdp_mesh(), "fsdp", strict=False, init_fn=lambda m: None, **drop_extra)


def test_rename_into_base_model_and_back(tmp_path):
    config = _config(tie=True)
    ref, src = _saved(tmp_path, config)
    base = _meta(config, LlamaModel)
    load_pretrained(
        src, base, _fsdp_mesh(), "fsdp", rename=lambda k: k.removeprefix("model.") if k.startswith("model.") else None
    )
    _assert_same_state(ref.model, base)
    out = tmp_path / "out"
    save_pretrained(base, out, max_shard_size="20KB", rename=lambda k: "model." + k, save_config=False)
    back = _meta(config)
    load_pretrained(out, back, _fsdp_mesh(), "fsdp")  # lm_head is tied to the embedding
    _assert_same_state(ref, back)


def test_into_xla_model_in_place_and_cpu_buffers(tmp_path):
    """Tensors already on xla keep their storage and sharding; a CPU model's tensors move to xla."""
    config = _config()
    ref, src = _saved(tmp_path, config)
    torch.manual_seed(5)
    model = LlamaForCausalLM(config).to("xla")
    spmdtorch.sharding.mark_sharding(model, _fsdp_mesh(), {"model.layers.*.mlp.*.weight": ("fsdp", None)})
    weight = model.model.layers[0].mlp.up_proj.weight
    storage = weight._st
    report = load_pretrained(src, model)
    assert report.initialized == ()
    assert model.model.layers[0].mlp.up_proj.weight is weight and weight._st is storage
    assert get_sharding_spec(weight) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    _assert_same_state(ref, model)

    cpu_model = LlamaForCausalLM(config)  # rotary buffers hold real data: moved, not initialised
    report = load_pretrained(src, cpu_model, _fsdp_mesh(), "fsdp")
    assert report.initialized == () and cpu_model.model.rotary_emb.inv_freq.device.type == "xla"
    _assert_same_state(ref, cpu_model)


def test_errors_name_the_problem(tmp_path):
    config = _config()
    ref, src = _saved(tmp_path, config)
    with pytest.raises(NotACheckpointError, match=r"neither model.safetensors.index.json"):
        load_pretrained(tmp_path, _meta(config))
    with pytest.raises(ShapeMismatchError, match=r"model.embed_tokens.weight.*shape \(128, 32\).*\(64, 32\)"):
        load_pretrained(src, _meta(_config(vocab=64)), _fsdp_mesh(), "fsdp")
    with pytest.raises(ShardingError, match=r"matches no parameter"):
        load_pretrained(src, _meta(config), _fsdp_mesh(), {"nope.*": ("fsdp",)})
    with pytest.raises(ShardingError, match=r"axis 'fsdp'"):
        load_pretrained(src, _meta(config), Mesh(np.arange(8), (8,), ("tp",)), "fsdp")

    class Rope(torch.nn.Module):  # a buffer computed in __init__: lost on meta, no reset_parameters
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.register_buffer("table", torch.arange(4.0), persistent=False)

    d = tmp_path / "rope"
    d.mkdir()
    save_file(Rope().state_dict(), d / "model.safetensors")
    with torch.device("meta"):
        rope = Rope()
    with pytest.raises(UninitializedTensorsError, match=r"\['table'\].*init_fn"):
        load_pretrained(d, rope)
    assert rope.table.is_meta and rope.lin.weight.is_meta  # a failed load leaves the model as it was
    load_pretrained(d, rope, init_fn=lambda m: m.table.copy_(torch.arange(4.0)) if isinstance(m, Rope) else None)
    assert torch.equal(rope.table.cpu(), torch.arange(4.0))

    os.remove(src / "model-00002-of-00006.safetensors")
    with pytest.raises(NotACheckpointError, match=r"model-00002-of-00006.safetensors"):
        read_layout(src)


@pytest.mark.parametrize(
    "size,expected", [("5MB", 5_000_000), ("20KB", 20_000), ("1.5GB", 1_500_000_000), (7, 7), (" 2 kb ", 2000)]
)
def test_parse_size(size, expected):
    assert parse_size(size) == expected


@pytest.mark.parametrize("bad", ["5", "5MiB", "-1KB", 0, True])
def test_parse_size_rejects(bad):
    with pytest.raises((ValueError, TypeError)):
        parse_size(bad)


def test_split_matches_huggingface_hub():
    from huggingface_hub import split_torch_state_dict_into_shards

    rng = np.random.default_rng(0)
    for _ in range(20):
        sizes = [int(s) for s in rng.integers(1, 40, size=rng.integers(1, 30))]
        state = {f"t{i}": torch.empty(s, dtype=torch.uint8) for i, s in enumerate(sizes)}
        split = split_torch_state_dict_into_shards(state, max_shard_size=50)
        ours = split_shards(list(zip(state, sizes)), 50)
        assert ours == list(split.filename_to_tensors.values())
