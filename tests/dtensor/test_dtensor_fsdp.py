"""spmdtorch.dtensor.fully_shard: FSDP2 on an xla mesh (parameters as Shard(0) DTensors), trained against eager CPU."""

from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy
from torch.distributed.fsdp import fully_shard as torch_fully_shard
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import spmdtorch
from spmdtorch import debug
from spmdtorch.dtensor import (
    DTensorError,
    NoRankError,
    UnsupportedFSDPError,
    XlaDTensor,
    distribute_tensor,
    fully_shard,
    init_device_mesh,
    parallelize_module,
    partition_spec,
    spmd_mesh,
)
from spmdtorch.fsdp import MixedPrecision, accumulate_gradients
from spmdtorch.sharding import get_sharding_spec, mark_sharding


class Block(nn.Module):
    """A pre-norm residual MLP block (the parameter shapes of a transformer layer's feed-forward half)."""

    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.w2(F.gelu(self.w1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _shard(model: Net, mesh, **kwargs) -> Net:
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


@pytest.fixture
def dp_mesh(devices8):
    return init_device_mesh("xla", (8,), mesh_dim_names=("dp",))


def _marked(mesh, shape, spec) -> str:
    return get_sharding_spec(mark_sharding(torch.zeros(shape, device="xla"), spmd_mesh(mesh), spec))


def _batch(mesh, seed: int, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 4, 16, generator=g), torch.randn(rows, 4, 8, generator=g)


def _on_xla(mesh, t: torch.Tensor) -> torch.Tensor:
    # The batch split over the data-parallel axis, as a data loader would give it.
    return mark_sharding(t.to("xla"), spmd_mesh(mesh), ("dp",) + (None,) * (t.dim() - 1))


def test_per_layer_and_root_fully_shard_trains_like_eager(dp_mesh):
    torch.manual_seed(0)
    ref = Net()
    model = _shard(copy.deepcopy(ref), dp_mesh)
    assert isinstance(model, FSDPModule) and isinstance(model.layers[0], FSDPModule)
    assert type(model).__name__ == "FSDPNet" and isinstance(model, Net)
    for name, p in model.named_parameters():
        assert isinstance(p, nn.Parameter) and isinstance(p, XlaDTensor), name
        assert p.placements == (Shard(0),), name
        spec = ("dp",) + (None,) * (p.dim() - 1)
        assert get_sharding_spec(p.to_local()) == _marked(dp_mesh, tuple(p.shape), spec), name
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(3):
        x, y = _batch(dp_mesh, step)
        loss = F.mse_loss(model(_on_xla(dp_mesh, x)), _on_xla(dp_mesh, y))
        loss.backward()
        for name, p in model.named_parameters():
            assert isinstance(p.grad, XlaDTensor) and p.grad.placements == (Shard(0),), name
        opt.step()
        opt.zero_grad()
        ref_loss = F.mse_loss(ref(x), y)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        spmdtorch.sync()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6, msg=f"step {step}")
    for name, p in model.named_parameters():
        assert p.placements == (Shard(0),), name
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), rtol=1e-4, atol=1e-5, msg=name
        )


@pytest.mark.parametrize(
    ("make_opt", "steps", "seed"),
    [
        (lambda params: torch.optim.SGD(params, lr=0.1), 3, 1),
        # AdamW as users build it (capturable=False): spmdtorch.compile makes it
        # capturable while tracing so that its step counters live on the
        # devices; over DTensor parameters too, or every call traces again.
        (lambda params: torch.optim.AdamW(params, lr=1e-2), 5, 2),
    ],
    ids=["sgd", "adamw"],
)
def test_compiled_step_equals_eager_and_replays(dp_mesh, make_opt, steps, seed):
    torch.manual_seed(seed)
    ref = Net()
    model = _shard(copy.deepcopy(ref), dp_mesh)
    opt = make_opt(model.parameters())
    opt_ref = make_opt(ref.parameters())

    @spmdtorch.compile
    def step(x, y):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    replays = debug.counter_value("CompiledReplay")
    for i in range(steps):
        x, y = _batch(dp_mesh, 10 * seed + i)
        loss = step(_on_xla(dp_mesh, x), _on_xla(dp_mesh, y))
        ref_loss = F.mse_loss(ref(x), y)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6, msg=f"step {i}")
    assert model.head.weight.placements == (Shard(0),)
    if "capturable" in opt.param_groups[0]:
        assert opt.param_groups[0]["capturable"]
    # Traced until stable (at most 3 calls: first call, then the state the optimizer made), replayed after.
    assert debug.counter_value("CompiledReplay") - replays >= steps - 3
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), rtol=1e-4, atol=1e-5, msg=name
        )


def test_a_dtensor_argument_of_a_compiled_function_is_a_named_error(dp_mesh):
    d = distribute_tensor(torch.ones(8, 2), dp_mesh, [Shard(0)])
    step = spmdtorch.compile(lambda t: t * 2)
    with pytest.raises(spmdtorch.CompiledArgumentTypeError, match=r"XlaDTensor.*to_local\(\).*from_local"):
        step(d)
    assert step(d.to_local()).sum().item() == 32.0


