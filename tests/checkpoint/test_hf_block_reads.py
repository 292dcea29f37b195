"""Positioned block reads of safetensors files (load_pretrained's reader, spmdtorch.checkpoint._st_blocks).

Every block is compared with the same slice of what safetensors' own
``load_file`` returns: row and column blocks, blocks whose runs are read one
by one, blocks whose close runs are read together through the scratch
buffer (and split where that buffer is full), every dtype, scalars and empty
tensors. A file truncated after its header was checked is an error naming
the file and the tensor, never a crash or garbage.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from spmdtorch.checkpoint import CheckpointCorruptionError, _hf_load, load_pretrained
from spmdtorch.checkpoint._st_blocks import ShardFile, ShardReadError, block_runs
from spmdtorch.mesh import Mesh


def _random_bounds(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for n in shape:
        a = int(rng.integers(0, n + 1))
        b = int(rng.integers(a, n + 1))
        out.append((a, b) if rng.random() < 0.7 else (0, n))
    return tuple(out)


def test_block_runs_are_exactly_the_blocks_bytes_in_order():
    rng = np.random.default_rng(0)
    for _ in range(300):
        shape = tuple(int(n) for n in rng.integers(1, 7, size=int(rng.integers(1, 5))))
        bounds = _random_bounds(rng, shape)
        whole = np.arange(int(np.prod(shape))).reshape(shape)
        want = whole[tuple(slice(a, b) for a, b in bounds)].reshape(-1)
        if want.size == 0:
            continue
        offsets, length = block_runs(shape, bounds, 1)
        got = np.concatenate([whole.reshape(-1)[o : o + length] for o in offsets.tolist()])
        np.testing.assert_array_equal(got, want, err_msg=f"shape {shape} bounds {bounds}")
        assert np.all(np.diff(offsets) >= length), (shape, bounds)


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(64, 256, generator=g),  # columns [8, 40): 128-byte runs 896 bytes apart, read together
        "wide": torch.randn(16, 4096, generator=g),  # 4 KiB runs 12 KiB apart: one read each
        "tall": torch.randn(2048, 256, generator=g),  # 2048 close runs: more than one scratch-full
        "bf16": torch.randn(8, 6, 5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(7, 9, generator=g).to(torch.float16),
        "f64": torch.randn(5, 3, generator=g, dtype=torch.float64),
        "i64": torch.randint(-(2**40), 2**40, (6, 4), generator=g),
        "i32": torch.randint(-1000, 1000, (3, 3, 3), generator=g, dtype=torch.int32),
        "i8": torch.randint(-100, 100, (10,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (4, 4), generator=g, dtype=torch.uint8),
        "bool": torch.rand(5, 7, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    path = tmp_path_factory.mktemp("blocks") / "model.safetensors"
    save_file(_tensors(), path)
    return path


def test_read_block_matches_safetensors_for_every_dtype_and_block(shard):
    ref = load_file(shard)
    rng = np.random.default_rng(1)
    fixed = {
        "f32": [((0, 64), (8, 40)), ((3, 60), (0, 256)), ((5, 6), (1, 2))],
        "wide": [((0, 16), (0, 1024)), ((2, 9), (1000, 3100))],
        "tall": [((0, 2048), (0, 32)), ((100, 2000), (200, 256))],
    }
    with ShardFile(str(shard)) as f:
        for key, want in ref.items():
            entry = f.entry(key)
            assert (entry.dtype, entry.shape) == (want.dtype, tuple(want.shape)), key
            blocks = fixed.get(key, []) + [_random_bounds(rng, tuple(want.shape)) for _ in range(20)]
            for bounds in blocks:
                got = f.read_block(entry, tuple(bounds))
                expected = want[tuple(slice(a, b) for a, b in bounds)]
                assert got.dtype == expected.dtype and torch.equal(got, expected), (key, bounds)


def test_a_file_truncated_after_opening_is_a_named_read_error(shard, tmp_path):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(shard.read_bytes())
    with ShardFile(str(path)) as f:
        entry = f.entry("tall")
        os.truncate(path, entry.start + 1000)
        with pytest.raises(ShardReadError, match="truncated while being read"):
            f.read_block(entry, ((0, 2048), (0, 256)))


def test_a_header_that_does_not_fit_the_file_is_refused(shard, tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(shard.read_bytes()[:-100])
    with ShardFile(str(path)) as f, pytest.raises(ShardReadError, match="does not fit"):
        for key in load_file(shard):
            f.entry(key)


def test_load_pretrained_names_a_shard_truncated_after_its_header_was_checked(tmp_path, monkeypatch):
    torch.manual_seed(0)
    src = torch.nn.Linear(64, 32)
    save_file({"weight": src.weight.detach(), "bias": src.bias.detach()}, tmp_path / "model.safetensors")
    real = _hf_load._read_sources

    def then_truncate(layout, rename):
        sources = real(layout, rename)
        os.truncate(tmp_path / "model.safetensors", os.path.getsize(tmp_path / "model.safetensors") - 64)
        return sources

    monkeypatch.setattr(_hf_load, "_read_sources", then_truncate)
    with torch.device("meta"):
        model = torch.nn.Linear(64, 32)
    with pytest.raises(
        CheckpointCorruptionError, match=r"model\.safetensors \(tensor '(weight|bias)'\) cannot be read"
    ):
        load_pretrained(tmp_path, model, Mesh(np.arange(8), (8,), ("fsdp",)), "fsdp")
    assert model.weight.is_meta and model.bias.is_meta  # unchanged: the call can be retried


def test_column_split_load_matches_the_checkpoint(tmp_path):
    """Each device's block of a column split is many strided runs; values equal the checkpoint's."""
    torch.manual_seed(0)
    src = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.Linear(200, 3000, bias=False))
    state = {k: v.detach().contiguous() for k, v in src.state_dict().items()}
    save_file(state, tmp_path / "model.safetensors")
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(96, 200), torch.nn.Linear(200, 3000, bias=False))
    mesh = Mesh(np.arange(8), (2, 4), ("fsdp", "tp"))
    load_pretrained(tmp_path, model, mesh, {"0.weight": ("tp", "fsdp"), "0.bias": ("tp",), "1.weight": (None, "tp")})
    for name, want in state.items():
        assert torch.equal(model.state_dict()[name].cpu(), want), name
