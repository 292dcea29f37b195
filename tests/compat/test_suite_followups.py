"""PyTorch/XLA test-suite follow-ups: ``_global_tensor_from_cpu_shards`` shapes, alias counts, HLO of computed
tensors, visualize labels, the ``xla`` backend's refusal and the minibatch loader error, as PyTorch/XLA gives them."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from spmdtorch.sharding import ShardingError


@pytest.fixture
def xla():
    import torch_xla
    import torch_xla.debug.metrics as met
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    return torch_xla, xs, met


def _mesh(xs, shape):
    return xs.Mesh(np.arange(int(np.prod(shape))), shape)


# --- _global_tensor_from_cpu_shards ----------------------------------------------------------------------------


def test_from_cpu_shards_drops_padding_within_one_shard(xla):
    torch_xla, xs, _ = xla
    from_cpu = torch_xla._XLAC._global_tensor_from_cpu_shards
    full = torch.randn(24)
    op = _mesh(xs, (8,)).get_op_sharding((0,))
    shards = list(full.chunk(8))  # 3 elements each
    assert torch.equal(from_cpu(shards, op).cpu(), full)
    for size in (17, 20, 24):  # ceil(size / 8) == 3: the rest of the last shards is padding
        assert torch.equal(from_cpu(shards, op, torch.Size((size,))).cpu(), full[:size])


@pytest.mark.parametrize("shape", [(25,), (16,), (3, 8), (1,)])
def test_from_cpu_shards_shape_that_does_not_fit_is_a_named_runtime_error(xla, shape):
    torch_xla, xs, _ = xla
    from torch_xla._XLAC import CpuShardsError

    op = _mesh(xs, (8,)).get_op_sharding((0,))
    shards = list(torch.arange(24.0).chunk(8))
    with pytest.raises(CpuShardsError) as info:
        torch_xla._XLAC._global_tensor_from_cpu_shards(shards, op, torch.Size(shape))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, ShardingError)
    msg = str(info.value)
    assert f"global_shape {shape}" in msg and "(3,)" in msg and "global_shape=None" in msg


def test_from_cpu_shards_wrong_count_and_mixed_shapes(xla):
    torch_xla, xs, _ = xla
    from torch_xla._XLAC import CpuShardsError

    from_cpu = torch_xla._XLAC._global_tensor_from_cpu_shards
    op = _mesh(xs, (8,)).get_op_sharding((0,))
    shards = [torch.tensor([float(i)]) for i in range(8)]
    with pytest.raises(CpuShardsError, match="got 7 shards, expected 8"):
        from_cpu(shards[:-1], op)
    with pytest.raises(CpuShardsError, match=r"shards\[3\] has shape \(2,\)"):
        from_cpu(shards[:3] + [torch.zeros(2)] + shards[4:], op)


def test_from_cpu_shards_2d_tiled_partial_and_replicated(xla):
    torch_xla, xs, _ = xla
    from_cpu = torch_xla._XLAC._global_tensor_from_cpu_shards
    mesh = _mesh(xs, (4, 2))
    full = torch.randn(8, 6)
    tiled = [full[r * 2 : r * 2 + 2, c * 3 : c * 3 + 3] for r in range(4) for c in range(2)]
    out = from_cpu(tiled, mesh.get_op_sharding((0, 1)))
    assert torch.equal(out.cpu(), full)
    assert torch_xla._XLAC._get_xla_sharding_spec(out) == "{devices=[4,2]0,1,2,3,4,5,6,7}"
    halves = [full[:, :3], full[:, 3:]] * 4  # replicated along mesh axis 0
    assert torch.equal(from_cpu(halves, mesh.get_op_sharding((None, 1))).cpu(), full)
    # A replicated OpSharding has no rank: shards of any rank are the whole tensor.
    vec = torch.randn(5)
    assert torch.equal(from_cpu([vec] * 8, mesh.get_op_sharding((None, None))).cpu(), vec)


# --- InputOutputAliasCount -------------------------------------------------------------------------------------


def test_input_output_alias_count_counts_in_place_updates_per_execution(xla):
    torch_xla, xs, met = xla
    a_cpu, b_cpu = torch.randn(4, 8), torch.randn(4, 8)
    a, b = a_cpu.to("xla"), b_cpu.to("xla")
    xs.mark_sharding(a, _mesh(xs, (1, 8)), (0, 1))
    torch_xla.sync()
    met.clear_all()
    c = a + b  # a new tensor: a's and b's buffers are still held, nothing to alias
    torch_xla.sync()
    assert met.metric_data("InputOutputAliasCount") == (1, 0.0, [])
    a *= 2.0  # two in-place updates: their old buffers are donated and reused
    b += 2.0
    torch_xla.sync()
    count, total, _ = met.metric_data("InputOutputAliasCount")
    assert (count, total) == (2, 2.0)
    a *= 2.0
    torch_xla.sync()
    assert met.metric_data("InputOutputAliasCount")[:2] == (3, 3.0)
    assert "Metric: InputOutputAliasCount" in met.short_metrics_report(metric_names=["InputOutputAliasCount"])
    torch.testing.assert_close(a.cpu(), a_cpu * 4)
    torch.testing.assert_close(b.cpu(), b_cpu + 2)
    torch.testing.assert_close(c.cpu(), a_cpu + b_cpu)
    met.clear_all()
    assert met.metric_data("InputOutputAliasCount") is None


# --- _get_xla_tensors_hlo of computed tensors -------------------------------------------------------------------


def test_hlo_of_computed_tensors_is_their_device_data_with_shardings(xla):
    torch_xla, xs, _ = xla
    X = torch_xla._XLAC
    t = torch.randn(8, 4).to("xla")
    xs.mark_sharding(t, _mesh(xs, (2, 4, 1)), (2, 1))
    u = torch.randn(3).to("xla")
    hlo = X._get_xla_tensors_hlo([t, u])
    params = [line for line in hlo.splitlines() if "parameter(" in line]
    assert len(params) == 2
    tiles = X._get_xla_sharding_spec(t).split("]")[0]  # "{devices=[1,4,2"
    assert tiles == "{devices=[1,4,2"
    assert "f32[8,4]" in params[0] and f"sharding={tiles}" in params[0]
    assert "f32[3]" in params[1] and "sharding={replicated}" in params[1]
    # A pending tensor still gets the graph computing it.
    pending = X._get_xla_tensors_hlo([t * 3])
    assert "multiply" in pending
    assert X._get_xla_tensors_hlo([]) == ""


# --- torch_xla.distributed.spmd.debugging: PyTorch/XLA's drawing -----------------------------------------------


def _drawn(table) -> str:
    import rich.console

    console = rich.console.Console(width=120, color_system=None)
    with console.capture() as capture:
        console.print(table)
    return capture.get()


def test_debugging_draws_tiles_and_replica_groups_as_torch_xla(xla, capsys):
    from torch_xla.distributed.spmd.debugging import visualize_sharding

    tiled = "{devices=[2,4]0,4,2,6,1,5,3,7}"
    text = _drawn(visualize_sharding(tiled))
    assert f"Visualizing {tiled} (showing up to the first two dimensions)" in capsys.readouterr().out
    rows = [line for line in text.splitlines() if "CPU" in line]
    assert [r.split("│")[1:-1] for r in rows] == [
        [" CPU 0 ", " CPU 4 ", " CPU 2 ", " CPU 6 "],
        [" CPU 1 ", " CPU 5 ", " CPU 3 ", " CPU 7 "],
    ]
    partial = _drawn(visualize_sharding("{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"))
    labels = [line.split("│")[1] for line in partial.splitlines() if "CPU" in line]
    assert labels == [" CPU [0, 1, 2, 3] ", " CPU [4, 5, 6, 7] "]
    everyone = _drawn(visualize_sharding("{replicated}"))
    assert "CPU [0, 1, 2, 3, 4, 5, 6, 7]" in everyone


def test_debugging_tensor_sharding_and_spmdtorch_style_unchanged(xla):
    torch_xla, xs, _ = xla
    from torch_xla.distributed.spmd.debugging import visualize_tensor_sharding

    import spmdtorch.sharding as sh

    t = torch.randn(8, 8).to("xla")
    xs.mark_sharding(t, _mesh(xs, (2, 4)), (0, 1))
    text = _drawn(visualize_tensor_sharding(t))
    assert "CPU 0 " in text and "CPU 7 " in text and "[" not in text
    own = _drawn(sh.visualize_sharding("{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}", print_=False))
    assert "CPU 0,2" in own
    with pytest.raises(sh.VisualizationError, match="style must be"):
        sh.visualize_sharding("{replicated}", style="jax", print_=False)


# --- the refused `xla` process-group backend ------------------------------------------------------------------


def test_xla_backend_refusal_is_an_assertion_error_and_a_multiprocess_error():
    # In a subprocess: a process group is process-global state.
    code = textwrap.dedent(
        """
        import os
        os.environ["MASTER_PORT"] = "29631"
        import spmdtorch.compat
        spmdtorch.compat.install()
        import torch.distributed as dist
        import torch_xla.runtime as xr
        from torch_xla.distributed.xla_backend import XlaBackendNotSupportedError
        xr.use_spmd()
        try:
            dist.init_process_group("xla", init_method="xla://")
        except AssertionError as e:
            assert type(e) is XlaBackendNotSupportedError, type(e)
            assert isinstance(e, spmdtorch.compat.MultiprocessNotSupportedError)
            print("refused:", e)
        print("initialized:", dist.is_initialized())
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: dist.init_process_group('xla', ...)" in proc.stdout
    assert "init_process_group('gloo', init_method='xla://')" in proc.stdout
    assert "initialized: False" in proc.stdout


