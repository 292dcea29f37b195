"""Meshes and shardings on a 4-device runtime (a fresh process: XLA fixes the
device count when its CPU backend starts, and this session has 8)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    r"""
    import numpy as np
    import jax
    import torch

    import spmdtorch
    from spmdtorch.mesh import Mesh, MeshError, MeshShapeError
    from spmdtorch.partition import get_sharding_spec, local_shards, mark_sharding

    assert jax.device_count() == 4, jax.devices()
    assert spmdtorch.runtime.global_runtime_device_count() == 4

    # (2, 2) mesh: [[0 1] [2 3]]
    mesh = Mesh(np.arange(4), (2, 2), ("data", "model"))
    cases = [
        ((4, 4), ("data", "model"), "{devices=[2,2]0,1,2,3}"),
        ((4, 4), ("model", "data"), "{devices=[2,2]0,2,1,3}"),
        ((4, 4), ("data", None), "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}"),
        ((4, 4), (None, "data"), "{devices=[1,2,2]0,1,2,3 last_tile_dim_replicate}"),
        ((4, 4), (None, "model"), "{devices=[1,2,2]0,2,1,3 last_tile_dim_replicate}"),
        ((8,), (("model", "data"),), "{devices=[4]0,2,1,3}"),
        ((4, 4), (None, None), "{replicated}"),
    ]
    for shape, spec, expected in cases:
        t = mark_sharding(torch.zeros(shape).to("xla"), mesh, spec)
        got = get_sharding_spec(t)
        assert got == expected, (shape, spec, got, expected)

    # reversed (2, 2) mesh: [[3 2] [1 0]]
    rmesh = Mesh(np.arange(4)[::-1], (2, 2), ("data", "model"))
    t = mark_sharding(torch.zeros(4, 4).to("xla"), rmesh, ("data", "model"))
    assert get_sharding_spec(t) == "{devices=[2,2]3,2,1,0}", get_sharding_spec(t)
    t = mark_sharding(torch.zeros(4, 4).to("xla"), rmesh, (None, "model"))
    got = get_sharding_spec(t)
    assert got == "{devices=[1,2,2]3,1,2,0 last_tile_dim_replicate}", got

    # (4,) mesh
    mesh4 = Mesh(np.arange(4), (4,), ("x",))
    t = mark_sharding(torch.arange(16.0).reshape(8, 2).to("xla"), mesh4, ("x", None))
    assert get_sharding_spec(t) == "{devices=[4,1]0,1,2,3}", get_sharding_spec(t)
    shards = sorted(local_shards(t), key=lambda s: s.device_id)
    assert [s.device_id for s in shards] == [0, 1, 2, 3]
    for i, s in enumerate(shards):
        assert tuple(s.data.shape) == (2, 2), s
        assert s.data.tolist() == [[4.0 * i, 4.0 * i + 1], [4.0 * i + 2, 4.0 * i + 3]], s
    t = mark_sharding(torch.zeros(2, 8).to("xla"), mesh4, (None, 0))
    assert get_sharding_spec(t) == "{devices=[1,4]0,1,2,3}", get_sharding_spec(t)

    # a sharded matmul equals CPU
    g = torch.Generator().manual_seed(0)
    a = torch.randn(8, 12, generator=g)
    b = torch.randn(12, 16, generator=g)
    c = torch.randn(16, 4, generator=g)
    xa = mark_sharding(a.to("xla"), mesh, ("data", "model"))
    xb = mark_sharding(b.to("xla"), mesh, ("model", None))
    xc = mark_sharding(c.to("xla"), mesh, (None, "data"))
    got = torch.relu(xa @ xb) @ xc
    torch.testing.assert_close(got.cpu(), torch.relu(a @ b) @ c, rtol=1e-5, atol=1e-5)
    xa4 = mark_sharding(a.to("xla"), mesh4, (None, "x"))
    xb4 = mark_sharding(b.to("xla"), mesh4, ("x", None))
    torch.testing.assert_close((xa4 @ xb4).cpu(), a @ b, rtol=1e-5, atol=1e-5)

    # an 8-device mesh on 4 devices is refused, saying how many there are
    try:
        Mesh(np.arange(8), (8,))
    except MeshError as e:
        assert isinstance(e, MeshShapeError), type(e)
        assert "4" in str(e) and "(jax.device_count())" in str(e), str(e)
        assert "range(4)" in str(e), str(e)
    else:
        raise AssertionError("Mesh(np.arange(8), (8,)) on 4 devices did not raise")
    print("FOUR DEVICES OK")
    """
)


def test_four_device_runtime():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    env["JAX_PLATFORMS"] = "cpu"
    env["PJRT_DEVICE"] = "CPU"
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stderr}\n{proc.stdout}"
    assert "FOUR DEVICES OK" in proc.stdout, proc.stdout
