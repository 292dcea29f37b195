"""``XlaTensor._mk``: the (shape, stride, offset, dtype) an XlaTensor stores for the shape cache.

The recorder keys torch's meta results by each argument's ``_mk`` instead of
asking torch for the metadata per op, so ``_mk`` must always equal what torch
says, including after every op that changes a tensor's metadata in place. A
stale ``_mk`` would make an op reuse the output shapes of another layout:
each test below first warms the cache with the old layout, then checks the
op on the new layout against eager CPU torch.
"""

from __future__ import annotations

import pytest
import torch

from spmdtorch.tensor import XlaTensor
from spmdtorch.tensor.xla_tensor import forget_meta_key


def _torch_meta(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def _check(t: XlaTensor) -> None:
    assert t._mk == _torch_meta(t)


def _same(got: torch.Tensor, want: torch.Tensor, *, view: bool = False) -> None:
    """Same shape and values (and strides for a view; computed results are always contiguous on xla)."""
    assert tuple(got.shape) == tuple(want.shape)
    if view:
        assert (got.stride(), got.storage_offset()) == (want.stride(), want.storage_offset())
    torch.testing.assert_close(got.cpu(), want)


def test_every_new_tensor_stores_torch_metadata():
    x = torch.randn(4, 6).to("xla")
    _check(x)
    outs = [
        x * 2,
        x.t(),
        x[1:3, ::2],
        x.detach(),
        x.view(2, 12),
        x.unsqueeze(0).expand(3, 4, 6),
        x.as_strided((2, 2), (1, 6), 3),
        x.to(torch.float64),
        torch.zeros(2, 3, device="xla"),
    ]
    outs += list(x.split(2, dim=1)) + list(torch.var_mean(x, 0))
    for t in outs:
        _check(t)
    lin = torch.nn.Linear(3, 4).to("xla")  # parameters swapped in place (torch.utils.swap_tensors)
    _check(lin.weight)


@pytest.mark.parametrize(
    "shape, change",
    [
        ((3, 4), lambda a: a.t_()),
        ((3, 4), lambda a: a.transpose_(0, 1)),
        ((3, 4), lambda a: a.unsqueeze_(1)),
        ((3, 4), lambda a: a.as_strided_((2, 3), (1, 3), 1)),
        ((1, 3, 4), lambda a: a.squeeze_()),
    ],
    ids=["t_", "transpose_", "unsqueeze_", "as_strided_", "squeeze_"],
)
def test_inplace_metadata_changes_update_the_key(shape, change):
    b = torch.arange(12.0).reshape(shape)
    a = b.to("xla")
    _same(a.sum(0), b.sum(0))  # warm the cache with the old layout
    _same(a * 2, b * 2)
    _same(a.unsqueeze(0), b.unsqueeze(0), view=True)
    change(a)
    change(b)
    _check(a)
    _same(a.sum(0), b.sum(0))
    _same(a * 2, b * 2)
    _same(a.unsqueeze(0), b.unsqueeze(0), view=True)


def test_set_resize_and_data_setter_update_the_key():
    x, y = torch.randn(3, 4), torch.randn(2, 6)
    a = x.to("xla")
    a.sum(0)
    a.set_(y.to("xla"))
    _check(a)
    _same(a.sum(0), y.sum(0))

    p = torch.randn(3, 4).to("xla")
    p.sum(0)
    p.data = y.to("xla")
    _check(p)
    _same(p.sum(0), y.sum(0))

    r = torch.randn(3, 4).to("xla")
    r.sum(0)
    r.resize_(2, 6)  # new contents are unspecified: compare layouts only
    _check(r)
    assert tuple(r.sum(0).shape) == (6,)


def test_out_argument_resized_updates_the_key():
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    o = torch.empty(0, device="xla")
    o.sum(0)
    torch.add(x.to("xla"), y.to("xla"), out=o)
    _check(o)
    _same(o.sum(0), (x + y).sum(0))


def test_a_tensor_without_a_stored_key_reads_it_from_torch():
    x = torch.randn(3, 4).to("xla").t()
    forget_meta_key(x)
    assert "_mk" not in x.__dict__
    _check(x)  # computed on first read, then stored
    assert x.__dict__["_mk"] == _torch_meta(x)
    _same(x.sum(0), x.cpu().sum(0))


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t[0],  # shape (4,), stride (1,), offset 0
        lambda t: t[1],  # same shape and stride, offset 4
        lambda t: t.t()[0],  # same shape, stride (4,)
        lambda t: t[0].to(torch.float64),  # same shape and stride, another dtype
        lambda t: t[:2].reshape(8)[:4],  # same shape, stride and offset as t[0]
    ],
    ids=["row0", "row1-offset", "col0-stride", "float64", "reshaped"],
)
def test_each_part_of_the_key_separates_layouts(make):
    """Views and ops on arguments that differ only in stride, offset or dtype give eager's results."""
    base = torch.arange(16.0).reshape(4, 4)
    xla = base.to("xla")
    for m in (lambda t: t[0], lambda t: t[1], lambda t: t.t()[0], lambda t: t[0].to(torch.float64)):
        m(xla).unsqueeze(1).cpu()  # warm the caches with the other layouts
    got, want = make(xla), make(base)
    assert got._mk == _torch_meta(want)
    _same(got.unsqueeze(1), want.unsqueeze(1), view=True)
    _same(got.unsqueeze(1).expand(4, 2), want.unsqueeze(1).expand(4, 2), view=True)
    _same(got * 2, want * 2)
    _same(got.view(2, 2) if got.is_contiguous() else got.reshape(2, 2), want.reshape(2, 2))


@pytest.mark.parametrize(
    "args",
    [((2, 6),), ([2, 6],), ([2, -1],), ((-1,),)],
    ids=["tuple", "list", "list-infer", "flat"],
)
def test_view_arguments_as_ints_and_lists(args):
    base = torch.arange(12.0).reshape(3, 4)
    _same(base.to("xla").view(*args), base.view(*args), view=True)
