"""Attribute reads/writes and type queries on xla tensors skip the torch-function handler.

``XlaTensor.__torch_function__`` runs them at once (``xla_tensor._QUERIES``,
property ``__get__``/``__set__``): an optimizer step reads and writes
``p.grad`` and tests ``torch.is_complex(p)`` per parameter, and each round
trip through the handler cost a few microseconds of host time per step.
Results are compared with the same calls on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

import spmdtorch
from spmdtorch.tensor import xla_tensor


@pytest.fixture
def handler_calls(monkeypatch):
    """The names of the calls that reached the torch-function handler."""
    calls: list[str] = []
    real = xla_tensor.torch_function

    def counting(func, args, kwargs):
        calls.append(getattr(func, "__name__", str(func)))
        return real(func, args, kwargs)

    monkeypatch.setattr(xla_tensor, "torch_function", counting)
    return calls


def test_attribute_access_and_queries_skip_the_handler(handler_calls):
    cpu = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    xla = torch.nn.Parameter(cpu.detach().to("xla"))
    cpu.grad, xla.grad = torch.ones(2, 3), torch.ones(2, 3, device="xla")
    handler_calls.clear()
    for t in (cpu, xla):
        assert t.grad is not None
        assert t.shape == (2, 3) and t.dtype == torch.float32 and t.requires_grad and not t.is_sparse
        assert not torch.is_complex(t) and torch.is_floating_point(t) and not t.is_complex()
        assert t.dim() == 2 and t.size() == (2, 3) and t.size(1) == 3 and t.numel() == 6
        t.grad = None
        assert t.grad is None
    assert xla.device.type == "xla"
    assert handler_calls == []
    del xla.grad  # the property's __delete__ as well
    assert handler_calls == []


def test_calls_that_build_tensors_still_reach_the_handler(handler_calls):
    cpu = torch.arange(12.0).reshape(4, 3)
    xla = cpu.to("xla")
    torch.testing.assert_close(xla[[0, 2]].cpu(), cpu[[0, 2]])  # an index list: the handler makes it a host tensor
    assert "__getitem__" in handler_calls
    handler_calls.clear()
    torch.testing.assert_close(xla.mT.cpu(), cpu.mT)  # a property that runs an op (a transpose)
    assert handler_calls[0] == "__get__"


def test_flatten_context_reads_no_tensor_attribute(handler_calls):
    # TorchDynamo's guards flatten every xla input on every call of a compiled function.
    x = torch.ones(2, 3, device="xla", dtype=torch.bfloat16)
    handler_calls.clear()
    names, ctx = x.__tensor_flatten__()
    assert names == ["_meta"] and ctx.dtype == torch.bfloat16
    assert handler_calls == []


def _optimizer_handler_calls(n_layers: int, calls: list[str]) -> list[str]:
    """The handler calls of one lazy step's ``zero_grad()`` and AdamW ``step()``."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(n_layers)]).to("xla")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(4, 8, device="xla")
    seen: list[str] = []

    def step():
        with spmdtorch.step():
            calls.clear()
            opt.zero_grad()
            seen[:] = calls
            model(x).square().mean().backward()
            calls.clear()
            opt.step()
            seen.extend(calls)

    for _ in range(4):  # the optimizer's state and its fused path exist from the second step on
        step()
    return seen


def test_optimizer_handler_calls_do_not_grow_with_parameters(handler_calls):
    # zero_grad and AdamW read and write p.grad and test is_complex(p) per parameter:
    # through the handler those were ~9 calls per parameter (20 parameters: ~180 per step).
    assert _optimizer_handler_calls(10, handler_calls) == ["_fused_adamw_"]
