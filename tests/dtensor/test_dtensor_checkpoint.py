"""torch.distributed.checkpoint over spmdtorch.dtensor models: save, restore, reshard onto another mesh shape.

The route under test (docs/dtensor.md, "Checkpoints"): spmdtorch.dtensor's
get_model_state_dict / get_optimizer_state_dict (torch's, DTensors as their
global xla tensors) -> dcp.save(planner=SPMDSavePlanner()); on restore the
target model's state dicts -> dcp.load(planner=SPMDLoadPlanner()), in place,
then set_model_state_dict / set_optimizer_state_dict. Values are compared
with the saved ones (exactly) and training with eager CPU AdamW.
"""

from __future__ import annotations

import copy
import io
import json
import os
import pathlib
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import spmdtorch
from spmdtorch.checkpoint import SPMDLoadPlanner, SPMDSavePlanner
from spmdtorch.dtensor import (
    NoRankError,
    StateDictError,
    XlaDTensor,
    fully_shard,
    get_model_state_dict,
    get_optimizer_state_dict,
    init_device_mesh,
    parallelize_module,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from spmdtorch.launch import launch
from spmdtorch.sharding import get_sharding_spec


class Block(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class Net(nn.Module):
    def __init__(self, hidden: int = 32) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(hidden=hidden), Block(hidden=hidden)])
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _fsdp(model: Net, mesh) -> Net:
    """FSDP2 per block and on the root over a 1-D ("dp",) mesh."""
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp_tp(model: Net, mesh) -> Net:
    """torchtitan's layout on a ("dp", "tp") mesh: column/row-wise feed-forward over tp, FSDP over dp."""
    for layer in model.layers:
        parallelize_module(layer, mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        fully_shard(layer, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"])


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int, device: str) -> float:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, 16, generator=g), torch.randn(16, 4, 8, generator=g)
    loss = F.mse_loss(model(x.to(device)), y.to(device))
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.item()


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, XlaDTensor) else t).cpu()


def _save(model: nn.Module, opt: torch.optim.Optimizer, path: str, options: StateDictOptions | None = None) -> None:
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # DCP: "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=path, planner=SPMDSavePlanner())


def _restore(model: nn.Module, opt: torch.optim.Optimizer, path: str, options: StateDictOptions | None = None) -> None:
    state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt, options=options)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=path, planner=SPMDLoadPlanner())
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt, state["optim"], options=options)


def _assert_same_state(src: nn.Module, src_opt, dst: nn.Module, dst_opt) -> None:
    """Parameters and AdamW state of ``dst`` equal ``src``'s exactly, and ``dst``'s keep their DTensor layouts."""
    for (name, p), (_, q) in zip(src.named_parameters(), dst.named_parameters(), strict=True):
        assert isinstance(q, XlaDTensor), name
        assert torch.equal(_full(p), _full(q)), name
        a, b = src_opt.state[p], dst_opt.state[q]
        assert set(a) == set(b), name
        for key in a:
            assert torch.equal(_full(a[key]), _full(b[key])), (name, key)
        # The moments are DTensors laid out as their parameter (AdamW keeps updating them in place).
        assert isinstance(b["exp_avg"], XlaDTensor) and b["exp_avg"].placements == q.placements, name
        assert get_sharding_spec(b["exp_avg"].to_local()) == get_sharding_spec(q.to_local()), name


@pytest.fixture
def meshes(devices8):
    return (
        init_device_mesh("xla", (8,), mesh_dim_names=("dp",)),
        init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp")),
    )


@pytest.mark.parametrize("flatten", [False, True], ids=["nested", "flattened_optimizer_state"])
def test_save_restore_same_mesh(meshes, tmp_path, flatten):
    options = StateDictOptions(flatten_optimizer_state_dict=flatten)
    dp, _ = meshes
    torch.manual_seed(0)
    src = _fsdp(Net(), dp)
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    for s in range(2):
        _step(src, src_opt, s, "xla")
    specs = {n: get_sharding_spec(p.to_local()) for n, p in src.named_parameters()}
    _save(src, src_opt, str(tmp_path / "ckpt"), options)

    torch.manual_seed(1)  # other initial values: the restore must overwrite every one
    dst = _fsdp(Net(), dp)
    dst_opt = torch.optim.AdamW(dst.parameters(), lr=1e-2)
    _restore(dst, dst_opt, str(tmp_path / "ckpt"), options)
    _assert_same_state(src, src_opt, dst, dst_opt)
    assert {n: get_sharding_spec(p.to_local()) for n, p in dst.named_parameters()} == specs
    assert all(dst_opt.state[p]["step"].item() == 2 for p in dst.parameters())


