"""The xla device: factories, transfers, dtypes, printing, errors."""

import io

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.tensor import XlaTensor

XLA = torch.device("xla", 0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(2, 3, device="xla"),
        lambda: torch.ones(2, 3, device="xla"),
        lambda: torch.full((2, 3), 7.5, device="xla"),
        lambda: torch.empty(2, 3, device="xla"),
        lambda: torch.arange(6, device="xla"),
        lambda: torch.arange(0, 3, 0.5, device="xla"),
        lambda: torch.randn(2, 3, device="xla"),
        lambda: torch.rand(2, 3, device="xla"),
        lambda: torch.randint(0, 10, (2, 3), device="xla"),
        lambda: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="xla"),
        lambda: torch.eye(3, device="xla"),
        lambda: torch.zeros(2, 3, device=spmdtorch.device()),
    ],
)
def test_factories_create_xla_tensors(make):
    t = make()
    assert isinstance(t, XlaTensor)
    assert t.device == XLA
    cpu = t.cpu()
    assert cpu.device.type == "cpu"
    assert cpu.dtype == t.dtype and cpu.shape == t.shape


def test_factory_values_match_torch():
    torch.testing.assert_close(torch.arange(0, 3, 0.5, device="xla").cpu(), torch.arange(0, 3, 0.5))
    torch.testing.assert_close(torch.full((2, 2), 7.5, device="xla").cpu(), torch.full((2, 2), 7.5))
    torch.testing.assert_close(torch.eye(3, device="xla").cpu(), torch.eye(3))
    r = torch.randint(3, 10, (1000,), device="xla").cpu()
    assert r.dtype == torch.int64 and int(r.min()) >= 3 and int(r.max()) < 10
    u = torch.rand(10000, device="xla").cpu()
    assert 0 <= float(u.min()) and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.02


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool, torch.float64]
)
def test_dtypes_report_torch_dtype(dtype):
    src = (torch.arange(6).reshape(2, 3) % 2).to(dtype)
    x = src.to("xla")
    assert x.dtype == dtype
    y = x.clone()
    assert y.dtype == dtype
    torch.testing.assert_close(y.cpu(), src)
    assert (x + x).dtype == (src + src).dtype


def test_integer_promotion_matches_eager():
    a = torch.tensor([1, 2, 3])
    x = a.to("xla")
    assert (x * 2).dtype == torch.int64
    assert (x / 2).dtype == torch.float32
    torch.testing.assert_close((x / 2).cpu(), a / 2)
    torch.testing.assert_close((x // 2).cpu(), a // 2)


def test_to_and_cpu_roundtrip_preserve_values():
    src = torch.randn(3, 4)
    x = src.to("xla")
    torch.testing.assert_close(x.cpu(), src)
    assert x.to("xla") is x
    torch.testing.assert_close(src.to("xla", torch.bfloat16).cpu(), src.to(torch.bfloat16))


def test_cpu_copy_is_independent_of_device_data():
    x = torch.ones(3).to("xla")
    c = x.cpu()
    c += 5
    torch.testing.assert_close(x.cpu(), torch.ones(3))
    src = torch.ones(3)
    y = src.to("xla")
    src += 1
    torch.testing.assert_close(y.cpu(), torch.ones(3))


def test_module_to_xla():
    m = torch.nn.Linear(3, 2)
    w = m.weight.detach().clone()
    m.to("xla")
    assert isinstance(m.weight, torch.nn.Parameter) or getattr(m.weight, "_is_param", False)
    assert isinstance(m.weight, XlaTensor) and m.weight.requires_grad
    assert m.weight.device == XLA
    torch.testing.assert_close(m.weight.cpu(), w)


def test_numpy_errors_until_cpu():
    x = torch.ones(2, device="xla")
    with pytest.raises(TypeError, match=r"can't convert xla:0 device type tensor to numpy.*cpu\(\)"):
        x.numpy()
    np.testing.assert_array_equal(x.cpu().numpy(), np.ones(2, np.float32))


def test_item_tolist_bool():
    x = torch.tensor([1.5, 2.5], device="xla")
    assert x.sum().item() == 4.0
    assert x.tolist() == [1.5, 2.5]
    assert bool((x > 1).all())
    assert not bool((x > 2).all())
    assert f"{x.sum():.1f}" == "4.0"


def test_repr_shows_values_and_device():
    x = torch.tensor([1.0, 2.0], device="xla")
    assert repr(x) == "tensor([1., 2.], device='xla:0')"
    i = torch.tensor([1, 2], dtype=torch.int32, device="xla")
    assert repr(i) == "tensor([1, 2], device='xla:0', dtype=torch.int32)"
    p = torch.ones(2, device="xla", requires_grad=True)
    assert repr(p) == "tensor([1., 1.], device='xla:0', requires_grad=True)"
    assert "grad_fn=<MulBackward0>" in repr(p * 2)
    assert str(x) == repr(x)


def test_torch_save_of_cpu_copy():
    x = torch.randn(4, device="xla")
    buf = io.BytesIO()
    torch.save(x.cpu(), buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf), x.cpu())
    # The xla tensor itself saves too (tests/tensor/test_torch_save.py).
    buf = io.BytesIO()
    torch.save(x, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, map_location="cpu"), x.cpu())


