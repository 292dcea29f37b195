"""save/load: resharding on restore, exact plain values, bad input, damaged files, plain-Orbax interop."""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import orbax.checkpoint as ocp
import pytest
import torch

import spmdtorch
from spmdtorch import checkpoint
from spmdtorch.checkpoint import (
    CheckpointCorruptionError,
    CheckpointExistsError,
    DtypeMismatchError,
    MissingKeysError,
    NotACheckpointError,
    ShapeMismatchError,
    UnexpectedKeysError,
    ValueKindMismatchError,
)
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding

SHAPES = {"even": (16, 8), "uneven": (10, 6)}


def _layouts(on_devices):
    """name -> function(cpu tensor) -> tensor in that layout (8, 4 and 1 devices, CPU)."""
    mesh8 = Mesh(np.arange(8), (4, 2), ("a", "b"))

    def marked(spec):
        def make(cpu):
            return mark_sharding(cpu.clone().to("xla"), mesh8, spec[: cpu.dim()] + (None,) * (cpu.dim() - len(spec)))

        return make

    return {
        "8dev_a_b": marked(("a", "b")),
        "8dev_b_a": marked(("b", "a")),
        "replicated": lambda cpu: cpu.clone().to("xla"),
        "4dev_dim1": lambda cpu: on_devices(cpu, 4, (None, "x")),
        "1dev": lambda cpu: on_devices(cpu, 1, ("x",)),
        "cpu": lambda cpu: cpu.clone(),
    }


def _storage(t):
    return None if not isinstance(t, spmdtorch.XlaTensor) else (t._st.value.sharding, tuple(t._st.value.shape))


def test_every_resharding_pair_restores_the_saved_values(tmp_path, on_devices):
    layouts = _layouts(on_devices)
    gen = torch.Generator().manual_seed(0)
    values = {f"{src}/{name}": torch.randn(shape, generator=gen) for src in layouts for name, shape in SHAPES.items()}
    state = {src: {name: layouts[src](values[f"{src}/{name}"]) for name in SHAPES} for src in layouts}
    checkpoint.save(tmp_path / "ckpt", state)
    # Every saved layout (the keys) into every target layout (one load each).
    for dst, make in layouts.items():
        target = {src: {name: make(torch.zeros(shape)) for name, shape in SHAPES.items()} for src in layouts}
        before = {(s, n): _storage(t) for s, d in target.items() for n, t in d.items()}
        out = checkpoint.load(tmp_path / "ckpt", target)
        assert out is target
        for src in layouts:
            for name in SHAPES:
                t = target[src][name]
                assert torch.equal(t.cpu(), values[f"{src}/{name}"]), (src, dst, name)
                assert _storage(t) == before[(src, name)], (src, dst, name)  # its own sharding, padding kept


def test_training_state_round_trips_exactly(tmp_path):
    model = torch.nn.Linear(6, 10).to("xla")
    mark_sharding(model.weight, Mesh(np.arange(8), (8,), ("x",)), ("x", None))  # uneven: 10 over 8
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.95))
    model(torch.randn(4, 6, device="xla")).pow(2).sum().backward()
    opt.step()
    rng = torch.get_rng_state()
    state = {
        "model": model.state_dict(),
        "optim": opt.state_dict(),
        "step": 2**40 + 3,
        "rng": rng,
        "ids": torch.tensor([2**40, -7]),
        "idx": torch.tensor([3, -(2**31)], device="xla"),
        "half": torch.randn(3).bfloat16(),
        "x64": torch.tensor([0.1], dtype=torch.float64),
        "misc": {"nan": math.nan, "none": None, "name": "run-1", "flags": (True, False)},
    }
    checkpoint.save(tmp_path / "c", state)
    expected = {k: v.cpu().clone() if isinstance(v, torch.Tensor) else v for k, v in state["model"].items()}
    exp_opt = {k: v.cpu().clone() for k, v in opt.state[model.weight].items()}

    model2 = torch.nn.Linear(6, 10).to("xla")
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.5)
    checkpoint.init_optimizer_state(opt2)
    target = {
        "model": model2.state_dict(),
        "optim": opt2.state_dict(),
        "step": 0,
        "rng": torch.zeros_like(rng),
        "ids": torch.zeros(2, dtype=torch.int64),
        "idx": torch.zeros(2, dtype=torch.int64, device="xla"),
        "half": torch.zeros(3, dtype=torch.bfloat16),
        "x64": torch.zeros(1, dtype=torch.float64),
        "misc": {"nan": 0.0, "none": 1, "name": "", "flags": (False, False)},
    }
    out = checkpoint.load(tmp_path / "c", target)
    opt2.load_state_dict(out["optim"])
    for k, v in expected.items():
        assert torch.equal(model2.state_dict()[k].cpu(), v), k
    for k, v in exp_opt.items():
        assert torch.equal(opt2.state[model2.weight][k].cpu(), v), k
    assert opt2.param_groups[0]["lr"] == 1e-3 and opt2.param_groups[0]["betas"] == (0.8, 0.95)
    assert out["step"] == 2**40 + 3 and torch.equal(out["rng"], rng)
    assert torch.equal(out["ids"], state["ids"]) and out["idx"].tolist() == [3, -(2**31)]
    assert torch.equal(out["half"], state["half"]) and out["x64"].dtype == torch.float64
    assert out["x64"].item() == 0.1
    assert math.isnan(out["misc"]["nan"]) and out["misc"]["none"] is None and out["misc"]["name"] == "run-1"
    assert out["misc"]["flags"] == (True, False)


