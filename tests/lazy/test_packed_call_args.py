"""Python numbers that change every step reach the program without a ``jax.device_put`` of their own.

The numbers of a program (lifted Python floats, ints, bools) are packed into
one vector per kind (``executor._packed_array``). A set of values seen for
the first time is passed to the executable as a numpy vector, which the call
copies to its input placement; only a set seen again is put on the devices
and kept. AdamW's bias corrections, Python floats of the step count, change
every step: a device_put each step cost ~0.55 ms of host CPU on a tiny
decoder's 8-device step. Values are compared with eager CPU torch.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch.lazy import ENGINE
from spmdtorch.mesh import Mesh
from spmdtorch.sharding import mark_sharding


@pytest.fixture
def device_puts(monkeypatch):
    """The ``jax.device_put`` calls made while the fixture is active."""
    calls: list[object] = []
    real = jax.device_put

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(jax, "device_put", counting)
    return calls


def _step(x: torch.Tensor, scale: float, shift: float) -> torch.Tensor:
    return x * scale + shift


@pytest.mark.parametrize("sharded", [False, True], ids=["default-placement", "mesh"])
def test_new_numbers_are_copied_by_the_call_repeated_ones_kept(device_puts, sharded):
    x_cpu = torch.arange(16.0).reshape(8, 2)
    x = x_cpu.to("xla")
    if sharded:
        mark_sharding(x, Mesh(np.arange(8), (8,), ("d",)), ("d", None))
    spmdtorch.sync()
    for scale, shift in ((2.5, 0.75), (2.25, 0.5)):  # compiles (the lowering puts its numbers on the devices)
        y = _step(x, scale, shift)
        spmdtorch.sync()
    device_puts.clear()

    # New values every step: each set reaches the program as a numpy vector copied by the call.
    for i in range(3):
        scale, shift = 1.5 + i / 7, 0.25 * i - 3.0
        y = _step(x, scale, shift)
        spmdtorch.sync()
        torch.testing.assert_close(y.cpu(), _step(x_cpu, scale, shift))
    assert device_puts == []
    assert any(type(v) is np.ndarray for v in ENGINE.packed_arrays.values())

    # A set seen again is put on the devices once, then reused.
    for _ in range(3):
        y = _step(x, 1.5 + 1 / 7, -2.75)  # step 1's numbers
        spmdtorch.sync()
        torch.testing.assert_close(y.cpu(), _step(x_cpu, 1.5 + 1 / 7, -2.75))
    assert len(device_puts) == 1


def test_a_lowered_program_gets_device_arrays(device_puts):
    # Inspection lowers the program: its packed arguments must carry their placement.
    x = torch.arange(4.0).to("xla")
    spmdtorch.sync()
    y = _step(x, 1.5 + 1 / 3, 0.125)
    hlo = spmdtorch.debug.get_hlo_text([y])
    assert "multiply" in hlo
    assert device_puts, "lowering put the new numbers on the devices"
    torch.testing.assert_close(y.cpu(), _step(torch.arange(4.0), 1.5 + 1 / 3, 0.125))


def test_under_a_transfer_guard_new_numbers_are_put_explicitly(device_puts):
    # The call's copy of a numpy vector is an implicit transfer, which a guard refuses.
    x = torch.arange(4.0).to("xla")
    for scale in (2.5, 2.25):  # compiles
        y = _step(x, scale, 0.5)
        spmdtorch.sync()
    device_puts.clear()
    with jax.transfer_guard_host_to_device("disallow"):
        y = _step(x, 1.5 + 2 / 7, 0.375)
        spmdtorch.sync()
    assert len(device_puts) == 1
    torch.testing.assert_close(y.cpu(), _step(torch.arange(4.0), 1.5 + 2 / 7, 0.375))