_BF16_CONSTRAINT = re.compile(
    r"= bf16\[[\d,]*\]\S* custom-call\(.*custom_call_target=\"Sharding\", sharding=\{devices="
)


def test_mixed_precision_policy_within_bf16_of_eager(dp_mesh):
    torch.manual_seed(2)
    ref = Net()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _shard(copy.deepcopy(ref), dp_mesh, mp_policy=policy)
    # The eager reference: every parameter and the input cast to bf16 for the forward, float32 master weights.
    ref_policy = MixedPrecision(param_dtype=torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        x, y = _batch(dp_mesh, 20 + step)
        out = model(_on_xla(dp_mesh, x))
        assert out.dtype == torch.bfloat16  # output_dtype None: as computed, as torch's
        loss = F.mse_loss(out.float(), _on_xla(dp_mesh, y))
        if step == 0:
            # Each device casts its own shard: every parameter's bf16 copy is constrained to its Shard(0)
            # layout, so XLA gathers bf16 values (XLA:CPU's float normalisation then computes bf16 products in
            # float32 and gathers those; GPU and TPU keep bf16).
            constrained = _BF16_CONSTRAINT.findall(debug.get_hlo_text([loss], optimized=False))
            assert len(constrained) >= len(list(model.parameters())), constrained
        loss.backward()
        assert all(p.grad.dtype == torch.float32 and p.dtype == torch.float32 for p in model.parameters())
        opt.step()
        opt.zero_grad()
        ref_loss = F.mse_loss(ref_policy.run(ref, (x,), {}).float(), y)
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        spmdtorch.sync()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=2e-2, atol=2e-2, msg=f"step {step}")
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), rtol=2e-2, atol=1e-2, msg=name
        )