def test_64_bit_cpu_tensor_loads_into_an_xla_tensor_through_the_host(tmp_path):
    # 8-byte data cannot live on the device (x64 off): it is read on the host and narrowed.
    checkpoint.save(tmp_path / "c", {"ids": torch.tensor([7, -3]), "x": torch.tensor([0.5], dtype=torch.float64)})
    target = {
        "ids": torch.zeros(2, dtype=torch.int64, device="xla"),
        "x": torch.zeros(1, dtype=torch.float64, device="xla"),
    }
    checkpoint.load(tmp_path / "c", target)
    assert target["ids"].cpu().tolist() == [7, -3] and target["x"].cpu().tolist() == [0.5]


def _saved(tmp_path, **extra):
    state = {"model": {"w": torch.arange(12.0).reshape(3, 4).to("xla"), "b": torch.ones(4)}, "step": 5}
    state.update(extra)
    checkpoint.save(tmp_path / "c", state)
    return tmp_path / "c"


def _target(**over):
    t = {"model": {"w": torch.zeros(3, 4, device="xla"), "b": torch.zeros(4)}, "step": 0}
    t.update(over)
    return t


def test_bad_input_names_the_key_and_both_values(tmp_path):
    path = _saved(tmp_path)
    with pytest.raises(ShapeMismatchError, match=r"state\['model'\]\['w'\].*\(3, 4\).*\(4, 3\)"):
        checkpoint.load(path, _target(model={"w": torch.zeros(4, 3, device="xla"), "b": torch.zeros(4)}))
    with pytest.raises(DtypeMismatchError, match=r"state\['model'\]\['w'\].*float32.*bfloat16.*cast=True"):
        checkpoint.load(
            path, _target(model={"w": torch.zeros(3, 4, dtype=torch.bfloat16, device="xla"), "b": torch.zeros(4)})
        )
    with pytest.raises(MissingKeysError, match=r"\['model'\]\['extra'\]") as e:
        checkpoint.load(
            path, _target(model={"w": torch.zeros(3, 4, device="xla"), "b": torch.zeros(4), "extra": torch.zeros(1)})
        )
    assert e.value.keys == ("['model']['extra']",)
    with pytest.raises(UnexpectedKeysError, match=r"\['model'\]\['b'\].*init_optimizer_state"):
        checkpoint.load(path, _target(model={"w": torch.zeros(3, 4, device="xla")}))
    with pytest.raises(ValueKindMismatchError, match=r"state\['step'\].*value 5.*a tensor"):
        checkpoint.load(path, _target(step=torch.zeros(())))
    with pytest.raises(CheckpointExistsError, match="overwrite=True"):
        checkpoint.save(path, _target())


