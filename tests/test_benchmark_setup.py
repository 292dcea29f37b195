"""``benchmarks/_train_setup.py`` and the PyTorch/XLA worker's helpers, without PyTorch/XLA.

The PyTorch/XLA worker of ``benchmarks/train_step.py`` runs in an interpreter
with torch_xla and without jax or spmdtorch: the shared setup must build the
same model and batch there as in spmdtorch's own workers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(_BENCH))

import _ptxla_worker  # noqa: E402
import _train_setup  # noqa: E402


def _fingerprint(model, tokens) -> list:
    return [sum(float(p.detach().double().sum()) for p in model.parameters()), int(tokens.sum())]


@pytest.mark.timeout(120)
def test_setup_without_jax_builds_the_same_model():
    # sys.modules["jax"] = None: find_spec and import both say jax is absent, as
    # in PyTorch/XLA's interpreter; the decoder then loads from its file.
    code = (
        "import json, sys; sys.modules['jax'] = None; "
        f"sys.path.insert(0, {str(_BENCH)!r}); import _train_setup as s; "
        "cfg, model, tokens = s.setup('tiny', 8); "
        "print(json.dumps([sum(float(p.detach().double().sum()) for p in model.parameters()), int(tokens.sum()), "
        "cfg.ffn_dim, type(model).__module__, 'spmdtorch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=True)
    weights, token_sum, ffn_dim, module, imported_spmdtorch = json.loads(out.stdout.strip().splitlines()[-1])
    assert not imported_spmdtorch and module == "_train_setup_llama"
    cfg, model, tokens = _train_setup.setup("tiny", 8)  # here spmdtorch is imported: the package's module
    assert type(model).__module__ == "spmdtorch.models.llama"
    assert ffn_dim == cfg.ffn_dim == 176  # 172 rounded up to a multiple of 8 devices
    assert [weights, token_sum] == pytest.approx(_fingerprint(model, tokens), rel=1e-12)


@pytest.mark.parametrize(
    "shape,spec,expected",
    [
        ((256, 64), "{devices=[8,1]0,1,2,3,4,5,6,7}", 32 * 64),
        ((64, 176), "{devices=[1,8]0,1,2,3,4,5,6,7}", 64 * 22),
        ((10,), "{devices=[8]0,1,2,3,4,5,6,7}", 2),  # uneven: the largest shard
        ((64, 64), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", 16 * 64),
        ((64,), "{replicated}", 64),
        ((3, 5), "", 15),
    ],
)
def test_ptxla_shard_numel_reads_the_tile_assignment(shape, spec, expected):
    assert _ptxla_worker._shard_numel(torch.empty(shape), spec) == expected


def _run(step_ms: float, blocks: list[float], first_s: float, aten_ops: float = 0, idle: float | None = None) -> dict:
    run = {
        "step_ms": step_ms,
        "blocks_ms": blocks,
        "first_s": first_s,
        "host_ms": 2.0,
        "aten_ops": aten_ops,
        "cpu_ms": 2 * step_ms,
        "compiles": 1,
    }
    if idle is not None:  # runs from before it was measured have none
        run["device_idle"] = idle
    return run


def test_markdown_table_ratios_against_the_twin_and_pytorch_xla():
    import train_step

    raw = {
        "tiny": {
            "jax": [_run(10, [10, 10, 10], 2.0), _run(20, [20, 20, 20], 2.0)],
            "lazy": [_run(15, [15, 16, 14], 3.0, 100, idle=0.334), _run(22, [22, 22, 22], 2.0, 100, idle=0.2)],
            "ptxla": [_run(30, [30, 32, 28], 2.0), _run(40, [40, 40, 40], 4.0)],
        }
    }
    rows = {line.split(" | ")[1]: line for line in train_step.markdown_table(raw).splitlines()[2:]}
    # lazy: round ratios 1.50 and 1.10 against the twin (median 1.30), 0.50 and 0.55 against PyTorch/XLA.
    assert "| 1.30 [1.50 1.10] | 0.53 [0.50 0.55] |" in rows["lazy"]
    assert "| 2.00 | 33% | 100, 20.0 |" in rows["lazy"]  # the shown round's idle share; 2 ms of host over 100 ops
    assert "| 2.00 | – |" in rows["PyTorch/XLA 2.9 lazy"]  # not traced in this run
    assert rows["lazy"].startswith("| tiny | lazy | 15.0 |")  # of two rounds, the upper median (ratio 1.50)
    assert rows["PyTorch/XLA 2.9 lazy"].startswith("| tiny | PyTorch/XLA 2.9 lazy | 30.0 | 2.50 [3.00 2.00] | 1.00 |")
    assert rows["JAX twin"].startswith("| tiny | JAX twin | 20.0 | 1.00 | – |")  # equal ratios: the later round


def test_baseline_checkout_adds_a_row_per_mode_and_refuses_a_non_checkout(tmp_path, capsys, monkeypatch):
    # --baseline: before/after timing of a change in one alternating run (issue 44).
    import train_step

    with pytest.raises(SystemExit):
        train_step.main(["--configs", "tiny", "--modes", "lazy", "--baseline", str(tmp_path)])
    assert f"--baseline {tmp_path}: not a spmdtorch checkout" in capsys.readouterr().err
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.setattr(train_step, "MODES", ("jax", "lazy", "compiled"))
    monkeypatch.setattr(train_step, "BASELINE", None)
    monkeypatch.setattr(train_step, "BASELINE_NAME", "baseline")
    train_step._set_baseline(None, repo)  # this checkout is a valid one
    assert train_step.MODES == ("jax", "lazy", "compiled", "lazy@base", "compiled@base")
    assert train_step.mode_label("lazy@base", "spmdtorch ").startswith("spmdtorch lazy (baseline ")
    assert train_step.mode_label("jax") == "JAX twin" and train_step.mode_label("lazy") == "lazy"
    with pytest.raises(ValueError, match="needs --baseline"):
        monkeypatch.setattr(train_step, "BASELINE", None)
        train_step.Worker("lazy@base", "tiny", timeout=1)


def test_an_unreadable_trace_leaves_the_idle_column_empty_and_says_why(tmp_path, capsys):
    import train_step

    (tmp_path / "x.xplane.pb").write_bytes(b"not an XSpace")
    assert train_step.idle_share(str(tmp_path), "ptxla") is None  # the run goes on: the column reads "-"
    err = capsys.readouterr().err
    assert err.startswith("device idle of ptxla: ") and "does not parse as one" in err, err
    assert train_step.idle_text({"device_idle": None}) == "-"


@pytest.mark.timeout(300)
def test_dtensor_mode_lays_the_model_out_as_fsdpv2_and_trains_like_eager(devices8):
    # train_step.py's dtensor mode: the FSDPv2 model's layout through torch's DTensor API (issue 43).
    import copy

    import train_step
    from torch.distributed.tensor import DTensor, Shard

    import spmdtorch
    from spmdtorch.sharding import get_sharding_spec

    _, model, tokens = _train_setup.setup("tiny", 8)
    eager = copy.deepcopy(model)
    fsdp, _, _, fsdp_step = train_step.spmdtorch_step(copy.deepcopy(model), tokens)
    dt, _, tok, dt_step = train_step.dtensor_step(model, tokens)
    assert isinstance(tok, DTensor) and tok.placements == (Shard(0),)
    fsdp_specs = {n.replace("_orig_module.", ""): get_sharding_spec(p) for n, p in fsdp.named_parameters()}
    dt_specs = {}
    for name, p in dt.named_parameters():
        assert isinstance(p, DTensor), name
        dt_specs[name] = get_sharding_spec(p.to_local())
    assert dt_specs == fsdp_specs
    assert "{devices=[8,1]0,1,2,3,4,5,6,7}" in dt_specs.values()  # a layout, not replication everywhere
    opt = torch.optim.AdamW(
        eager.parameters(),
        lr=_train_setup.LR,
        betas=_train_setup.BETAS,
        eps=_train_setup.EPS,
        weight_decay=_train_setup.WD,
    )
    eager_step = _train_setup.make_train_step(eager, opt)
    for i in range(3):
        with spmdtorch.step():
            loss = dt_step(tok)
        want = eager_step(tokens)
        assert isinstance(loss, DTensor), type(loss).__name__
        torch.testing.assert_close(
            loss.full_tensor().detach().cpu(), want.detach(), rtol=1e-4, atol=1e-5, msg=f"step {i}"
        )


@pytest.mark.timeout(300)
def test_compiled_dtensor_mode_replays_and_trains_like_eager(devices8):
    # Without compilable_dtensor_step's capturable groups, AdamW's host step counter is a new
    # number every call: spmdtorch.compile traces every call and never replays.
    import copy

    import train_step

    import spmdtorch
    from spmdtorch import debug

    _, model, tokens = _train_setup.setup("tiny", 8)
    eager = copy.deepcopy(model)
    _, opt, tok, step = train_step.dtensor_step(model, tokens)
    step, tok = train_step.compilable_dtensor_step(step, opt, tok)
    run = spmdtorch.compile(step)
    eager_opt = torch.optim.AdamW(
        eager.parameters(),
        lr=_train_setup.LR,
        betas=_train_setup.BETAS,
        eps=_train_setup.EPS,
        weight_decay=_train_setup.WD,
    )
    eager_step = _train_setup.make_train_step(eager, eager_opt)
    replays = debug.counter_value("CompiledReplay")
    for i in range(6):
        loss = run(tok)
        want = eager_step(tokens)
        torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-4, atol=1e-5, msg=f"step {i}")
    assert debug.counter_value("CompiledReplay") - replays >= 2