def test_fsdp_over_tensor_parallel_on_a_2d_mesh(devices8):
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(3)
    ref = Block()
    model = parallelize_module(copy.deepcopy(ref), mesh["tp"], {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    spmdtorch.sync()
    executed = debug.counter_value("ExecuteCount") or 0
    fully_shard(model, mesh=mesh["dp"])
    # The tensor-parallel parameters' data is resharded into the composed layout at once (not a pending copy
    # that the first step program would reshard, with collectives the later steps have not).
    spmdtorch.sync()
    assert (debug.counter_value("ExecuteCount") or 0) == executed
    expected = {
        "w1.weight": (Shard(0), Shard(0)),
        "w1.bias": (Shard(0), Shard(0)),
        "w2.weight": (Shard(0), Shard(1)),
        "w2.bias": (Shard(0), Replicate()),
        "norm.weight": (Shard(0),),  # not tensor parallel: sharded over dp, replicated over tp
        "norm.bias": (Shard(0),),
    }
    for name, p in model.named_parameters():
        assert p.placements == expected[name], name
        want = partition_spec(p.device_mesh, p.placements, p.dim())
        assert get_sharding_spec(p.to_local()) == _marked(mesh, tuple(p.shape), want), name
    # Root mesh axes: 0 is dp, 1 is tp; rows over dp then tp for the column-wise weight.
    assert partition_spec(model.w2.weight.device_mesh, model.w2.weight.placements, 2) == (0, 1)
    assert partition_spec(model.w1.weight.device_mesh, model.w1.weight.placements, 2) == ((0, 1), None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    for step in range(2):
        x = torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(step))
        loss = model(_on_xla(mesh, x)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = ref(x).pow(2).mean()
        ref_loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        spmdtorch.sync()
        torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6, msg=f"step {step}")
    for name, p in model.named_parameters():
        torch.testing.assert_close(
            p.full_tensor().detach().cpu(), ref.get_parameter(name).detach(), rtol=1e-4, atol=1e-5, msg=name
        )


def test_hsdp_mesh_replicates_over_its_first_dim(devices8):
    mesh = init_device_mesh("xla", (2, 4), mesh_dim_names=("replicate", "shard"))
    model = fully_shard(nn.Linear(16, 8), mesh=mesh)
    assert model.weight.placements == (Replicate(), Shard(0))
    assert get_sharding_spec(model.weight.to_local()) == _marked(mesh, (8, 16), ("shard", None))
    x = torch.randn(8, 16)
    torch.testing.assert_close(
        model(x.to("xla")).detach().cpu(), F.linear(x, *(p.full_tensor().cpu() for p in (model.weight, model.bias)))
    )


# (result shape) of every all-reduce / reduce-scatter of an optimized HLO module, the root instruction included.
_REDUCTION = re.compile(r"^\s*(?:ROOT )?%\S+ = (.+?) (?:all-reduce|reduce-scatter)(?:-start)?\(", re.M)


def test_accumulation_with_fully_shard_has_one_reduction(dp_mesh):
    torch.manual_seed(4)
    ref = Net()
    model = _shard(copy.deepcopy(ref), dp_mesh)

    def loss_fn(m, x, y):
        return F.mse_loss(m(x), y)

    reductions = {}
    for n in (1, 4):
        batches = [_batch(dp_mesh, 30 + i, rows=32) for i in range(n)]
        with pytest.warns(UserWarning, match="accumulate_gradients"):
            model.set_requires_gradient_sync(False)
        assert model.layers[0].fsdp_setting("requires_gradient_sync") is False  # recurse=True
        loss = accumulate_gradients(model, loss_fn, [(x.to("xla"), y.to("xla")) for x, y in batches])
        hlo = debug.get_hlo_text([p.grad.to_local() for p in model.parameters()], optimized=True)
        reductions[n] = sorted(_REDUCTION.findall(hlo))
        ref_loss = sum(F.mse_loss(ref(x), y) / n for x, y in batches)
        ref_loss.backward()
        torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
        for name, p in model.named_parameters():
            assert isinstance(p.grad, XlaDTensor) and p.grad.placements == (Shard(0),), name
            torch.testing.assert_close(p.grad.full_tensor().cpu(), ref.get_parameter(name).grad, rtol=1e-4, atol=1e-6)
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    assert reductions[1] and reductions[4] == reductions[1], reductions


def test_fsdp_module_methods_and_named_errors(dp_mesh):
    model = _shard(Net(), dp_mesh, reshard_after_forward=True)
    model.reshard()
    assert model.unshard() is None
    model.unshard(async_op=True).wait()
    model.set_reshard_after_forward(False)
    model.set_reshard_after_backward(False)
    model.set_modules_to_forward_prefetch([model.layers[1]])
    model.set_requires_all_reduce(False)
    assert model.fsdp_setting("reshard_after_forward") is False
    assert model.layers[1].fsdp_setting("reshard_after_backward") is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.set_requires_gradient_sync(True)  # the default: no warning
    with pytest.raises(UnsupportedFSDPError, match="no per-rank communication"):
        model.set_custom_all_gather(object())
    with pytest.raises(UnsupportedFSDPError, match="scale the loss"):
        model.set_gradient_divide_factor(2.0)
    with pytest.raises(DTensorError, match="requires_gradient_sync must be a bool"):
        model.set_requires_gradient_sync("no")
    with pytest.raises(NoRankError, match=r"spmdtorch\.dtensor\.fully_shard"):
        torch_fully_shard(nn.Linear(4, 4), mesh=dp_mesh)
    with pytest.raises(UnsupportedFSDPError, match="CPUOffloadPolicy"):
        fully_shard(nn.Linear(4, 4), mesh=dp_mesh, offload_policy=CPUOffloadPolicy())
    with pytest.raises(DTensorError, match="reshard_after_forward=3"):
        fully_shard(nn.Linear(4, 4), mesh=dp_mesh, reshard_after_forward=3)
    cube = init_device_mesh("xla", (2, 2, 2), mesh_dim_names=("a", "b", "c"))
    with pytest.raises(DTensorError, match="1-D mesh"):
        fully_shard(nn.Linear(4, 4), mesh=cube)
    with pytest.raises(UnsupportedFSDPError, match="shard_placement_fn"):
        fully_shard(nn.Linear(4, 4), mesh=dp_mesh, shard_placement_fn=lambda p: Replicate())
    assert fully_shard(nn.Linear(8, 4), mesh=dp_mesh, shard_placement_fn=lambda p: Shard(-1)).weight.placements == (
        Shard(1),
    )


def test_accumulation_over_a_tensor_parallel_model_on_the_whole_mesh(devices8):
    # Tensor parallel over a 1-D root mesh: its hooks' annotations span the mesh, and are left out inside the
    # per-device body of accumulate_gradients (where the mesh axes are manual); values as eager.
    mesh = init_device_mesh("xla", (8,), mesh_dim_names=("tp",))
    torch.manual_seed(5)
    ref = Block()
    model = parallelize_module(copy.deepcopy(ref).to("xla"), mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    batches = [torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(40 + i)) for i in range(2)]
    loss = accumulate_gradients(model, lambda m, x: m(x).pow(2).mean(), [x.to("xla") for x in batches])
    ref_loss = sum(ref(x).pow(2).mean() / 2 for x in batches)
    ref_loss.backward()
    torch.testing.assert_close(loss.cpu(), ref_loss.detach(), rtol=1e-5, atol=1e-6)
    assert model.w1.weight.grad.placements == (Shard(0),) and model.w2.weight.grad.placements == (Shard(1),)
    for name, p in model.named_parameters():  # the norm is not in the plan: plain xla parameters
        grad = p.grad.full_tensor() if isinstance(p.grad, XlaDTensor) else p.grad
        torch.testing.assert_close(grad.cpu(), ref.get_parameter(name).grad, rtol=1e-4, atol=1e-6, msg=name)
