"""load_pretrained / save_pretrained in a 2-process job (2 x 4 simulated CPU devices).

Each process builds only its own devices' blocks (``make_array_from_callback``
calls back for addressable devices only) and the save gathers across
processes; process 0 writes the files, which must equal what transformers
wrote.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from spmdtorch.launch import launch

transformers = pytest.importorskip("transformers")

HERE = Path(__file__).resolve().parent
LAUNCH_TIMEOUT_S = 150


@pytest.mark.timeout(LAUNCH_TIMEOUT_S + 60)
@pytest.mark.slow
def test_two_processes_load_their_blocks_and_save_back(devices8, tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    src, out = tmp_path / "src", tmp_path / "out"
    transformers.LlamaForCausalLM(config).save_pretrained(src, max_shard_size="20KB")

    log = io.StringIO()
    result = launch(
        [str(HERE / "hf_two_process_job.py"), str(src), str(out), "20KB"],
        nprocs=2,
        devices_per_proc=4,
        out=log,
        timeout_s=LAUNCH_TIMEOUT_S,
        grace_period_s=5.0,
    )
    text = log.getvalue()
    tail = "\n".join([line for line in text.splitlines() if "[Gloo]" not in line][-40:])
    assert result.returncode == 0, tail
    reports = {}
    for line in text.splitlines():
        if line.startswith("[rank ") and "] RESULT " in line:
            reports[int(line[len("[rank ") : line.index("]")])] = json.loads(line.split("] RESULT ", 1)[1])
    assert sorted(reports) == [0, 1], tail
    for rank, rep in reports.items():
        assert (rep["process_index"], rep["process_count"]) == (rank, 2)
        assert rep["blocks_equal"], tail
        assert rep["local_blocks"] == 4 * rep["n_params"]  # 4 local devices, one block each
        assert rep["logits_diff"] < 1e-5, rep
    files = sorted(p.name for p in src.glob("*.safetensors"))
    assert files == sorted(p.name for p in out.glob("*.safetensors"))
    assert json.loads((out / "model.safetensors.index.json").read_text()) == json.loads(
        (src / "model.safetensors.index.json").read_text()
    )
    for name in files:
        mine, theirs = load_file(out / name), load_file(src / name)
        assert list(mine) == list(theirs) and all(torch.equal(mine[k], theirs[k]) for k in mine), name