def test_reshard_fsdp_to_fsdp_tp_and_back_trains_like_eager(meshes, tmp_path):
    """Saved on (8,) FSDP, restored onto (2, 4) FSDP + TP, trained, saved, restored onto (8,) again."""
    dp, dp_tp = meshes
    torch.manual_seed(0)
    eager = Net()
    src = _fsdp(copy.deepcopy(eager), dp)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    for s in range(2):
        assert _step(src, src_opt, s, "xla") == pytest.approx(_step(eager, eager_opt, s, "cpu"), rel=1e-5)
    _save(src, src_opt, str(tmp_path / "a"))

    torch.manual_seed(1)
    tp = _fsdp_tp(Net(), dp_tp)
    tp_opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    layout = {n: (p.placements, get_sharding_spec(p.to_local())) for n, p in tp.named_parameters()}
    _restore(tp, tp_opt, str(tmp_path / "a"))
    _assert_same_state(src, src_opt, tp, tp_opt)
    assert {n: (p.placements, get_sharding_spec(p.to_local())) for n, p in tp.named_parameters()} == layout
    assert (
        tp.layers[0].w2.weight.placements != src.layers[0].w2.weight.placements
    )  # (Shard(0), Shard(1)) vs (Shard(0),)
    assert _step(tp, tp_opt, 2, "xla") == pytest.approx(_step(eager, eager_opt, 2, "cpu"), rel=1e-5)
    _save(tp, tp_opt, str(tmp_path / "b"))

    torch.manual_seed(2)
    back = _fsdp(Net(), dp)
    back_opt = torch.optim.AdamW(back.parameters(), lr=1e-2)
    _restore(back, back_opt, str(tmp_path / "b"))
    _assert_same_state(tp, tp_opt, back, back_opt)
    assert _step(back, back_opt, 3, "xla") == pytest.approx(_step(eager, eager_opt, 3, "cpu"), rel=1e-5)
    for (name, p), (_, q) in zip(eager.named_parameters(), back.named_parameters(), strict=True):
        torch.testing.assert_close(_full(q), p.detach(), rtol=1e-5, atol=1e-6, msg=name)


def _compiled_step(model: nn.Module, opt: torch.optim.Optimizer):
    @spmdtorch.compile
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    def run(seed: int) -> float:
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(16, 4, 16, generator=g), torch.randn(16, 4, 8, generator=g)
        return step(x.to("xla"), y.to("xla")).item()

    return run


def test_compiled_training_resumes_on_another_mesh_like_eager(meshes, tmp_path):
    """Under spmdtorch.compile AdamW is capturable (its step count an xla tensor); that state saves and restores too."""
    dp, dp_tp = meshes
    torch.manual_seed(0)
    eager = Net()
    src = _fsdp(copy.deepcopy(eager), dp)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    step = _compiled_step(src, src_opt)
    for s in range(3):
        assert step(s) == pytest.approx(_step(eager, eager_opt, s, "cpu"), rel=1e-5)
    assert src_opt.param_groups[0]["capturable"]  # the step counts live on the devices
    _save(src, src_opt, str(tmp_path / "ckpt"))

    torch.manual_seed(1)
    tp = _fsdp_tp(Net(), dp_tp)
    tp_opt = torch.optim.AdamW(tp.parameters(), lr=1e-2)
    _restore(tp, tp_opt, str(tmp_path / "ckpt"))
    _assert_same_state(src, src_opt, tp, tp_opt)
    step = _compiled_step(tp, tp_opt)
    for s in range(3, 6):
        assert step(s) == pytest.approx(_step(eager, eager_opt, s, "cpu"), rel=1e-5)
    for (name, p), (_, q) in zip(eager.named_parameters(), tp.named_parameters(), strict=True):
        torch.testing.assert_close(_full(q), p.detach(), rtol=1e-5, atol=1e-6, msg=name)


def test_set_model_state_dict_from_full_cpu_state_dict(meshes):
    """An eager model's CPU state dict (or full_state_dict=True) loads into a FSDP + TP model, keeping its layouts."""
    _, dp_tp = meshes
    torch.manual_seed(0)
    eager = Net()
    model = _fsdp_tp(Net(), dp_tp)
    placements = {n: p.placements for n, p in model.named_parameters()}
    set_model_state_dict(model, eager.state_dict())
    for (name, p), (_, q) in zip(eager.named_parameters(), model.named_parameters(), strict=True):
        assert isinstance(q, XlaDTensor) and q.placements == placements[name], name
        assert torch.equal(_full(q), p.detach()), name
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert all(v.device.type == "cpu" and not isinstance(v, XlaDTensor) for v in full.values())
    assert all(torch.equal(full[k], v) for k, v in eager.state_dict().items())
    torch.manual_seed(3)
    other = _fsdp(Net(), init_device_mesh("xla", (8,), mesh_dim_names=("dp",)))
    set_model_state_dict(other, full, options=StateDictOptions(full_state_dict=True))
    assert all(torch.equal(_full(q), p.detach()) for p, q in zip(eager.parameters(), other.parameters()))


