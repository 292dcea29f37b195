"""Devices inside ``torch.compile(fn, backend="spmdtorch")``: what the traced Python sees, checked against eager CPU.

Dynamo traces an xla tensor as a ``meta`` fake (torch has no "xla" device guard
without torch_xla); spmdtorch.dynamo makes those fakes read as xla to the
user's Python, and runs "xla" device arguments of the traced calls on the fakes'
device, so ``t.device``, ``device="xla"`` and ``.to("xla")`` behave as in eager.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch._dynamo
import torch._dynamo.testing

import spmdtorch

# Importing it wraps Dynamo's tracing. torch.compile(backend="spmdtorch") imports it when it looks the name
# up; CompileCounterWithBackend looks its backend up only after the first trace, hence the import here.
import spmdtorch.dynamo  # noqa: F401
from spmdtorch.tensor.dispatch import DeviceMismatchError


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled(fn, **kwargs):
    counter = torch._dynamo.testing.CompileCounterWithBackend("spmdtorch")
    return torch.compile(fn, backend=counter, **kwargs), counter


def test_device_reads_xla_while_tracing_and_picks_the_eager_branch():
    seen = []

    def fn(a):
        seen.append((a.device.type, str(a.device), a.device == torch.device("xla", 0), a.is_cpu))
        if a.device.type == "xla":
            return a * 2
        return a * 3

    x = torch.randn(5)
    fast, counter = _compiled(fn, fullgraph=True)
    out = fast(x.to("xla"))
    assert seen == [("xla", "xla:0", True, False)]  # traced once, as eager would see it
    torch.testing.assert_close(out.cpu(), x * 2)
    assert counter.frame_count == 1


def test_device_of_intermediates_and_of_cpu_tensors_is_what_eager_reports():
    seen = []

    def fn(a, b):
        c = (a + 1).sum(0)
        seen.append((c.device.type, b.device.type, a.cpu().device.type))
        return c

    fast, _ = _compiled(fn, fullgraph=True)
    fast(torch.ones(2, 3).to("xla"), torch.ones(3))
    assert seen == [("xla", "cpu", "cpu")]


@pytest.mark.parametrize("spelling", ["xla", "xla:0", torch.device("xla"), torch.device("xla", 0)])
def test_factories_with_device_xla_inside_the_function(spelling):
    def fn(a):
        return a * torch.arange(4.0, device=spelling) + torch.ones(4, device=spelling)

    x = torch.randn(4)
    fast, counter = _compiled(fn, fullgraph=True)
    out = fast(x.to("xla"))
    assert out.device == torch.device("xla", 0)
    torch.testing.assert_close(out.cpu(), x * torch.arange(4.0) + 1)
    assert counter.frame_count == 1


def test_factory_with_device_of_an_input():
    def fn(a):
        return a + torch.full(a.shape, 2.0, device=a.device) + torch.zeros_like(a)

    x = torch.randn(3, 2)
    fast, _ = _compiled(fn, fullgraph=True)
    out = fast(x.to("xla"))
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), x + 2)


def test_to_xla_inside_the_function_mixes_cpu_and_xla_inputs():
    def fn(a, b):
        return (a @ b.to("xla")).relu(), b.to(a.device).sum()

    a, b = torch.randn(3, 4), torch.randn(4, 2)
    fast, counter = _compiled(fn, fullgraph=True)
    out, total = fast(a.to("xla"), b)
    assert out.device.type == "xla" and total.device.type == "xla"
    torch.testing.assert_close(out.cpu(), (a @ b).relu())
    torch.testing.assert_close(total.cpu(), b.sum())
    assert counter.frame_count == 1


def test_function_of_cpu_tensors_that_moves_them_to_xla():
    def fn(b):
        return torch.sin(b.to("xla")) * 2

    b = torch.randn(6)
    fast, _ = _compiled(fn, fullgraph=True)
    out = fast(b)
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), torch.sin(b) * 2)


def test_gradient_flows_through_to_xla_back_to_the_cpu_leaf():
    def fn(a, b):
        return (a * b.to("xla")).square().sum()

    a, b = torch.randn(4), torch.randn(4)
    aa = a.to("xla").requires_grad_(True)
    bb = b.clone().requires_grad_(True)
    fast, _ = _compiled(fn)
    fast(aa, bb).backward()
    ac, bc = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    (ac * bc).square().sum().backward()
    assert bb.grad.device.type == "cpu"
    torch.testing.assert_close(aa.grad.cpu(), ac.grad)
    torch.testing.assert_close(bb.grad, bc.grad)


def test_cpu_result_inside_the_function():
    def fn(a):
        return a.cpu() + torch.ones(3)

    x = torch.randn(3)
    fast, _ = _compiled(fn, fullgraph=True)
    out = fast(x.to("xla"))
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, x + 1)


def test_zero_dim_cpu_tensor_with_xla_tensor_works_as_in_eager():
    def fn(a, s):
        return a * s + s

    x, s = torch.randn(4), torch.tensor(3.0)
    fast, _ = _compiled(fn, fullgraph=True)
    out = fast(x.to("xla"), s)
    assert out.device.type == "xla"
    torch.testing.assert_close(out.cpu(), x * 3 + 3)


def test_xla_and_non_scalar_cpu_tensor_raise_torchs_device_mismatch_naming_xla():
    x, c = torch.randn(4).to("xla"), torch.randn(4)
    with pytest.raises(DeviceMismatchError, match="xla:0 and cpu"):
        x + c  # eager
    fast, _ = _compiled(lambda a, b: a + b)
    # As torch.compile reports cuda and cpu mixed in one call: Dynamo's TorchRuntimeError.
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match="Tensor device mismatch") as info:
        fast(x, c)
    assert "xla:0 and cpu" in str(info.value)
    assert "meta and" not in str(info.value) and "and meta" not in str(info.value)


def test_backend_by_name_alone_makes_devices_read_xla_from_the_first_trace():
    code = (
        "import torch, spmdtorch\n"
        "fn = torch.compile(lambda a: a * 2 if a.device.type == 'xla' else a * 3, backend='spmdtorch')\n"
        "print(fn(torch.ones(2).to('xla')).cpu().tolist())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert res.stdout.strip() == "[2.0, 2.0]"


def test_a_trace_without_xla_tensors_is_untouched():
    seen = []

    def fn(a):
        seen.append(a.device.type)
        return torch.empty(3, device=a.device) if a.device.type == "meta" else a + 1

    fast, _ = _compiled(fn)
    assert fast(torch.empty(3, device="meta")).device.type == "meta"
    torch.testing.assert_close(fast(torch.ones(3)), torch.full((3,), 2.0))
    assert seen == ["meta", "cpu"]