def test_failed_load_changes_nothing_and_options_relax_it(tmp_path):
    path = _saved(tmp_path)
    w = torch.full((3, 4), 7.0, device="xla")
    target = _target(model={"w": w, "b": torch.zeros(4), "extra": torch.zeros(1)})
    with pytest.raises(MissingKeysError):
        checkpoint.load(path, target)
    assert torch.equal(w.cpu(), torch.full((3, 4), 7.0)) and target["step"] == 0
    out = checkpoint.load(path, target, strict=False)  # 'extra' stays as it was
    assert torch.equal(w.cpu(), torch.arange(12.0).reshape(3, 4)) and out["step"] == 5
    wb = torch.zeros(3, 4, dtype=torch.bfloat16, device="xla")
    checkpoint.load(path, _target(model={"w": wb, "b": torch.zeros(4, dtype=torch.float64)}), cast=True)
    assert wb.dtype == torch.bfloat16 and torch.equal(wb.cpu().float(), torch.arange(12.0).reshape(3, 4))


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(NotACheckpointError, match="does not exist"):
        checkpoint.load(tmp_path / "nope", {})
    (tmp_path / "empty").mkdir()
    with pytest.raises(NotACheckpointError, match="meta/metadata"):
        checkpoint.load(tmp_path / "empty", {})
    with checkpoint.CheckpointManager(tmp_path / "mgr") as mgr:
        mgr.save(3, {"w": torch.ones(2)})
    with pytest.raises(NotACheckpointError, match=r"CheckpointManager directory \(steps \[3\]\)"):
        checkpoint.load(tmp_path / "mgr", {"w": torch.zeros(2)})


def _data_files(path: Path) -> list:
    return [p for p in (path / "arrays").rglob("*") if p.is_file() and p.parent.name == "d"]


