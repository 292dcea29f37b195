"""torch_xla._XLAC.lowering.LoweringContext and xla_builder's HLO-proto readers under spmdtorch.compat."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch


def _mesh(device_ids=None, shape=(2, 4)):
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    xr.use_spmd()
    ids = np.arange(8) if device_ids is None else np.asarray(device_ids)
    return xs.Mesh(ids, shape, ("x", "y"))


def _lowering():
    import torch_xla

    return torch_xla._XLAC.lowering


def _sharded_inputs(mesh):
    import torch_xla
    import torch_xla.distributed.spmd as xs

    a_cpu, b_cpu = torch.randn(32, 64), torch.randn(64)
    a, b = a_cpu.to("xla"), b_cpu.to("xla")
    xs.mark_sharding(a, mesh, ("x", "y"))
    xs.mark_sharding(b, mesh, ("x",))
    torch_xla.sync()
    return a_cpu, b_cpu, a, b


def test_parameters_map_back_to_the_tensors_without_transfers():
    import torch_xla
    import torch_xla.debug.metrics as met

    a_cpu, b_cpu, a, b = _sharded_inputs(_mesh())
    out = a * b + 1.5
    met.clear_all()
    ctx = _lowering().LoweringContext("AddStep")
    ctx.build([out])
    mapping = ctx.device_parameter_id_tensor_mapping()
    ids = {ctx.tensor_parameter_id(a), ctx.tensor_parameter_id(b)}
    assert ids == set(mapping) == {0, 1}
    assert ctx.tensor_parameter_id(out) == -1  # pending: an output, not a parameter
    # The mapped tensors are the inputs' data: same values, same sharding, nothing copied or moved.
    spec = torch_xla._XLAC._get_xla_sharding_spec
    for t in (a, b):
        mapped = mapping[ctx.tensor_parameter_id(t)]
        assert mapped.device.type == "xla" and spec(mapped) == spec(t)
    assert not met.metric_data("TransferFromDeviceTime")
    assert not met.counter_value("ReplicateShardedData")
    torch.testing.assert_close(mapping[ctx.tensor_parameter_id(a)].cpu(), a_cpu)
    torch.testing.assert_close(mapping[ctx.tensor_parameter_id(b)].cpu(), b_cpu)
    # Building ran nothing: the output is still pending and computes what eager torch does.
    assert torch_xla._XLAC._get_xla_tensors_text([out])
    torch.testing.assert_close(out.cpu(), a_cpu * b_cpu + 1.5)


def test_parameter_id_tensor_mapping_copies_to_cpu():
    a_cpu, b_cpu, a, b = _sharded_inputs(_mesh())
    ctx = _lowering().LoweringContext()
    ctx.build([a - b])
    host = ctx.parameter_id_tensor_mapping()
    assert all(t.device.type == "cpu" for t in host.values())
    torch.testing.assert_close(host[ctx.tensor_parameter_id(a)], a_cpu)
    torch.testing.assert_close(host[ctx.tensor_parameter_id(b)], b_cpu)


def _instructions(hlo_text):
    return re.findall(r'opcode: "([\w-]+)"', hlo_text)


def test_hlo_proto_text_names_the_module_and_carries_explicit_shardings():
    import torch_xla

    a_cpu, b_cpu, a, b = _sharded_inputs(_mesh())
    ctx = _lowering().LoweringContext("MyModule")
    ctx.build([a + b])
    text = ctx.hlo_text()
    assert text.startswith('name: "MyModule"')
    ops = _instructions(text)
    assert ops.count("parameter") == 2 and "add" in ops
    assert "iota_reshape_dims" not in text  # PyTorch/XLA's builder writes device lists, not XLA's iota form
    # a's sharding, {devices=[2,4]0,...,7}, as the proto's tile assignment.
    spec = torch_xla._XLAC._get_xla_sharding_spec(a)
    dims, devices = re.match(r"\{devices=\[([\d,]+)\]([\d,]+)\}", spec).groups()
    block = "".join(f"tile_assignment_dimensions: {d}\n" for d in dims.split(","))
    block += "".join(f"tile_assignment_devices: {d}\n" for d in devices.split(","))
    assert re.sub(r"\n\s+", "\n", text).count(block) >= 1
    # The JSON form is the same message.
    assert json.loads(ctx.hlo_json())["name"] == "MyModule"


def _tiles(hlo_sharding: str) -> list[frozenset[int]]:
    from spmdtorch.sharding import parse_hlo_sharding_string

    p = parse_hlo_sharding_string(hlo_sharding)
    per_tile = p.tile_dims[-1] if p.last_tile_dim_replicate else 1
    devices = list(p.devices)
    return [frozenset(devices[i : i + per_tile]) for i in range(0, len(devices), per_tile)]


def test_hlo_bytes_round_trip_through_xla_builder():
    import torch_xla
    import torch_xla.core.xla_builder as xb

    mesh = _mesh(device_ids=[7, 6, 5, 4, 3, 2, 1, 0])  # device numbers are ordinals, not mesh positions
    a_cpu, b_cpu, a, b = _sharded_inputs(mesh)
    ctx = _lowering().LoweringContext("RoundTrip")
    ctx.build([a + b, a])
    comp = xb.computation_from_module_proto("my_comp", ctx.hlo())
    hlo = xb.get_computation_hlo(comp)
    assert hlo.startswith("HloModule RoundTrip")
    spec = torch_xla._XLAC._get_xla_sharding_spec
    for t in (a, b):
        found = re.search(
            rf"%parameter\.\d+ = f32\[{','.join(map(str, t.shape))}\]\S* parameter\(\d\), sharding=(\{{[^}}]*\}})", hlo
        )
        # The same placement: per tile, the same devices (XLA may order a tile's replicas differently).
        assert found and _tiles(found.group(1)) == _tiles(spec(t))
    assert re.search(r"ROOT %tuple\.\d+ = \(f32\[32,64\]\{1,0\}, f32\[32,64\]\{1,0\}\)", hlo)


def test_pending_marked_values_lower_to_sharding_custom_calls_and_sync_keeps_them():
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = _mesh()
    a = torch.zeros(2048, device="xla", requires_grad=True)
    xs.mark_sharding(a, mesh, ("x",))
    b = torch.randn([32, 2048], device="xla", requires_grad=True)
    xs.mark_sharding(b, mesh, (None, "y"))
    x, y = a + 1, b * 2
    ctx = _lowering().LoweringContext("Marked")
    ctx.build([x, y])
    hlo = torch_xla.core.xla_builder.get_computation_hlo(
        torch_xla.core.xla_builder.computation_from_module_proto("c", ctx.hlo())
    )
    spec = torch_xla._XLAC._get_xla_sharding_spec
    assert re.search(rf"%custom-call\.\d+ = f32\[2048\].*sharding={re.escape(spec(a))}", hlo)
    assert re.search(rf"%custom-call\.\d+ = f32\[32,2048\].*sharding={re.escape(spec(b))}", hlo)
    # The random key is the only parameter; building drew nothing from torch's generator.
    assert list(ctx.device_parameter_id_tensor_mapping()) == [0]
    key = ctx.device_parameter_id_tensor_mapping()[0]
    assert key.dtype == torch.uint32 and key.shape == (3,)
    torch_xla.sync()
    # XLA propagates the marks to the results (a graph with no array inputs, so constraints alone place it).
    assert spec(x) == spec(a) and spec(y) == spec(b)
    torch.testing.assert_close(x.cpu(), torch.ones(2048))


def test_building_does_not_change_the_random_numbers_drawn():
    import torch_xla

    def draw(build: bool):
        torch.manual_seed(3)
        r = torch.rand(6, device="xla") + 1
        if build:
            _lowering().LoweringContext().build([r])
        torch_xla.sync()
        return r.cpu()

    torch.testing.assert_close(draw(True), draw(False))


def test_output_sharding_block_lists_the_programs_tensors(monkeypatch, tmp_path):
    import spmdtorch.compat

    spmdtorch.compat.uninstall()
    monkeypatch.setenv("XLA_SAVE_TENSORS_FILE", str(tmp_path / "g.hlo"))
    monkeypatch.setenv("XLA_SAVE_TENSORS_FMT", "hlo")
    spmdtorch.compat.install()
    import torch_xla
    import torch_xla.distributed.spmd as xs

    mesh = _mesh()
    a = torch.zeros(16, 8, device="xla")
    xs.mark_sharding(a, mesh, ("x", "y"))
    c = (a + 2).sum(0)
    torch_xla.sync()
    text = (tmp_path / "g.hlo.0").read_text()
    block = re.search(r"#OUTPUT_SHARDING_BEGIN\n(.*?)\n#OUTPUT_SHARDING_END", text, re.S).group(1).strip()
    spec = torch_xla._XLAC._get_xla_sharding_spec
    assert block.split("\n") == [f"f32[16,8] {spec(a)}", f"f32[8] {spec(c)}"]
    spmdtorch.compat.uninstall()


def test_name_string():
    ctx = _lowering().LoweringContext("N")
    assert ctx.get_name_string() == ""
    ctx.set_name_string("bodyctx")
    assert ctx.get_name_string() == "bodyctx"


def test_bad_input_and_early_reads_are_named():
    from spmdtorch.compat._lowering import LoweringContextError
    from spmdtorch.compat._xla_builder import HloProtoError

    L = _lowering()
    with pytest.raises(LoweringContextError, match="name must be a str, got int"):
        L.LoweringContext(3)
    ctx = L.LoweringContext()
    with pytest.raises(LoweringContextError, match=r"hlo_text: nothing is built yet; call build\(tensors\) first"):
        ctx.hlo_text()
    with pytest.raises(LoweringContextError, match="tensors must be a list of xla tensors, got XlaTensor"):
        ctx.build(torch.ones(2, device="xla"))
    with pytest.raises(LoweringContextError, match=r"tensors\[1\] must be an xla tensor, got a tensor on cpu"):
        ctx.build([torch.ones(2, device="xla"), torch.ones(2)])
    ctx.build([torch.ones(2, device="xla") * 2])
    with pytest.raises(LoweringContextError, match="tensor_parameter_id: tensor must be an xla tensor, got list"):
        ctx.tensor_parameter_id([1])
    with pytest.raises(LoweringContextError, match="buildforiloop .* scan"):
        ctx.buildforiloop([torch.ones(2, device="xla")])
    import torch_xla.core.xla_builder as xb

    with pytest.raises(HloProtoError, match="not a valid HloModuleProto"):
        xb.computation_from_module_proto("c", b"\x0a\x03abc\x1a\x02\x08\x01")
    with pytest.raises(HloProtoError, match="proto must be the bytes of a serialized HloModuleProto, got str"):
        xb.computation_from_module_proto("c", "text")
    with pytest.raises(HloProtoError, match="get_computation_hlo: expected the computation"):
        xb.get_computation_hlo(b"bytes")
