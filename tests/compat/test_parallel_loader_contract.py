"""``pl.MpDeviceLoader`` keeps PyTorch/XLA's ``input_sharding`` contract (checked against eager CPU batches)."""

from __future__ import annotations

import pytest
import torch

from spmdtorch.data import InputShardingError


def _batches(batch, n=2):
    return [batch] * n


@pytest.fixture
def pl_xs():
    import torch_xla.distributed.parallel_loader as pl
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    return pl, xs


def test_no_input_sharding_gives_replicated_annotation(pl_xs):
    import torch_xla

    pl, _ = pl_xs
    batch = {"x": torch.randn(16, 4), "y": torch.arange(16)}
    loader = pl.MpDeviceLoader(_batches(batch), torch_xla.device(), input_sharding=None)
    seen = list(loader)
    assert len(seen) == 2 and len(loader) == 2
    for got in seen:
        for key in batch:
            assert torch_xla._XLAC._get_xla_sharding_spec(got[key]) == "{replicated}"
            torch.testing.assert_close(got[key].cpu(), batch[key])


def test_dict_input_sharding_must_name_every_key(pl_xs):
    import torch_xla

    pl, xs = pl_xs
    mesh = xs.get_1d_mesh("x")
    batch = {"x": torch.randn(16, 4), "y": torch.randn(16, 4)}
    loader = pl.MpDeviceLoader(
        _batches(batch), torch_xla.device(), input_sharding={"x": xs.ShardingSpec(mesh, ("x", None))}
    )
    with pytest.raises(KeyError, match=r"\['y'\] have no entry in input_sharding"):
        next(iter(loader))
    full = pl.MpDeviceLoader(
        _batches(batch),
        torch_xla.device(),
        input_sharding={"x": xs.ShardingSpec(mesh, ("x", None)), "y": xs.ShardingSpec(mesh, (None, None))},
    )
    got = next(iter(full))
    assert torch_xla._XLAC._get_xla_sharding_spec(got["x"]) == "{devices=[8,1]0,1,2,3,4,5,6,7}"
    torch.testing.assert_close(got["y"].cpu(), batch["y"])


def test_batch_that_does_not_fit_raises_value_error_from_next(pl_xs):
    import torch_xla

    pl, xs = pl_xs
    mesh = xs.get_1d_mesh("x")
    loader = pl.MpDeviceLoader(
        _batches(torch.randn(16, 4)), torch_xla.device(), input_sharding={"x": xs.ShardingSpec(mesh, ("x", None))}
    )
    with pytest.raises(InputShardingError, match="input_sharding is a dict") as e:
        next(iter(loader))
    assert isinstance(e.value, ValueError)
