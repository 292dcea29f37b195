"""Relative checkpoint paths work (Orbax itself only takes absolute ones)."""

from __future__ import annotations

import torch

from spmdtorch import checkpoint


def test_relative_paths_for_save_load_and_the_manager(devices8, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = torch.arange(6.0, device="xla")
    checkpoint.save("ckpt", {"w": w, "step": 3})
    assert (tmp_path / "ckpt").is_dir()
    _ = w.zero_()
    assert checkpoint.load("ckpt", {"w": w, "step": 0})["step"] == 3
    torch.testing.assert_close(w.cpu(), torch.arange(6.0))

    with checkpoint.CheckpointManager("runs/a", save_interval_steps=1) as mgr:
        assert mgr.save(1, {"w": w})
        mgr.wait_until_finished()
        assert mgr.all_steps() == [1]
    assert (tmp_path / "runs" / "a" / "1").is_dir()
