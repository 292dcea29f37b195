"""``import spmdtorch`` leaves plain CPU torch exactly as it was.

A probe script runs a catalogue of plain torch calls (the ``.to`` family,
factories, ``torch.tensor``/``as_tensor``/``asarray``/``new_tensor``,
``Module.to``, TorchScript, TorchDynamo) and prints one line per call: the
result's value, dtype, device, layout, strides, identity facts, or the
exception's type and message. It runs twice in fresh interpreters, once with
``import spmdtorch`` first; the two transcripts must be equal line for line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import torch

import spmdtorch  # noqa: F401  (the import under test)

PROBE = textwrap.dedent(
    r"""
    import sys
    if sys.argv[1] == "with":
        import spmdtorch  # noqa: F401
    import torch

    def show(name, fn):
        try:
            out = fn()
        except Exception as e:  # the exception is part of the behaviour
            print(f"{name}: raises {type(e).__name__}: {e}")
            return
        if isinstance(out, torch.Tensor):
            print(f"{name}: {type(out).__name__} {out.dtype} {out.device} {out.layout} "
                  f"{tuple(out.shape)} {out.stride()} rg={out.requires_grad} {out.tolist()}")
        else:
            print(f"{name}: {out!r}")

    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    img = torch.arange(24, dtype=torch.float32).reshape(1, 2, 3, 4)
    i64 = torch.tensor([1, 2])
    show("to dtype", lambda: t.to(torch.float64))
    show("to same dtype is self", lambda: t.to(torch.float32) is t)
    show("to copy", lambda: t.to(torch.float32, copy=True))
    show("to copy is not self", lambda: t.to(torch.float32, copy=True) is t)
    show("to copy kw dtype", lambda: t.to(dtype=torch.float32, copy=True) is t)
    show("to device cpu", lambda: t.to("cpu") is t)
    show("to device cpu copy", lambda: t.to("cpu", copy=True) is t)
    show("to device obj", lambda: t.to(torch.device("cpu"), torch.int32))
    show("to non_blocking", lambda: t.to("cpu", non_blocking=True) is t)
    show("to non_blocking dtype", lambda: t.to(torch.float16, non_blocking=True))
    show("to memory_format", lambda: img.to(memory_format=torch.channels_last))
    show("to memory_format copy", lambda: img.to(torch.float32, copy=True, memory_format=torch.channels_last))
    show("to other", lambda: t.to(i64))
    show("to other copy", lambda: t.to(i64, non_blocking=False, copy=True))
    show("to bad kw", lambda: t.to(torch.float32, bogus=1))
    show("to bad device", lambda: t.to("nodevice"))
    show("to bad positional", lambda: t.to(3.5))
    show("to no args", lambda: t.to() is t)
    show("to meta", lambda: t.to("meta").shape)
    show("to requires_grad", lambda: torch.ones(2, requires_grad=True).to(torch.float64))
    show("tensor", lambda: torch.tensor([[1, 2], [3, 4]]))
    show("tensor dtype device", lambda: torch.tensor([1.5], dtype=torch.float64, device="cpu"))
    show("tensor requires_grad", lambda: torch.tensor([1.0], requires_grad=True))
    show("tensor bad", lambda: torch.tensor([1, [2]]))
    show("tensor bad device", lambda: torch.tensor([1], device="nodevice"))
    show("as_tensor shares", lambda: torch.as_tensor(t) is t)
    show("as_tensor dtype", lambda: torch.as_tensor([1, 2], dtype=torch.float16))
    show("as_tensor positional dtype", lambda: torch.as_tensor([1, 2], torch.float16))
    show("asarray", lambda: torch.asarray([1, 2], dtype=torch.int8, device="cpu"))
    show("asarray copy", lambda: torch.asarray(t, copy=True) is t)
    show("new_tensor", lambda: t.new_tensor([1, 2]))
    show("new_tensor device", lambda: t.new_tensor([1, 2], device="cpu", dtype=torch.int16))
    show("zeros", lambda: torch.zeros(2, 2, dtype=torch.int32))
    show("empty_like strides", lambda: torch.empty_like(img, memory_format=torch.channels_last).stride())
    show("randn seeded", lambda: (torch.manual_seed(0), torch.randn(3))[1])
    with torch.device("meta"):
        show("device ctx tensor", lambda: torch.tensor(0).device)
        show("device ctx as_tensor", lambda: torch.as_tensor([1.0]).device)
        show("device ctx asarray", lambda: torch.asarray([1.0]).device)
        show("device ctx zeros", lambda: torch.zeros(2).device)
        show("device ctx BatchNorm buffer", lambda: torch.nn.BatchNorm1d(4).num_batches_tracked.device)
    torch.set_default_device("meta")
    show("default device tensor", lambda: torch.tensor([1, 2]).device)
    torch.set_default_device(None)
    show("ignored functions", lambda: torch.tensor in torch.overrides.get_ignored_functions())
    m = torch.nn.Linear(2, 2)
    show("Module.to dtype", lambda: m.to(torch.float64).weight.dtype)
    show("Module.to device", lambda: type(m.to("cpu").weight).__name__)
    show("Module.to non_blocking", lambda: m.to("cpu", non_blocking=True) is m)
    show("Module.to memory_format", lambda: m.to(memory_format=torch.channels_last).weight.stride())
    show("torch_function stack", lambda: torch._C._len_torch_function_stack())
    show("Tensor.to name", lambda: (torch.Tensor.to.__name__, torch.Tensor.to.__doc__ == torch._C.TensorBase.to.__doc__))

    @torch.jit.script
    def scripted(x: torch.Tensor):
        return torch.tensor([1.0]) + torch.as_tensor([2.0]) + x.to(torch.float64)

    show("torchscript", lambda: scripted(torch.ones(1)))

    def dynamo_fn(x):
        return torch.tensor([1.0]) + x.to(torch.float64) + torch.asarray([1.0])

    show("dynamo", lambda: torch.compile(dynamo_fn, backend="eager", fullgraph=True)(torch.ones(1)))
    """
)


def _transcript(mode: str, tmp_path) -> list[str]:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ)
    proc = subprocess.run(
        [sys.executable, str(script), mode], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


def test_plain_torch_calls_behave_exactly_as_without_spmdtorch(tmp_path):
    without = _transcript("without", tmp_path)
    with_import = _transcript("with", tmp_path)
    assert len(without) > 40
    assert any("raises" in line for line in without)  # the error paths are compared too
    for a, b in zip(without, with_import):
        assert a == b
    assert len(without) == len(with_import)


def test_no_global_torch_function_mode_after_import():
    # A global TorchFunctionMode would see (and tax) every CPU torch call.
    assert torch._C._len_torch_function_stack() == 0


def test_xla_entry_points_still_route_to_xla():
    cpu = torch.arange(4.0)
    assert cpu.to("xla").device.type == "xla"
    assert cpu.to(torch.device("xla"), torch.float64).dtype == torch.float64
    assert cpu.to(device="xla:0", copy=True).device.type == "xla"
    assert torch.tensor([1.0], device="xla").device.type == "xla"
    assert torch.as_tensor([1.0], device="xla").device.type == "xla"
    assert torch.asarray([1.0], device="xla").device.type == "xla"
    assert cpu.new_tensor([1.0], device="xla").device.type == "xla"
    x = cpu.to("xla")
    assert cpu.to(x).device.type == "xla"  # .to(other) takes other's device
    assert x.to("xla") is x
    assert x.to("xla", copy=True) is not x
    assert torch.equal(x.to("xla", copy=True).cpu(), cpu)
    with torch.device("xla"):  # the default device reaches the from-data functions too
        assert torch.tensor([1.0, 2.0]).device.type == "xla"
        assert torch.as_tensor([1.0]).device.type == "xla"
        assert torch.zeros(2).device.type == "xla"
    assert torch.tensor([1.0]).device.type == "cpu"
    m = torch.nn.Linear(2, 2).to("xla")
    assert m.weight.device.type == "xla" and isinstance(m.weight, torch.nn.Parameter)
    w = torch.ones(2, requires_grad=True)
    (w.to("xla") * 3).sum().backward()
    assert torch.equal(w.grad, torch.full((2,), 3.0))
