"""transformers' ``save_pretrained`` and accelerate's ``save_model`` on xla models, in this process, under compat.

transformers and Hugging Face's shard splitter take xla tensors' identity from
``torch_xla._XLAC._xla_get_tensor_id``; accelerate and safetensors take it from
``untyped_storage().data_ptr()``. Either way distinct parameters must stay
distinct (equal-size ones used to be taken for aliases and dropped) and tied
ones must load back tied.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
accelerate_utils = pytest.importorskip("accelerate.utils")


def _tiny_llama(tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=16,  # gate/up/down and the attention projections all 16 x 16: equal sizes
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=16,
        tie_word_embeddings=tie,
    )
    return LlamaForCausalLM(cfg)


def _cpu_state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("tie", [False, True])
def test_save_pretrained_of_an_xla_model_round_trips(tmp_path, tie):
    from transformers import LlamaForCausalLM

    model = _tiny_llama(tie).to("xla")
    with torch.no_grad():  # pending updates: save_pretrained must compute and write them
        for p in model.parameters():
            p.mul_(1.5)
    expected = _cpu_state(model)
    model.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path)
    got = _cpu_state(loaded)
    assert sorted(got) == sorted(expected)
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=0)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tie


def test_accelerate_clean_state_dict_keeps_equal_size_parameters():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to("xla")
    sd = model.state_dict()
    ids = {k: accelerate_utils.id_tensor_storage(v) for k, v in sd.items()}
    assert len(set(ids.values())) == len(sd)  # used to be one id per shape: (xla, 0, nbytes)
    # a tied pair shares one
    tied = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)}).to("xla")
    tied["b"].weight = tied["a"].weight
    tsd = tied.state_dict()
    assert accelerate_utils.id_tensor_storage(tsd["a.weight"]) == accelerate_utils.id_tensor_storage(tsd["b.weight"])
    assert accelerate_utils.id_tensor_storage(tsd["a.bias"]) != accelerate_utils.id_tensor_storage(tsd["b.bias"])


def test_hub_shard_splitter_keeps_every_xla_tensor(tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards

    model = _tiny_llama(False).to("xla")
    sd = model.state_dict()
    split = split_torch_state_dict_into_shards(sd, max_shard_size=4096)
    saved = sorted(k for names in split.filename_to_tensors.values() for k in names)
    assert saved == sorted(sd)
