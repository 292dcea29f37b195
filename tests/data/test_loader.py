"""MpDeviceLoader / ParallelLoader on one process with 8 CPU devices.

Batches must arrive as xla tensors equal to the CPU batches, sharded as
``input_sharding`` says; loading runs ahead on background threads (bounded);
errors in those threads reach the consumer with the batch index; the loader
syncs as PyTorch/XLA's does. The multi-process behaviour (each process loads
its part, ``minibatch=True``) is in tests/multiprocess.
"""

from __future__ import annotations

import asyncio
import collections
import doctest
import importlib
import re
import threading
import time

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.data import (
    InputShardingError,
    LoaderWorkerError,
    MpDeviceLoader,
    ParallelLoader,
    send_cpu_data_to_device,
)
from spmdtorch.lazy.graph import LazyRef
from spmdtorch.mesh import Mesh, PartitionSpecError
from spmdtorch.partition import (
    ShardingSpec,
    get_sharding_spec,
    local_shards,
    tensor_sharding,
)

ALL8 = "0,1,2,3,4,5,6,7"
ROWS = f"{{devices=[8,1]{ALL8}}}"


@pytest.fixture
def mesh(devices8):
    return Mesh(np.arange(8), (8,), ("data",))


def batches(n=3, rows=16):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(rows, 4, generator=g), torch.randint(0, 10, (rows,), generator=g)) for _ in range(n)]


def _threads_alive():
    # The loaders' own threads (other spmdtorch threads, e.g. the step-closure
    # worker another test started, live for the whole process).
    prefixes = ("spmdtorch-loader", "spmdtorch-h2d")
    return [t for t in threading.enumerate() if t.name.startswith(prefixes) and t.is_alive()]


def test_tuple_batches_sharded_where_the_spec_applies(mesh):
    data = batches()
    loader = MpDeviceLoader(data, spmdtorch.device(), input_sharding=ShardingSpec(mesh, ("data", None)))
    assert len(loader) == 3
    got = list(loader)
    assert len(got) == 3
    for (x, y), (x_ref, y_ref) in zip(got, data):
        assert x.device.type == "xla" and y.device.type == "xla"
        assert get_sharding_spec(x) == ROWS
        assert [s.data.shape for s in local_shards(x)] == [(2, 4)] * 8
        # y has one dim, the spec two: replicated, as in PyTorch/XLA.
        assert get_sharding_spec(y) == "" and tensor_sharding(y).is_fully_replicated
        torch.testing.assert_close(x.cpu(), x_ref, rtol=0, atol=0)
        assert torch.equal(y.cpu(), y_ref) and y.dtype == torch.int64
        torch.testing.assert_close((x * 2 + 1).sum(0).cpu(), (x_ref * 2 + 1).sum(0))


def test_dict_batches_with_per_key_specs(mesh):
    batch = {
        "tokens": torch.arange(32).reshape(16, 2),
        "mask": torch.ones(16, 2, dtype=torch.bool),
        "weights": torch.rand(3),
        "name": "b0",
        "step": 7,
    }
    specs = {"tokens": ShardingSpec(mesh, ("data", None)), "mask": ShardingSpec(mesh, (None, None))}
    (out,) = list(MpDeviceLoader([batch], "xla", input_sharding=specs))
    assert list(out) == list(batch) and out["name"] == "b0" and out["step"] == 7
    assert get_sharding_spec(out["tokens"]) == ROWS
    assert get_sharding_spec(out["mask"]) == "{replicated}"
    assert get_sharding_spec(out["weights"]) == ""  # no spec: not annotated, replicated
    assert tensor_sharding(out["weights"]).is_fully_replicated
    for key in ("tokens", "mask", "weights"):
        assert torch.equal(out[key].cpu(), batch[key])


def test_minibatch_on_one_process_is_the_whole_batch(mesh):
    data = [{"x": torch.arange(24.0).reshape(8, 3) + i, "y": torch.arange(8) * i} for i in range(2)]
    specs = {
        "x": ShardingSpec(mesh, ("data", None), minibatch=True),
        "y": ShardingSpec(mesh, ("data",), minibatch=True),
    }
    got = list(MpDeviceLoader(data, "xla", input_sharding=specs))
    for out, ref in zip(got, data):
        assert get_sharding_spec(out["x"]) == ROWS
        assert torch.equal(out["x"].cpu(), ref["x"]) and torch.equal(out["y"].cpu(), ref["y"])