def test_device_mismatch_raises_torch_style_error():
    x = torch.ones(3, device="xla")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*xla:0 and cpu"):
        x + torch.ones(3)
    # A 0-dim CPU tensor is a scalar, as on CUDA.
    torch.testing.assert_close((x + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))


def test_missing_lowering_names_the_overload(monkeypatch):
    from spmdtorch.ops import registry
    from spmdtorch.tensor import dispatch

    op = torch.ops.aten.erfinv.default
    monkeypatch.delitem(registry.LOWERINGS, op, raising=False)
    monkeypatch.delitem(torch._decomp.decomposition_table, op, raising=False)
    dispatch.reset_op_facts()  # erfinv may have run (and been cached) earlier in the session
    try:
        with pytest.raises(NotImplementedError, match=r"aten\.erfinv\.default"):
            torch.erfinv(torch.zeros(2, device="xla"))
    finally:
        monkeypatch.undo()
        dispatch.reset_op_facts()


def test_data_dependent_ops_materialise_and_continue():
    src = torch.tensor([0.0, 3.0, 0.0, 5.0])
    x = src.to("xla")
    nz = torch.nonzero(x)
    assert isinstance(nz, XlaTensor)
    torch.testing.assert_close(nz.cpu(), torch.nonzero(src))
    torch.testing.assert_close(x[x > 1].cpu(), src[src > 1])
    y = x.clone()
    y[y > 1] = -1.0
    ref = src.clone()
    ref[ref > 1] = -1.0
    torch.testing.assert_close(y.cpu(), ref)
    if x.sum() > 4:  # .item() in control flow
        z = x * 2
    torch.testing.assert_close(z.cpu(), src * 2)


# -- the pending set and cached view values (spmdtorch.lazy._storage) ----------


def _program_outputs(monkeypatch):
    """Run a sync and return how many outputs its program had."""
    from spmdtorch.lazy import executor

    seen = []
    orig = executor.run_plan

    def spy(plan, storages, recycle=None, bake=False):
        seen.append(len(storages))
        return orig(plan, storages, recycle, bake)

    monkeypatch.setattr(executor, "run_plan", spy)
    spmdtorch.sync()
    return seen


def test_a_storage_written_many_times_is_one_output_and_dropped_ones_none(monkeypatch):
    spmdtorch.sync()
    w = torch.zeros(4, device="xla")
    spmdtorch.sync()
    for _ in range(5):
        w.add_(1)  # five writes to one storage
    tmp = w * 2
    del tmp  # dropped before the barrier: computed by nobody
    assert _program_outputs(monkeypatch) == [1]
    assert w.cpu().tolist() == [5.0] * 4


def test_pending_set_discard_and_compaction_keep_live_members(monkeypatch):
    from spmdtorch.lazy._engine import ENGINE, PendingSet

    spmdtorch.sync()
    pending = ENGINE.pending
    # Compact often: dead references pile up in a loop that never syncs.
    monkeypatch.setattr(PendingSet, "_COMPACT_MIN", 8)
    monkeypatch.setattr(pending, "_compact_at", 8)
    keep = [torch.ones(2, device="xla") * i for i in range(3)]
    for _ in range(40):
        _ = torch.ones(2, device="xla") + 1  # recorded and dropped at once
    assert len(pending._refs) < 40
    members = list(pending)
    assert all(t._st in members for t in keep)
    pending.discard(keep[0]._st)
    assert keep[0]._st not in list(pending) and keep[1]._st in list(pending)
    pending.add(keep[0]._st)
    assert [id(st) for st in pending].count(id(keep[0]._st)) == 1  # re-added once
    spmdtorch.sync()
    assert [t.cpu().tolist() for t in keep] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_a_write_drops_cached_view_values_so_no_old_graph_stays_alive():
    import weakref

    from spmdtorch.tensor.dispatch import read_value

    base = torch.zeros(4, 4, device="xla")
    spmdtorch.sync()
    base.add_(1)  # pending
    view = base[1:3]
    node = weakref.ref(read_value(view).node)  # the view's value, cached
    assert read_value(view).node is node()  # a second read hits the cache
    spmdtorch.sync()  # the storage's new value: the cached view value is stale
    assert node() is None  # ... and no longer pinned by the view tensor
    view.mul_(3)  # a write through the view: every alias of the storage sees it
    other = base[1:3]  # an equal view made afresh reads the same storage
    torch.testing.assert_close(other.cpu(), torch.full((2, 4), 3.0))
    torch.testing.assert_close(base.cpu()[0], torch.ones(4))


def test_holder_table_forgets_dead_tensors_and_keeps_live_ones():
    from spmdtorch.lazy import _storage
    from spmdtorch.tensor.dispatch import read_value

    keep = torch.arange(4.0).to("xla")
    for _ in range(3 * _storage._HOLDERS_SWEEP_AT[0]):  # tensors that die holding their arrays
        torch.ones(2).to("xla")
    assert len(_storage.HOLDERS) <= 2 * max(4096, _storage._HOLDERS_SWEEP_AT[0])
    arr = read_value(keep)
    assert _storage.holder_of(arr) is keep._st  # so its buffer is never donated from under it
    torch.testing.assert_close(keep.cpu(), torch.arange(4.0))
