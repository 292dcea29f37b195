"""Under compat, ``torch.compile(backend="openxla")`` and ``torch.ops.xla.dynamo_mark_sharding`` run on spmdtorch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

from spmdtorch.compat._dynamo import DynamoMarkShardingError
from spmdtorch.sharding import get_sharding_spec


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


@pytest.mark.parametrize("backend", ["openxla", "openxla_eval"])
def test_openxla_matches_eager_cpu(backend):
    import torch_xla  # noqa: F401  (compat's torch_xla: its dynamo bridge is spmdtorch's backend)

    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    counter = torch._dynamo.testing.CompileCounterWithBackend(backend)
    fast = torch.compile(xla, backend=counter)
    for _ in range(2):
        x = torch.randn(8, 16)
        torch.testing.assert_close(fast(x.to("xla")).cpu(), cpu(x), rtol=1e-5, atol=1e-5)
    assert counter.frame_count == 1


def test_openxla_training_grads_match_eager_cpu():
    import torch_xla  # noqa: F401

    cpu = _mlp()
    xla = copy.deepcopy(cpu).to("xla")
    fast = torch.compile(xla, backend="openxla")
    x = torch.randn(8, 16)
    fast(x.to("xla")).square().mean().backward()
    cpu(x).square().mean().backward()
    for p_xla, p_cpu in zip(xla.parameters(), cpu.parameters(), strict=True):
        torch.testing.assert_close(p_xla.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-5)


def test_dynamo_mark_sharding_op_eager_and_in_graph():
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    n = xr.global_runtime_device_count()
    mesh = xs.Mesh(list(range(n)), (n, 1), ("a", "b"))
    args = (mesh.device_ids.tolist(), list(mesh.mesh_shape), str(mesh.axis_names), "(0, None)")

    w = torch.randn(8, 4).to("xla")
    assert torch.ops.xla.dynamo_mark_sharding(w, *args) is w
    assert get_sharding_spec(w) == "{devices=[8,1]0,1,2,3,4,5,6,7}"

    def fn(t):
        u = t * 2
        torch.ops.xla.dynamo_mark_sharding(u, *args)
        return u + 1, u

    x = torch.randn(8, 4)
    out, u = torch.compile(fn, backend="openxla_eval")(x.to("xla"))
    torch.testing.assert_close(out.cpu(), x * 2 + 1)
    assert get_sharding_spec(u) == "{devices=[8,1]0,1,2,3,4,5,6,7}"

    cpu = torch.ones(2)  # no meaning on CPU: returned unchanged
    assert torch.ops.xla.dynamo_mark_sharding(cpu, *args) is cpu


def test_dynamo_mark_sharding_bad_spec_is_named():
    import torch_xla  # noqa: F401

    w = torch.randn(8, 4).to("xla")
    with pytest.raises(DynamoMarkShardingError, match="partition_spec"):
        torch.ops.xla.dynamo_mark_sharding(w, list(range(8)), [8, 1], "('a', 'b')", "(0, None")


def test_bridge_helpers_resolve():
    from torch_xla.core import dynamo_bridge

    assert dynamo_bridge.is_xla_tensor(torch.ones(1).to("xla"))
    assert not dynamo_bridge.is_xla_tensor(torch.ones(1))


def test_openxla_names_point_at_spmdtorch_until_uninstall(compat):
    import torch_xla  # noqa: F401
    from torch._dynamo.backends.registry import lookup_backend

    import spmdtorch.dynamo

    assert lookup_backend("openxla") is spmdtorch.dynamo.openxla_backend
    assert lookup_backend("openxla_eval") is spmdtorch.dynamo.openxla_backend
    compat.uninstall()
    assert (
        lookup_backend("openxla") is not spmdtorch.dynamo.openxla_backend
    )  # torch's own (AOTAutograd + torch_xla) again
    compat.install()
    assert lookup_backend("openxla") is spmdtorch.dynamo.openxla_backend


def test_import_torch_xla_does_not_import_dynamo():
    import subprocess
    import sys

    code = (
        "import sys, spmdtorch.compat; spmdtorch.compat.install(); import torch_xla, torch_xla.core.dynamo_bridge; "
        "print('torch._dynamo' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert res.stdout.strip().splitlines()[-1] == "False"