def test_uneven_batch_is_padded_on_the_devices_and_exact_for_users(mesh):
    x_ref = torch.arange(30.0).reshape(10, 3)  # 10 rows over 8 devices
    (x,) = list(MpDeviceLoader([x_ref], "xla", input_sharding=ShardingSpec(mesh, ("data", None))))
    assert x.shape == (10, 3)
    assert get_sharding_spec(x) == ROWS
    assert max(s.data.shape[0] for s in local_shards(x)) == 2  # each device holds its block only
    assert torch.equal(x.cpu(), x_ref)
    torch.testing.assert_close((x @ x.T).cpu(), x_ref @ x_ref.T)


def test_minibatch_that_does_not_split_evenly_names_the_tensor(mesh):
    spec = ShardingSpec(mesh, ("data", None), minibatch=True)
    it = iter(MpDeviceLoader([torch.zeros(8, 2), torch.zeros(10, 2)], "xla", input_sharding=spec))
    next(it)
    with pytest.raises(LoaderWorkerError, match="batch 1 failed while transferring") as e:
        next(it)
    assert e.value.batch_index == 1
    assert isinstance(e.value.__cause__, InputShardingError)
    assert "shape (10, 2)" in str(e.value.__cause__)


def test_loading_runs_ahead_on_a_thread_and_is_bounded():
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield torch.full((2,), float(i))
            i += 1

    it = iter(MpDeviceLoader(endless(), "xla", loader_prefetch_size=2, device_prefetch_size=1))
    assert next(it).cpu().tolist() == [0.0, 0.0]
    deadline = time.monotonic() + 5
    while len(pulled) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # would be plenty for an unbounded reader to run far ahead
    # consumed 1 + ready on devices 1 + in transfer 1 + queued 2 + in the loader's hand 1
    assert 3 <= len(pulled) <= 6, pulled
    assert [next(it).cpu()[0].item() for _ in range(5)] == [1.0, 2.0, 3.0, 4.0, 5.0]
    it.close()
    deadline = time.monotonic() + 3
    while _threads_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _threads_alive()


def test_several_transfer_threads_keep_loader_order():
    data = [torch.full((3,), float(i)) for i in range(20)]
    got = list(MpDeviceLoader(data, "xla", host_to_device_transfer_threads=3, device_prefetch_size=2))
    assert [b[0].item() for b in got] == [float(i) for i in range(20)]


def test_dataset_error_reaches_the_consumer_with_the_batch_index():
    class Boom(ValueError):
        pass

    def broken():
        yield torch.zeros(2)
        yield torch.ones(2)
        raise Boom("bad record 17")

    it = iter(MpDeviceLoader(broken(), "xla"))
    assert next(it).cpu().tolist() == [0.0, 0.0]
    assert next(it).cpu().tolist() == [1.0, 1.0]
    with pytest.raises(LoaderWorkerError, match=r"batch 2 failed while loading: Boom: bad record 17") as e:
        next(it)
    assert e.value.batch_index == 2 and isinstance(e.value.__cause__, Boom)
    deadline = time.monotonic() + 3
    while _threads_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _threads_alive()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("error", [SystemExit(3), asyncio.CancelledError(), KeyboardInterrupt()])