# --- a minibatch that does not split over the local devices -----------------------------------------------------


def test_minibatch_not_divisible_raises_torch_xla_runtime_error(xla):
    torch_xla, xs, _ = xla
    import torch_xla.distributed.parallel_loader as pl
    from torch_xla.distributed.parallel_loader import MinibatchBatchSizeError

    from spmdtorch.data import InputShardingError

    mesh = xs.get_1d_mesh("data")
    spec = xs.ShardingSpec(mesh, ("data", None), minibatch=True)
    good = torch.randn(8, 3)
    loader = pl.MpDeviceLoader([good], torch_xla.device(), input_sharding=spec)
    (batch,) = list(loader)
    torch.testing.assert_close(batch.cpu(), good)

    bad = pl.MpDeviceLoader([torch.randn(7, 3)], torch_xla.device(), input_sharding=spec)
    with pytest.raises(MinibatchBatchSizeError) as info:
        next(iter(bad))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, InputShardingError)
    msg = str(info.value)
    assert msg.startswith(
        "When minibatch is configured, the per-host batch size must be divisible by local runtime device count. "
        "Per host input data shape"
    )
    assert "(7, 3)" in msg and "local_runtime_device_count = 8" in msg


# --- ReplicateShardedData ---------------------------------------------------------------------------------------


