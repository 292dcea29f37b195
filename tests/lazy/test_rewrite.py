"""Graph rewrites at record time (spmdtorch.lazy.rewrite): same values, smaller programs.

The structure is pinned by what the recorded graph and its HLO contain
(deterministic counts); the values are compared with eager torch on CPU.
"""

from __future__ import annotations

import re

import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.lazy import executor
from spmdtorch.lazy.graph import LazyRef, Scalar
from spmdtorch.tensor.dispatch import read_value

aten = torch.ops.aten


def _node(t):
    value = read_value(t)
    assert isinstance(value, LazyRef), "expected a pending value"
    return value.node


def _param(*shape, seed=0):
    """A concrete xla tensor (a program input, as a parameter is) and its CPU twin."""
    cpu = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    x = cpu.to("xla")
    spmdtorch.sync()
    return x, cpu


def _count(hlo: str, op: str) -> int:
    return len(re.findall(rf"= \S+ {op}\(", hlo))


def test_views_of_a_program_input_are_one_node():
    w, _ = _param(4, 3)
    assert _node(w.t()) is _node(w.t())
    assert _node(w.transpose(0, 1)) is _node(w.transpose(0, 1))
    assert _node(w.t()) is not _node(w.transpose(0, 1))  # another op: not merged (XLA's CSE may)


def test_inverse_permutations_of_a_computed_value_fold_away():
    x, _ = _param(2, 3, 4)
    y = x * 2  # computed
    assert read_value(y.transpose(0, 2).transpose(2, 0)) is read_value(y)
    assert read_value(y.permute(2, 0, 1).permute(1, 2, 0)) is read_value(y)
    m = y[0] + 1
    assert read_value(m.t().t()) is read_value(m)
    # not inverse: a real permutation stays
    assert _node(y.permute(2, 0, 1).permute(2, 0, 1)).name is aten.permute.default


def test_products_read_through_transposes_of_computed_values():
    a, _ = _param(3, 5)
    b, _ = _param(3, 4, seed=1)
    ya, yb = a + 0, b + 0
    node = _node(ya.t() @ yb)  # mm(t(ya), yb)
    assert node.name == "mm_transposed"
    assert node.inputs[0] is read_value(ya)  # no transpose node in between
    # a transpose of a program input is left to the shared view node
    node = _node(b.t() @ a)  # mm(t(b), a): b is a program input
    assert node.name is aten.mm.default and node.inputs[0].node.name is aten.t.default


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_products_with_folded_transposes_match_eager(dtype):
    a, a_cpu = _param(6, 5)
    b, b_cpu = _param(6, 4, seed=1)
    c, c_cpu = _param(5, 4, seed=2)
    a, b, c = (t.to(dtype) for t in (a, b, c))
    a_cpu, b_cpu, c_cpu = (t.to(dtype) for t in (a_cpu, b_cpu, c_cpu))
    cases = {
        "ta": (lambda a, b, c: (a * 1).t() @ (b * 1)),
        "tb": (lambda a, b, c: (b * 1).t().t() @ (c * 1).t()),
        "ta_tb": (lambda a, b, c: (c * 1).t().mm((a * 1).t()).t()),
        "addmm": (lambda a, b, c: torch.addmm(c * 1, (a * 1).t(), (b * 1), beta=0.5, alpha=2.0)),
        "addmm_tb": (lambda a, b, c: torch.addmm(c * 1, (a * 1).t(), (b.t() * 1).t())),
    }
    for name, f in cases.items():
        got = f(a, b, c)
        want = f(a_cpu, b_cpu, c_cpu)
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got.cpu(), want, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("form", ["matmul", "F.linear"])
def test_linear_backward_reads_the_forward_transpose_of_the_weight(form):
    """torch's ``x @ W.t()`` backward computes mm(grad, t(t(W))) and mm(t(x), grad): the program
    transposes W once (shared with the forward), like jax.grad of x @ W.T. ``F.linear`` is
    one op each way (``ops/_linear.py``): its dots read W itself, no transpose at all."""
    w, w_cpu = _param(8, 6)
    w.requires_grad_(True)
    w_cpu.requires_grad_(True)
    x, x_cpu = _param(5, 6, seed=1)
    x = x * 1  # a computed activation
    x.requires_grad_(True)
    x_cpu = x_cpu.clone().requires_grad_(True)
    for ww, xx in ((w, x), (w_cpu, x_cpu)):
        y = xx @ ww.t() if form == "matmul" else torch.nn.functional.linear(xx, ww)
        (y**2).sum().backward()
    hlo = debug.get_hlo_text([w.grad, x.grad])
    # matmul: one transpose, the shared t(W); the backward products fold theirs into the dot.
    assert _count(hlo, "transpose") == (1 if form == "matmul" else 0), hlo
    assert _count(hlo, "dot") == 3
    torch.testing.assert_close(w.grad.cpu(), w_cpu.grad)
    torch.testing.assert_close(x.grad.cpu(), x_cpu.grad)


def _scalar_leaves() -> set:
    """Distinct runtime-scalar inputs of everything pending."""
    seen, scalars = set(), set()
    stack = [st.value.node for st in executor.pending_storages()]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for i in node.inputs:
            if type(i) is Scalar:
                scalars.add(id(i))
            elif type(i) is LazyRef:
                stack.append(i.node)
    return scalars


def test_equal_optimizer_scalars_are_one_program_input():
    """AdamW passes the same hyper-parameters once per parameter: equal numbers in one
    op are one input (one packed slot), so the program's inputs do not grow with the
    number of parameters and XLA compiles one update kernel for same-shaped parameters."""

    def distinct_scalars(n_params):
        params = [torch.nn.Parameter(torch.full((4, 4), float(i), device="xla")) for i in range(n_params)]
        opt = torch.optim.AdamW(params, lr=1e-2)
        spmdtorch.sync()
        for p in params:
            p.grad = torch.ones(4, 4, device="xla")
        opt.step()
        n = len(_scalar_leaves())
        spmdtorch.sync()
        return n

    assert distinct_scalars(6) == distinct_scalars(2)


def test_lazy_adamw_compiles_twice_and_matches_eager():
    """Interned scalars must not turn a coincidence between values into a recompile."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model.load_state_dict(ref.state_dict())
    model.to("xla")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    x_cpu = torch.randn(4, 6)
    x = x_cpu.to("xla")
    before = debug.counter_value("UncachedCompile")
    for _ in range(5):
        for m, opt, xx in ((ref, opts[0], x_cpu), (model, opts[1], x)):
            opt.zero_grad()
            m(xx).square().mean().backward()
            opt.step()
        spmdtorch.sync()
    assert debug.counter_value("UncachedCompile") - before <= 2
    for (name, p_ref), p in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(p.cpu(), p_ref.detach(), msg=lambda m, name=name: f"{name}: {m}")