def test_a_dataset_raising_a_base_exception_stops_the_consumer_instead_of_hanging_it(error):
    # The loader thread used to catch only Exception: a BaseException ended it
    # silently and next() waited forever. Now the consumer raises that very
    # exception (a request to stop, not a data error to wrap), noting the batch.
    class Stops(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            if i == 2:
                raise error
            return torch.full((2,), float(i))

    # batch_size=1 and the first batch taken before the loader thread runs
    # (MpDeviceLoader fetches it on the consumer's thread): item 2 is the thread's.
    it = iter(MpDeviceLoader(torch.utils.data.DataLoader(Stops(), batch_size=1), "xla"))
    assert next(it).cpu().tolist() == [[0.0, 0.0]]
    assert next(it).cpu().tolist() == [[1.0, 1.0]]
    with pytest.raises(type(error)) as e:
        next(it)
    assert e.value is error
    assert any("batch 2" in note for note in getattr(e.value, "__notes__", []))
    deadline = time.monotonic() + 3
    while _threads_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _threads_alive()


def test_syncs_like_pytorch_xla():
    # PyTorch/XLA: mark_step before taking a batch every batches_per_execution
    # batches, and once more at the end.
    def count_syncs(bpe, n):
        before = debug.counter_value("MarkStep")
        for _ in MpDeviceLoader([torch.zeros(1)] * n, "xla", batches_per_execution=bpe):
            pass
        return debug.counter_value("MarkStep") - before

    assert count_syncs(1, 4) == 6  # before each of the 4 batches, before the end, at the end
    assert count_syncs(2, 4) == 3  # before batches 2 and 4, and at the end

    # What that means: work recorded after one batch runs when the next is taken.
    it = iter(MpDeviceLoader([torch.ones(2), torch.ones(2)], "xla"))
    y = next(it) * 3
    assert isinstance(y._st.value, LazyRef)
    next(it)
    assert not isinstance(y._st.value, LazyRef)
    assert y.cpu().tolist() == [3.0, 3.0]


def test_parallel_loader_per_device_loader(mesh):
    data = batches(2)
    pl = ParallelLoader(data, [spmdtorch.device()], input_sharding=ShardingSpec(mesh, ("data", None)))
    per_device = pl.per_device_loader(spmdtorch.device())
    assert len(per_device) == 2
    got = list(per_device)
    assert [torch.equal(x.cpu(), ref[0]) for (x, _), ref in zip(got, data)] == [True, True]


def test_loader_without_a_length_iterates_and_len_names_the_cause():
    loader = MpDeviceLoader((torch.full((2,), float(i)) for i in range(3)), "xla")
    with pytest.raises(TypeError, match="generator, has no len"):
        len(loader)
    assert [b.cpu().tolist() for b in loader] == [[0.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


def test_send_cpu_data_to_device_keeps_structure(mesh):
    Pair = collections.namedtuple("Pair", "a b")
    data = [Pair(torch.zeros(8, 2), [torch.ones(3), 5])]
    out = send_cpu_data_to_device(data, "xla", input_sharding=ShardingSpec(mesh, ("data", None)))
    assert isinstance(out, list) and isinstance(out[0], Pair) and out[0].b[1] == 5
    assert get_sharding_spec(out[0].a) == ROWS
    assert torch.equal(out[0].b[0].cpu(), torch.ones(3))


# -- errors ------------------------------------------------------------------


def test_construction_errors(mesh):
    spec = ShardingSpec(mesh, ("data", None))
    with pytest.raises(InputShardingError, match="one virtual xla device per process"):
        ParallelLoader([], ["xla:0", "xla:1"])
    with pytest.raises(InputShardingError, match="must be an xla device"):
        MpDeviceLoader([], "cpu")
    with pytest.raises(InputShardingError, match="got list"):
        MpDeviceLoader([], "xla", input_sharding=[spec])
    with pytest.raises(InputShardingError, match=r"input_sharding\['x'\] must be a spmdtorch.partition.ShardingSpec"):
        MpDeviceLoader([], "xla", input_sharding={"x": ("data", None)})
    with pytest.raises(InputShardingError, match="minibatch=True .* dim 0 must be sharded"):
        MpDeviceLoader([], "xla", input_sharding=ShardingSpec(mesh, (None, "data"), minibatch=True))
    with pytest.raises(PartitionSpecError):
        MpDeviceLoader([], "xla", input_sharding=ShardingSpec(mesh, ("model", None)))
    with pytest.raises(ValueError, match="device_prefetch_size must be an int >= 1, got 0"):
        ParallelLoader([], ["xla"], device_prefetch_size=0)
    with pytest.raises(TypeError, match="batchdim must be an int"):
        ParallelLoader([], ["xla"], batchdim=None)


@pytest.mark.parametrize(
    "batch,specs,match",
    [
        ((torch.zeros(8, 2),), "dict", "input_sharding is a dict .* but batch 0 is a tuple"),
        ({"tokens": torch.zeros(8, 2)}, "dict", r"names key\(s\) \['labels'\] that batch 0 does not have"),
        (
            {"tokens": torch.zeros(8, 2), "labels": torch.zeros(8)},
            "dict",
            r"tensor \['labels'\] has shape \(8,\) \(1 dims\) but its input_sharding",
        ),
        (
            {"tokens": torch.zeros(8, 2), "extra": torch.zeros(8)},
            "minibatch",
            r"tensor \['extra'\] \(shape \(8,\)\) has no input_sharding that applies.*minibatch=True",
        ),
    ],
)
def test_batch_errors_name_the_batch_and_tensor(mesh, batch, specs, match):
    rows = ShardingSpec(mesh, ("data", None))
    input_sharding = {
        "dict": {"tokens": rows, "labels": rows},
        "minibatch": {"tokens": ShardingSpec(mesh, ("data", None), minibatch=True)},
    }[specs]
    it = iter(MpDeviceLoader([batch], "xla", input_sharding=input_sharding))
    with pytest.raises(LoaderWorkerError) as e:
        next(it)
    assert e.value.batch_index == 0
    assert isinstance(e.value.__cause__, InputShardingError)
    assert re.search(match, str(e.value.__cause__)), str(e.value.__cause__)


@pytest.mark.parametrize("name", ["spmdtorch.data", "spmdtorch.data.loader", "spmdtorch.data.transfer"])
def test_doctests(devices8, name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
