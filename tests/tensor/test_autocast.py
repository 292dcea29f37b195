"""torch.autocast("xla") on xla tensors: torch's op lists, float32 gradients, eager parity.

The reference is eager CPU torch under ``torch.autocast("cpu", dtype=bfloat16)``
for the ops whose lists agree (linear/matmul in bfloat16, softmax/losses in
float32): the same casts, so the same numbers up to bfloat16 accumulation order.
"""

from __future__ import annotations

import copy
import doctest

import torch
import torch.nn.functional as F

import spmdtorch.tensor.autocast as autocast_mod


def test_dtypes_follow_torch_lists(devices8):
    x = torch.randn(4, 8, device="xla")
    w = torch.randn(8, 8, device="xla")
    with torch.autocast("xla", dtype=torch.bfloat16):
        mm = x @ w
        lin = F.linear(x, w)
        soft = torch.softmax(mm, dim=-1)
        total = mm.sum()
        other = mm + 1  # not on any list: the input's dtype
        explicit = torch.softmax(mm, dim=-1, dtype=torch.float64)
    assert (mm.dtype, lin.dtype, soft.dtype, total.dtype, other.dtype) == (
        torch.bfloat16,
        torch.bfloat16,
        torch.float32,
        torch.float32,
        torch.bfloat16,
    )
    assert explicit.dtype == torch.float64
    # Outside the region nothing is cast.
    assert (x @ w).dtype == torch.float32
    with torch.autocast("xla", dtype=torch.float16):
        assert (x @ w).dtype == torch.float16
    with torch.autocast("xla", dtype=torch.bfloat16), torch.autocast("xla", enabled=False):
        assert (x @ w).dtype == torch.float32


def test_cpu_tensors_are_left_to_torch(devices8):
    a = torch.randn(2, 2)
    with torch.autocast("xla", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float32


def test_mlp_training_step_matches_eager_cpu_autocast(devices8):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = copy.deepcopy(ref).to("xla")
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref_loss = F.cross_entropy(ref(x), y)
    ref_loss.backward()
    with torch.autocast("xla", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x.to("xla")), y.to("xla"))
    loss.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-2, atol=1e-2)
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters()):
        assert p.grad.dtype == torch.float32, name
        torch.testing.assert_close(p.grad.cpu(), p_ref.grad, rtol=3e-2, atol=3e-2, msg=name)


def test_doctests(devices8):
    result = doctest.testmod(autocast_mod, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
