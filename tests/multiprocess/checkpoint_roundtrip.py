"""Save a sharded training state on one topology, restore it on another.

    python -m spmdtorch.launch --nprocs 2 --devices-per-proc 4 \\
        tests/multiprocess/checkpoint_roundtrip.py save DIR MESH
    python -m spmdtorch.launch --nprocs 1 --devices-per-proc 8 \\
        tests/multiprocess/checkpoint_roundtrip.py load DIR MESH EXPECTED [SAVE_TO]

``MESH`` is the mesh shape over every device of the job: ``8`` (axis ``x``)
or ``2x4`` (axes ``a``, ``b``); each shape shards the parameters its own way,
with uneven dims (10 rows over 4 or 8 devices).

``save`` takes one AdamW step on a seeded model, checks it against the same
step in eager CPU torch, saves ``{"model", "optim", "step"}`` to ``DIR`` and
(process 0 only) the state's values as CPU tensors to ``DIR.expected.pt``.
``load`` builds the model from another seed, restores ``DIR`` into it, checks
every value bit for bit against ``EXPECTED``, checks the shardings were kept,
and optionally saves the restored state to ``SAVE_TO``. Every process prints
``RESULT {...}``; a mismatch exits non-zero.
"""

from __future__ import annotations

import json
import sys

import spmdtorch.runtime as xr

SEED = 0
LR = 0.1
STEP = 7  # the plain int saved beside the tensors


def make_model(seed: int):
    import torch

    torch.manual_seed(seed)
    # 0.weight (10, 6), 0.bias (10,), 2.weight (8, 10), 2.bias (8,)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 8))


def batch():
    import torch

    return torch.randn(4, 6, generator=torch.Generator().manual_seed(1))


def train_step(model, opt, x) -> None:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def make_mesh(desc: str):
    """The mesh and the partition spec of each parameter for mesh shape ``desc``."""
    import numpy as np

    from spmdtorch.mesh import Mesh

    shape = tuple(int(n) for n in desc.split("x"))
    n = int(np.prod(shape))
    if shape == (n,):
        specs = {"0.weight": ("x", None), "0.bias": ("x",), "2.weight": (None, "x"), "2.bias": (None,)}
        return Mesh(np.arange(n), shape, ("x",)), specs
    if len(shape) == 2:
        specs = {"0.weight": ("b", "a"), "0.bias": (("a", "b"),), "2.weight": ("a", "b"), "2.bias": (None,)}
        return Mesh(np.arange(n), shape, ("a", "b")), specs
    raise SystemExit(f"mesh {desc!r}: expected N or AxB")


def sharded_model(seed: int, mesh_desc: str):
    import torch

    from spmdtorch.partition import get_sharding_spec, mark_sharding

    mesh, specs = make_mesh(mesh_desc)
    model = make_model(seed).to("xla")
    for name, p in model.named_parameters():
        mark_sharding(p, mesh, specs[name])
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    return model, opt, {name: get_sharding_spec(p) for name, p in model.named_parameters()}


def values(model, opt) -> dict:
    """Every tensor of the state as a CPU tensor (a collective: every process calls it)."""
    sd = opt.state_dict()
    return {
        "model": {k: v.cpu() for k, v in model.state_dict().items()},
        "optim": {i: {k: v.cpu() for k, v in s.items()} for i, s in sd["state"].items()},
    }


def state_of(model, opt, step):
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def save(directory: str, mesh_desc: str) -> dict:
    import torch

    from spmdtorch import checkpoint

    model, opt, specs = sharded_model(SEED, mesh_desc)
    train_step(model, opt, batch().to("xla"))
    got = values(model, opt)
    # The state is what eager CPU torch computes (float rounding apart), so
    # the checkpoint holds a real trained state, not zeros.
    ref_model = make_model(SEED)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=LR)
    train_step(ref_model, ref_opt, batch())
    ref = values(ref_model, ref_opt)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    checkpoint.save(directory, state_of(model, opt, STEP))
    if xr.process_index() == 0:
        torch.save(got, directory.rstrip("/") + ".expected.pt")
    return {"saved": sorted(got["model"]), "specs": specs}


def load(directory: str, mesh_desc: str, expected_file: str, save_to: str | None) -> dict:
    import torch

    from spmdtorch import checkpoint
    from spmdtorch.partition import get_sharding_spec

    expected = torch.load(expected_file, weights_only=True)
    model, opt, specs = sharded_model(SEED + 1, mesh_desc)
    checkpoint.init_optimizer_state(opt)
    before = values(model, opt)
    for k, v in expected["model"].items():  # the load has something to change
        if torch.equal(before["model"][k], v):
            raise SystemExit(f"model[{k!r}] already equals the checkpoint before loading")
    state = checkpoint.load(directory, state_of(model, opt, 0))
    opt.load_state_dict(state["optim"])
    if state["step"] != STEP:
        raise SystemExit(f"step: restored {state['step']!r}, expected {STEP}")
    got = values(model, opt)
    mismatches = []
    for group in ("model", "optim"):
        if sorted(got[group]) != sorted(expected[group]):
            raise SystemExit(f"{group}: keys {sorted(got[group])}, expected {sorted(expected[group])}")
    for k, v in expected["model"].items():
        if not torch.equal(got["model"][k], v):
            mismatches.append(f"model[{k!r}]: max diff {(got['model'][k] - v).abs().max()}")
    for i, s in expected["optim"].items():
        if sorted(got["optim"][i]) != sorted(s):
            raise SystemExit(f"optim state {i}: keys {sorted(got['optim'][i])}, expected {sorted(s)}")
        for k, v in s.items():
            g = got["optim"][i][k]
            if g.dtype != v.dtype or not torch.equal(g, v):
                mismatches.append(
                    f"optim[{i}][{k!r}]: got {g.dtype} {g.flatten()[:4]}, expected {v.dtype} {v.flatten()[:4]}"
                )
    if mismatches:
        raise SystemExit("restored values differ from the saved ones:\n" + "\n".join(mismatches))
    after = {name: get_sharding_spec(p) for name, p in model.named_parameters()}
    if after != specs:
        raise SystemExit(f"load changed the shardings: {specs} -> {after}")
    if save_to:
        checkpoint.save(save_to, state_of(model, opt, state["step"]))
    # The restored optimizer's moments live in the parameters' shardings: one
    # more step runs (with cross-process collectives when P > 1).
    train_step(model, opt, batch().to("xla"))
    if not all(torch.isfinite(p.cpu()).all() for p in model.parameters()):
        raise SystemExit("the step after the restore produced non-finite parameters")
    n = len(expected["model"]) + sum(len(s) for s in expected["optim"].values())
    return {"checked": n, "specs": specs}


def main(argv: list[str]) -> dict:
    xr.initialize_distributed()
    mode, directory, mesh_desc, *rest = argv
    out = {
        "process_index": xr.process_index(),
        "process_count": xr.process_count(),
        "devices": xr.global_runtime_device_count(),
        "mode": mode,
        "mesh": mesh_desc,
    }
    if mode == "save":
        out.update(save(directory, mesh_desc))
    elif mode == "load":
        out.update(load(directory, mesh_desc, rest[0], rest[1] if len(rest) > 1 else None))
    else:
        raise SystemExit(f"mode {mode!r}: expected save or load")
    return out


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1:])), flush=True)
