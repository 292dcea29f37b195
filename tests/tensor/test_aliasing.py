"""Views and in-place ops keep eager aliasing semantics."""

import pytest
import torch


def both(fn):
    """Run ``fn`` on an eager CPU tensor and on its xla copy; compare all results."""
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    eager = fn(base.clone())
    lazy = fn(base.clone().to("xla"))
    for e, l in zip(eager, lazy):
        torch.testing.assert_close(l.cpu(), e)


CASES = {
    "select_add_": lambda x: (x[0].add_(1), x),
    "slice_mul_": lambda x: (x[:, 1:4].mul_(2), x),
    "step_slice": lambda x: (x[::2, ::3].sub_(100), x),
    "view_inplace": lambda x: (x.view(6, 4).add_(1), x),
    "transpose_inplace": lambda x: (x.t()[1].fill_(-1), x),
    "nested_views": lambda x: (x[1:].t()[2:4][0].mul_(10), x),
    "setitem_scalar": lambda x: (x.__setitem__((slice(None), 0), 5.0), x)[1:],
    "setitem_tensor": lambda x: (x.__setitem__(1, torch.arange(6.0, device=x.device)), x)[1:],
    "detach_alias": lambda x: (x.detach().add_(3), x),
    "data_alias": lambda x: (x.data.mul_(2), x),
    "view_sees_base_update": lambda x: (lambda v: (x.add_(1), v))(x.view(-1))[1:] + (x,),
    "unsqueeze_squeeze": lambda x: (x.unsqueeze(0).squeeze(0)[2].zero_(), x),
    "split_chunks": lambda x: (x.split(2)[1].add_(7), x),
    "unbind": lambda x: (x.unbind(1)[3].neg_(), x),
    "diagonal": lambda x: (x.diagonal().fill_(0.5), x),
    "copy_into_view": lambda x: (x[2].copy_(torch.ones(6, device=x.device)), x),
    "inplace_then_view_read": lambda x: (x.mul_(3), x[1, 2:5]),
    "t_inplace": lambda x: (x.t_(), x),
    "out_variant": lambda x: (torch.add(x[1], 1, out=x[0]), x),
    "out_resize": lambda x: (torch.mul(x, 2, out=torch.empty(0, device=x.device)), x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_alias_case_matches_eager(name):
    both(CASES[name])


def test_view_of_stale_cache_is_recomputed():
    x = torch.zeros(3, 3).to("xla")
    row = x[1]
    assert row.sum().item() == 0.0
    x.fill_(2.0)
    assert row.sum().item() == 6.0
    row.add_(1)
    torch.testing.assert_close(x.cpu(), torch.tensor([[2.0] * 3, [3.0] * 3, [2.0] * 3]))


def test_param_data_assignment_rebinds_storage():
    p = torch.nn.Parameter(torch.zeros(3).to("xla"))
    p.data = torch.ones(3).to("xla")
    torch.testing.assert_close(p.cpu(), torch.ones(3))
    with pytest.raises(RuntimeError, match="move it first"):
        p.data = torch.ones(3)
