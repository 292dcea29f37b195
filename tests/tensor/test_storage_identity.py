"""``untyped_storage()``/``data_ptr()`` of xla tensors identify their storage.

Libraries detect shared tensors by ``untyped_storage().data_ptr()``: two xla
tensors must share it exactly when they share a storage (views of one base,
tied weights), as CPU tensors do. Each case is checked against the same
program on CPU tensors, whose pointers are real.
"""

from __future__ import annotations

import pytest
import safetensors.torch as st_torch
import torch

import spmdtorch


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _sharing(tensors: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """The groups of names whose tensors share a storage (by ``untyped_storage().data_ptr()``)."""
    groups: dict[int, set[str]] = {}
    for name, t in tensors.items():
        groups.setdefault(_ptr(t), set()).add(name)
    return {frozenset(g) for g in groups.values()}


def _views(x: torch.Tensor) -> dict[str, torch.Tensor]:
    y = torch.zeros_like(x)  # another storage of the same size
    return {
        "x": x,
        "row": x[1],
        "t": x.t(),
        "flat": x.view(-1),
        "slice": x[:, 2:],
        "detach": x.detach(),
        "data": x.data,
        "y": y,
        "y_view": y.reshape(-1),
        "clone": x.clone(),
    }


@pytest.mark.parametrize("device", ["cpu", "xla"])
def test_pointers_are_nonzero(device):
    x = torch.ones(4, 6, device=device)
    assert _ptr(x) != 0
    assert x.data_ptr() != 0


def test_views_share_and_distinct_storages_differ_as_on_cpu():
    base = torch.arange(24.0).reshape(4, 6)
    assert _sharing(_views(base.to("xla"))) == _sharing(_views(base.clone()))


def test_view_offsets_and_storage_sizes_match_cpu():
    base = torch.arange(24.0).reshape(4, 6)
    for x in (base.clone(), base.to("xla")):
        v = x[1:, 2:]
        assert v.data_ptr() - x.data_ptr() == (6 + 2) * 4
        assert v.untyped_storage().nbytes() == 24 * 4
        assert v.untyped_storage().device.type in ("cpu", "meta")


def test_equal_size_parameters_are_not_aliases():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4)).to("xla")
    sd = model.state_dict()
    assert len({_ptr(t) for t in sd.values()}) == len(sd)
    # safetensors' own alias finder sees four separate tensors (it used to see one group per shape)
    assert sorted(sorted(g) for g in st_torch._find_shared_tensors(sd)) == [[k] for k in sorted(sd)]


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight
        self.other = torch.nn.Linear(4, 10, bias=False)  # same shape, not tied


def test_tied_weights_share_after_to_xla():
    model = _Tied().to("xla")
    sd = model.state_dict()
    assert _ptr(sd["emb.weight"]) == _ptr(sd["head.weight"])
    assert _ptr(sd["other.weight"]) != _ptr(sd["emb.weight"])
    shared = [sorted(g) for g in st_torch._find_shared_tensors(sd) if len(g) > 1]
    assert shared == [["emb.weight", "head.weight"]]


def test_identity_survives_in_place_ops_and_optimizer_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)).to("xla")
    before = {k: _ptr(v) for k, v in model.state_dict().items()}
    view = model[0].weight[0]
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.randn(3, 4, device="xla")).sum().backward()
        opt.step()
        opt.zero_grad()
        spmdtorch.sync()
    with torch.no_grad():
        model[1].bias.add_(1)
    assert {k: _ptr(v) for k, v in model.state_dict().items()} == before
    assert _ptr(view) == before["0.weight"]
    # optimizer state tensors are storages of their own
    state_ptrs = {_ptr(s["exp_avg"]) for s in opt.state.values()}
    assert len(state_ptrs) == 4 and not state_ptrs & set(before.values())


def test_data_assignment_moves_to_the_assigned_storage():
    for device in ("cpu", "xla"):
        p = torch.nn.Parameter(torch.zeros(3, device=device))
        q = torch.ones(3, device=device)
        old = _ptr(p)
        p.data = q
        assert _ptr(p) == _ptr(q) != old


def test_storage_ranges_never_overlap():
    tensors = [torch.zeros(n, device="xla") for n in (1, 1000, 5000, 3)]
    ranges = sorted((_ptr(t), _ptr(t) + t.untyped_storage().nbytes()) for t in tensors)
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end <= start


def test_same_stand_in_object_while_the_storage_lives():
    x = torch.zeros(2, 3, device="xla")
    assert x.untyped_storage() is x[0].untyped_storage()
    assert torch.multiprocessing.reductions.StorageWeakRef(x.untyped_storage()) == (
        torch.multiprocessing.reductions.StorageWeakRef(x.t().untyped_storage())
    )


def test_plain_cpu_storages_unchanged():
    x = torch.arange(6.0)
    s = x.untyped_storage()
    assert type(s) is torch.UntypedStorage and s.device.type == "cpu"
    assert s.data_ptr() == x.data_ptr()
    assert s.tolist() == list(x.numpy().view("uint8"))