def test_flipped_byte_is_detected(tmp_path):
    path = _saved(tmp_path, big=torch.randn(64, 64).to("xla"))
    # The largest file holds the 16 KiB of 'big' (the others are small b-tree nodes).
    biggest = max(_data_files(path), key=lambda p: p.stat().st_size)
    for f in _data_files(path):
        if f.read_bytes() == biggest.read_bytes():  # every copy of it
            data = bytearray(f.read_bytes())
            data[len(data) // 2] ^= 0x10
            f.write_bytes(bytes(data))
    big = torch.zeros(64, 64, device="xla")
    with pytest.raises(CheckpointCorruptionError, match=r"state\['big'\]"):
        checkpoint.load(path, _target(big=big))
    assert torch.equal(big.cpu(), torch.zeros(64, 64))  # untouched


# The test alters the arrays with plain Orbax, which warns that it restores without shardings.
@pytest.mark.filterwarnings("ignore:Sharding info not provided when restoring:UserWarning")
def test_altered_array_fails_its_fingerprint(tmp_path):
    # Orbax alone restores this silently: a well-formed file holding other values.
    path = _saved(tmp_path)
    arrays = path / "arrays"
    restored = ocp.PyTreeCheckpointer().restore(arrays)
    restored["model"]["w"] = np.asarray(restored["model"]["w"]).copy()
    restored["model"]["w"][1, 2] += 1.0
    ocp.PyTreeCheckpointer().save(arrays, restored, force=True)
    with pytest.raises(CheckpointCorruptionError, match=r"fingerprint mismatch.*state\['model'\]\['w'\]") as e:
        checkpoint.load(path, _target())
    assert e.value.keys == ("['model']['w']",)


def test_truncated_and_deleted_files_raise(tmp_path):
    path = _saved(tmp_path, big=torch.randn(64, 64).to("xla"))
    biggest = max(_data_files(path), key=lambda p: p.stat().st_size)
    biggest.write_bytes(biggest.read_bytes()[: biggest.stat().st_size // 3])
    with pytest.raises(CheckpointCorruptionError):
        checkpoint.load(path, _target(big=torch.zeros(64, 64, device="xla")))

    path2 = tmp_path / "c2"
    checkpoint.save(path2, _target())
    (path2 / "meta" / "metadata").unlink()
    with pytest.raises(CheckpointCorruptionError, match="record meta/metadata is missing"):
        checkpoint.load(path2, _target())


@pytest.mark.parametrize(
    "name", ["arrays/_METADATA", "arrays/manifest.ocdbt", "_CHECKPOINT_METADATA", "arrays/_sharding"]
)
def test_deleted_metadata_file_never_gives_wrong_values(tmp_path, name):
    """Either a named error, or (Orbax not needing that file) exactly the saved values."""
    path = _saved(tmp_path)
    (path / name).unlink()
    target = _target()
    try:
        out = checkpoint.load(path, target)
    except checkpoint.CheckpointError:
        assert torch.equal(target["model"]["w"].cpu(), torch.zeros(3, 4))
        # What Orbax's failed read leaves behind is finalised here, inside this test (pyproject.toml names it).
        gc.collect()
        return
    assert torch.equal(target["model"]["w"].cpu(), torch.arange(12.0).reshape(3, 4)) and out["step"] == 5
    assert torch.equal(target["model"]["b"], torch.ones(4))


def test_plain_orbax_reads_it(tmp_path):
    """The recipe of docs/checkpoint.md: no spmdtorch needed to read the arrays."""
    w = torch.randn(10, 6)
    mark = mark_sharding(w.clone().to("xla"), Mesh(np.arange(8), (4, 2), ("a", "b")), ("a", "b"))
    checkpoint.save(
        tmp_path / "c", {"model": {"fc.weight": mark}, "optim": {"state": {0: {"m": torch.ones(3)}}}, "step": 9}
    )
    arrays = ocp.PyTreeCheckpointer().restore(tmp_path / "c" / "arrays")
    assert np.array_equal(np.asarray(arrays["model"]["fc.weight"]), w.numpy())
    assert np.array_equal(np.asarray(arrays["optim"]["state"]["0"]["m"]), np.ones(3))
    import json

    record = json.loads((tmp_path / "c" / "meta" / "metadata").read_text())
    assert record["arrays"][0]["path"] == ["model", "fc.weight"] and record["arrays"][0]["dtype"] == "float32"


_CHILD = textwrap.dedent(r"""
    # A 4-device runtime: restore the 8-device checkpoint, save it, restore that
    # onto 1 device (a one-device slice), save again.
    import sys
    import numpy as np, torch, jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    import spmdtorch
    from spmdtorch import checkpoint
    from spmdtorch.mesh import Mesh
    from spmdtorch.partition import mark_sharding
    from spmdtorch.tensor.xla_tensor import new_base
    root = sys.argv[1]
    assert jax.device_count() == 4, jax.devices()
    want = torch.load(root + "/want.pt")
    mesh = Mesh(np.arange(4), (4,), ("x",))
    state = {"w": mark_sharding(torch.zeros(10, 6).to("xla"), mesh, (None, "x")),
             "v": mark_sharding(torch.zeros(13).to("xla"), mesh, ("x",)), "step": 0}
    out = checkpoint.load(root + "/on8", state)
    assert torch.equal(state["w"].cpu(), want["w"]) and torch.equal(state["v"].cpu(), want["v"]), "on 4"
    assert state["w"]._st.value.shape == (10, 8) and out["step"] == 0
    out["step"] = 1
    checkpoint.save(root + "/on4", out)
    one = NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:1]), ("x",)), P())
    state1 = {"w": new_base(jax.device_put(np.zeros((10, 6), np.float32), one), torch.float32),
              "v": new_base(jax.device_put(np.zeros(13, np.float32), one), torch.float32), "step": 0}
    out = checkpoint.load(root + "/on4", state1)
    assert torch.equal(state1["w"].cpu(), want["w"]) and torch.equal(state1["v"].cpu(), want["v"]), "on 1"
    assert state1["w"]._st.value.sharding.device_set == {jax.devices()[0]} and out["step"] == 1
    out["step"] = 2
    checkpoint.save(root + "/on1", out)
    print("ok")
""")


def test_device_count_changes_8_4_1_8(tmp_path):
    gen = torch.Generator().manual_seed(3)
    want = {"w": torch.randn(10, 6, generator=gen), "v": torch.randn(13, generator=gen)}
    torch.save(want, tmp_path / "want.pt")
    mesh = Mesh(np.arange(8), (4, 2), ("a", "b"))
    checkpoint.save(
        tmp_path / "on8",
        {
            "w": mark_sharding(want["w"].clone().to("xla"), mesh, ("a", "b")),
            "v": mark_sharding(want["v"].clone().to("xla"), mesh, (("a", "b"),)),
            "step": 0,
        },
    )
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4", JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU")
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], check=False, env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
    w = mark_sharding(torch.zeros(10, 6).to("xla"), mesh, ("b", "a"))
    out = checkpoint.load(tmp_path / "on1", {"w": w, "v": torch.zeros(13), "step": -1})
    assert torch.equal(w.cpu(), want["w"]) and torch.equal(out["v"], want["v"]) and out["step"] == 2


def test_save_hashes_after_orbax_copy_and_a_failed_hash_saves_nothing(tmp_path, monkeypatch):
    from spmdtorch.checkpoint import fingerprint

    log = []
    real_save, real_fp = ocp.AsyncCheckpointer.save, fingerprint.device_fingerprints

    def orbax_save(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        log.append("orbax blocking phase done")

    def hashed(arrays, logical_shapes=None):
        log.append("fingerprints dispatched")
        return real_fp(arrays, logical_shapes)

    monkeypatch.setattr(ocp.AsyncCheckpointer, "save", orbax_save)
    monkeypatch.setattr(fingerprint, "device_fingerprints", hashed)
    path = _saved(tmp_path)
    # Hashed while Orbax writes, not before its copy; the record holds the hashes.
    assert log == ["orbax blocking phase done", "fingerprints dispatched"]
    assert checkpoint.load(path, _target())["step"] == 5

    def broken(arrays, logical_shapes=None):
        raise RuntimeError("fingerprint program failed to launch")

    monkeypatch.setattr(fingerprint, "device_fingerprints", broken)
    with pytest.raises(RuntimeError, match="failed to launch"):
        checkpoint.save(tmp_path / "c2", _target())
    with pytest.raises(NotACheckpointError, match="unfinished save"):
        checkpoint.load(tmp_path / "c2", _target())


def test_undispatched_fingerprints_time_out_with_a_message():
    from spmdtorch.checkpoint.io import SaveFingerprints

    pending = SaveFingerprints([], [], [])
    with pytest.raises(checkpoint.CheckpointSaveError, match=r"not dispatched within 0 s.*not finalised"):
        pending.results(timeout=0.01)
    pending.fail(OSError("disk full"))
    with pytest.raises(checkpoint.CheckpointSaveError, match=r"save failed before.*OSError: disk full") as e:
        pending.results(timeout=0.01)
    assert isinstance(e.value.__cause__, OSError)


def test_equal_restored_scalars_share_one_array_and_stay_independent(tmp_path):
    """AdamW's per-parameter step counters are one array in a step (equal results
    share a buffer); a restore keeps them one, so the bias corrections stay shared."""
    from spmdtorch.tensor.dispatch import read_value

    saved = {
        "a": torch.tensor(3.0, device="xla"),
        "b": torch.tensor(3.0, device="xla"),
        "c": torch.tensor(4.0, device="xla"),
        "i": torch.tensor(3, device="xla"),
    }
    checkpoint.save(tmp_path / "c", saved)
    target = {k: torch.zeros_like(v) for k, v in saved.items()}
    checkpoint.load(tmp_path / "c", target)
    assert read_value(target["a"]) is read_value(target["b"])
    assert read_value(target["c"]) is not read_value(target["a"])
    assert read_value(target["i"]) is not read_value(target["a"])  # another dtype
    target["a"].add_(1)
    spmdtorch.sync(wait=True)
    assert [target[k].item() for k in "abci"] == [4.0, 3.0, 4.0, 3]


def test_tensors_sharing_one_array_save_and_restore(tmp_path):
    """Equal results share one buffer (several tensors, one jax.Array): saving them
    writes each path, and a later step that replaces the buffer leaves the saved data alone."""
    from spmdtorch.tensor.dispatch import read_value

    counters = [torch.zeros((), device="xla") for _ in range(3)]
    for c in counters:
        c.add_(2)
    spmdtorch.sync()
    assert read_value(counters[0]) is read_value(counters[2])
    checkpoint.save(tmp_path / "c", {"c": counters})
    mgr = checkpoint.CheckpointManager(tmp_path / "m")
    mgr.save(1, {"c": counters})  # async: the next step donates the shared buffer
    for c in counters:
        c.add_(1)
    spmdtorch.sync(wait=True)
    mgr.wait_until_finished()
    for restore in (lambda t: checkpoint.load(tmp_path / "c", t), lambda t: mgr.restore(t, step=1)):
        target = {"c": [torch.full((), 7.0, device="xla") for _ in range(3)]}
        restore(target)
        assert [t.item() for t in target["c"]] == [2.0, 2.0, 2.0]
    assert [c.item() for c in counters] == [3.0, 3.0, 3.0]