def test_replicate_sharded_data_counts_every_host_read_of_spmd_results(xla):
    # PyTorch/XLA counts a read of any data spread over the devices (PjRtShardedData),
    # replicated results included (its test_sharding_propagation reads one of each: 2).
    torch_xla, xs, met = xla
    sharded = torch.arange(16.0).reshape(2, 8).to("xla")
    xs.mark_sharding(sharded, _mesh(xs, (1, 8)), (0, 1))
    replicated = torch.arange(4.0).to("xla") * 2
    torch_xla.sync()
    met.clear_all()
    assert not met.counter_value("ReplicateShardedData")
    assert replicated.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    assert met.counter_value("ReplicateShardedData") == 1
    assert met.counter_value("TransferFromDeviceSharded") is None  # nothing to assemble
    assert torch.equal(sharded.cpu(), torch.arange(16.0).reshape(2, 8))
    assert met.counter_value("ReplicateShardedData") == 2
    assert met.counter_value("TransferFromDeviceSharded") == 1


# --- XLA_DUMP_POST_OPTIMIZATIONS ----------------------------------------------------------------------------------


def test_hlo_dump_post_optimizations_shows_the_partitioned_program(xla, monkeypatch):
    torch_xla, xs, _ = xla
    a = torch.randn(1, 128).to("xla")
    b = torch.randn(128, 1).to("xla")
    xs.mark_sharding(a, _mesh(xs, (1, 8)), (0, 1))
    c = a @ b
    # Before partitioning there is no collective; the compiled program sums the 8 partial products.
    assert "all-reduce" not in torch_xla._XLAC._get_xla_tensors_hlo([c])
    monkeypatch.setenv("XLA_DUMP_POST_OPTIMIZATIONS", "1")
    assert "all-reduce" in torch_xla._XLAC._get_xla_tensors_hlo([c])
    torch.testing.assert_close(c.cpu(), a.cpu() @ b.cpu())
