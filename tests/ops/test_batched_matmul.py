"""``torch.matmul`` / ``@`` of xla tensors with two or more batch dims keep them (spmdtorch::batched_matmul).

Eager attention's (B, H, L, D) @ (B, H, D, S) would otherwise become a
``bmm`` over merged (B*H): with heads sharded the partitioner gathers both
operands. Forward and backward are compared with eager CPU; the sharded
case also checks that the partitioned program gathers nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.partition import mark_sharding


def _compare(shape_a, shape_b, call, dtype=torch.float32, prepare=None):
    torch.manual_seed(0)
    a = torch.randn(shape_a, dtype=dtype, requires_grad=True)
    b = torch.randn(shape_b, dtype=dtype, requires_grad=True)
    ref = call(a, b)
    ref.float().square().sum().backward()
    ax, bx = (t.detach().to("xla") for t in (a, b))
    if prepare is not None:
        ax, bx = prepare(ax), prepare(bx)
    ax.requires_grad_()
    bx.requires_grad_()
    out = call(ax, bx)
    out.float().square().sum().backward()
    tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(out.cpu(), ref, **tol)
    torch.testing.assert_close(ax.grad.cpu(), a.grad, **tol)
    torch.testing.assert_close(bx.grad.cpu(), b.grad, **tol)
    return out


CALLS = {
    "torch.matmul": torch.matmul,
    "@": lambda a, b: a @ b,
    "Tensor.matmul": lambda a, b: a.matmul(b),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
@pytest.mark.parametrize(("shape_a", "shape_b"), [((2, 3, 5, 4), (2, 3, 4, 6)), ((2, 2, 3, 5, 4), (2, 2, 3, 4, 1))])
def test_batched_dims_kept_equal_eager(call, shape_a, shape_b):
    _compare(shape_a, shape_b, call)
    a = torch.randn(shape_a).to("xla")
    b = torch.randn(shape_b).to("xla")
    hlo = debug.get_stablehlo([call(a, b)])
    assert hlo.count("stablehlo.dot_general") == 1 and "batching_dims = [0, 1" in hlo


@pytest.mark.parametrize(
    ("shape_a", "shape_b"),
    [
        ((2, 3, 5, 4), (3, 4, 6)),  # broadcast batch dims: torch's path
        ((2, 1, 5, 4), (2, 3, 4, 6)),
        ((3, 5, 4), (3, 4, 6)),  # one batch dim: bmm already keeps it
        ((5, 4), (2, 3, 4, 6)),
        ((2, 3, 5, 4), (4,)),
    ],
)
def test_other_shapes_take_torchs_path(shape_a, shape_b):
    _compare(shape_a, shape_b, torch.matmul)


def test_bfloat16_and_autocast():
    _compare((2, 3, 5, 8), (2, 3, 8, 4), torch.matmul, dtype=torch.bfloat16)
    a, b = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 8, 4)
    with torch.autocast("xla", dtype=torch.bfloat16):
        out = a.to("xla") @ b.to("xla")
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.cpu().float(), a @ b, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("dim", [0, 1], ids=["batch", "heads"])
def test_sharded_heads_gather_nothing(devices8, dim):
    mesh = Mesh(np.arange(8), (8,), ("tp",))
    spec = tuple("tp" if d == dim else None for d in range(4))
    shape_a = [2, 2, 16, 8]
    shape_b = [2, 2, 8, 16]
    shape_a[dim] = shape_b[dim] = 8
    _compare(shape_a, shape_b, torch.matmul, prepare=lambda t: mark_sharding(t, mesh, spec))
    a = mark_sharding(torch.randn(shape_a).to("xla"), mesh, spec)
    b = mark_sharding(torch.randn(shape_b).to("xla"), mesh, spec)
    spmdtorch.sync()
    (a @ b).cpu()
    program = debug.last_executable().as_text()
    assert "all-gather" not in program and "all-to-all" not in program


def test_cpu_tensors_untouched():
    a, b = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 4, 6)
    torch.testing.assert_close(torch.ops.spmdtorch.batched_matmul(a, b), torch.matmul(a, b))
    assert torch.matmul(a, b).grad_fn is None


@pytest.mark.parametrize("op", ["matmul", "sdpa"])
def test_overrides_step_aside_under_non_reentrant_checkpoint(op):
    """torch.utils.checkpoint recomputes inside backward, on torch's path: the forward must save the same tensors."""
    from torch.utils.checkpoint import checkpoint

    def block(q, k, v):
        if op == "matmul":
            return ((q @ k.transpose(-1, -2)).softmax(-1) @ v).sum()
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).sum()

    gen = torch.Generator().manual_seed(0)
    cpu = [torch.randn(2, 4, 16, 8, generator=gen, requires_grad=True) for _ in range(3)]
    xla = [t.detach().to("xla").requires_grad_() for t in cpu]
    block(*cpu).backward()
    loss = checkpoint(block, *xla, use_reentrant=False)
    loss.backward()
    torch.testing.assert_close(loss.cpu(), block(*[t.detach() for t in cpu]), rtol=1e-5, atol=1e-5)
    for a, b in zip(xla, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)