def test_state_dict_of_another_model_is_a_named_error(meshes, tmp_path):
    dp, _ = meshes
    torch.manual_seed(0)
    model = _fsdp(Net(), dp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # Another model's keys: the error names them.
    other = nn.Sequential(nn.Linear(16, 8))
    with pytest.raises(StateDictError, match=r"missing \['head.bias'.*unexpected \['0.bias', '0.weight'\]"):
        set_model_state_dict(model, other.state_dict())
    # The same keys, another shape: the key and both shapes.
    wider = Net(hidden=48).state_dict()
    with pytest.raises(
        StateDictError, match=r"'layers.0.w1.weight' has shape \(48, 16\) but the model's has \(32, 16\)"
    ):
        set_model_state_dict(model, wider)
    # Optimizer state for a parameter the model does not have.
    osd = get_optimizer_state_dict(model, opt)
    osd["state"]["encoder.weight"] = osd["state"].pop("head.weight")
    with pytest.raises(StateDictError, match=r"state for 'encoder.weight'"):
        set_optimizer_state_dict(model, opt, osd)
    # dcp.load of a checkpoint of another model: DCP's error (per rank) names the missing key.
    _save(model, opt, str(tmp_path / "ckpt"))
    wide = _fsdp(Net(hidden=48), dp)
    with pytest.raises(CheckpointException) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load({"model": get_model_state_dict(wide)}, checkpoint_id=str(tmp_path / "ckpt"), planner=SPMDLoadPlanner())
    assert "layers.0.w1.weight" in str(info.value.failures[0][0])


def test_torch_state_dict_with_dtensors_names_the_route(meshes, tmp_path):
    """torch's own get_model_state_dict gives DTensors, which DCP's planners ask for a rank: the error says what to use."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict as torch_get

    dp, _ = meshes
    model = _fsdp(Net(), dp)
    sd = torch_get(model)
    assert isinstance(sd["head.weight"], XlaDTensor)
    with pytest.raises(CheckpointException) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save({"model": sd}, checkpoint_id=str(tmp_path / "ckpt"), planner=SPMDSavePlanner())
    err = info.value.failures[0][0]
    assert isinstance(err, NoRankError) and "spmdtorch.dtensor.get_model_state_dict" in str(err)


def _clean_env() -> dict[str, str]:
    """This environment without any launcher's variables (a job's own are set by the launcher)."""
    launcher = ("SPMDTORCH_", "MASTER_", "JAX_COORDINATOR", "SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in ("RANK", "WORLD_SIZE")}


JOB_LIMIT_S = 150


@pytest.mark.slow
@pytest.mark.timeout(JOB_LIMIT_S + 60)
def test_two_processes_restore_a_one_process_checkpoint_and_back(meshes, tmp_path):
    """Saved by this process on (8,) FSDP; a 2 x 4 job restores it onto (2, 4) FSDP + TP, trains, saves; read back here.

    The launcher kills the job (and its process group) after JOB_LIMIT_S, so a hung collective fails the test.
    """
    dp, _ = meshes
    torch.manual_seed(0)
    eager = Net()
    src = _fsdp(copy.deepcopy(eager), dp)
    eager_opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    src_opt = torch.optim.AdamW(src.parameters(), lr=1e-2)
    for s in range(2):
        _step(src, src_opt, s, "xla")
        _step(eager, eager_opt, s, "cpu")
    _save(src, src_opt, str(tmp_path / "src"))
    expected = {
        "params": {n: _full(p) for n, p in src.named_parameters()},
        "exp_avg": {n: _full(src_opt.state[p]["exp_avg"]) for n, p in src.named_parameters()},
        "exp_avg_sq": {n: _full(src_opt.state[p]["exp_avg_sq"]) for n, p in src.named_parameters()},
    }
    torch.save(expected, tmp_path / "expected.pt")
    eager_loss = _step(eager, eager_opt, 2, "cpu")

    job = pathlib.Path(__file__).with_name("dtensor_checkpoint_job.py")
    out = io.StringIO()
    args = [str(job), str(tmp_path / "src"), str(tmp_path / "expected.pt"), str(tmp_path / "out")]
    result = launch(
        args, nprocs=2, devices_per_proc=4, out=out, timeout_s=JOB_LIMIT_S, grace_period_s=5.0, env=_clean_env()
    )
    text = out.getvalue()
    assert result.returncode == 0, text[-4000:]
    reports = [json.loads(line.split("] RESULT ", 1)[1]) for line in text.splitlines() if "] RESULT " in line]
    assert len(reports) == 2, text[-4000:]
    for rep in reports:
        assert (rep["process_count"], rep["devices"]) == (2, 8), rep
        assert rep["params_equal"] and rep["moments_equal"] and rep["steps"] == [2.0], rep
        assert rep["loss"] == pytest.approx(eager_loss, rel=1e-5), rep
    assert len(list((tmp_path / "out").glob("*.distcp"))) == 2  # each process wrote its own shards

    torch.manual_seed(2)
    back = _fsdp(Net(), dp)
    back_opt = torch.optim.AdamW(back.parameters(), lr=1e-2)
    _restore(back, back_opt, str(tmp_path / "out"))
    for (name, p), (_, q) in zip(eager.named_parameters(), back.named_parameters(), strict=True):
        torch.testing.assert_close(_full(q), p.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert _step(back, back_opt, 3, "xla") == pytest.approx(_step(eager, eager_opt, 3, "cpu"), rel=1e-5)
