"""FSDPv2 training step: spmdtorch lazy and compiled vs a pure-JAX twin (optax AdamW).

One invocation runs every (config, mode) pair, each in its own process (so no
mode inherits another's compile cache, warm allocator or memory), and prints
one table per config with the ratios to the JAX twin:

* the model: ``spmdtorch.models.llama.LlamaForCausalLM``, ``LlamaConfig.tiny()``
  (batch 8x64; ffn_dim 176 instead of 172, because a JAX array cannot be
  sharded 8 ways on a dim 8 does not divide) and ``LlamaConfig.small()``
  (batch 8x128), on 8 simulated CPU
  devices, wrapped in ``FSDPv2`` with one wrapper per decoder layer (every
  parameter on its largest dim over ``"fsdp"``, every layer output and the
  logits on the batch dim), trained with ``torch.optim.AdamW``;
* the twin: the same decoder in ``jax.numpy`` (``benchmarks/step_time.py``),
  initialised from the same torch weights, the same parameter shardings,
  the same activation sharding constraints, ``optax.adamw`` with torch's
  defaults, one ``jax.jit`` step with donated parameters and optimizer state.

Columns (host wall-clock, ``time.perf_counter``):

* ``step ms``: steady state, N steps launched back to back then one wait,
  divided by N (the throughput a training loop gets); the median of
  ``--blocks`` (default 5) such blocks;
* interleaving and rounds: the three modes run at once, each in its own
  process, and take turns (twin block, lazy block, compiled block, twin
  block, ...; who goes first rotates), so that load from other processes over
  seconds hits each mode alike. A round's ratio is the median over blocks of
  a block's time over the twin block beside it. Every round (``--rounds``,
  default 3) starts fresh processes, set up one at a time; the table shows
  the median over rounds (all rounds' ratios beside it) and the run with the
  median ratio;
* ``first step s``: the first call, trace + compile + run, until its loss is
  ready, measured in a process of its own with no other mode's process
  alive (each round first runs every mode alone, one after the other, who
  goes first rotating: a process started beside an idle one measured
  10-25% slower first steps on 2 cores, whatever its mode, which made the
  twin, always set up first, look faster); ``warm-up s``: until the steady state (``spmdtorch.compile`` traces
  until two consecutive traces agree; lazy mode compiles again once AdamW's
  state exists);
* ``host ms/step``: host time of one steady-state step launched on an idle
  device (median of 5), i.e. without back-pressure from the steps in flight
  (lazy: recording + graph key + launch; compiled and JAX: the call);
* ``device idle``: the share of the time the devices sat idle, read off a
  profiler trace of ``TRACE_STEPS`` more steps launched back to back
  (``spmdtorch.debug.device_activity``: from the first program work to the
  last, what no work covers; on an accelerator its kernels and copies, on
  simulated CPU devices XLA's CPU client's threads as a whole). It is the
  host-bound share: the time the devices waited for the next launch (and for
  transfers). Tracing costs the host a little, so it is not taken from the
  timed blocks;
* ``CPU ms/step``: CPU time of the whole process (every thread: Python and
  the simulated devices) per steady-state step. On CPU the "devices" and the
  host share the machine's cores, so host work is not hidden behind device
  work as it is on an accelerator: with c cores a step takes at least
  CPU ms / c; ``CPU x twin`` is its ratio to the twin's (median over rounds),
  which other tenants' load moves much less than the step time;
* ``param+opt/device``: bytes of parameters and AdamW state each device holds
  (measured on the arrays), and as a fraction of the unsharded total
  (the target is 1/8 on 8 devices);
* ``args``/``temp`` MiB: the compiled step's per-device memory analysis.

Usage:
    python benchmarks/train_step.py            # tiny and small, 3 rounds, ~6 min on a quiet 2-core machine
    python benchmarks/train_step.py --quick    # fewer steps
    python benchmarks/train_step.py --configs tiny
    python benchmarks/train_step.py --zero-grad-after   # the loop that ends with opt.zero_grad()
    python benchmarks/train_step.py --json /tmp/ts.json --markdown   # also benchmarks/README.md's table
    python benchmarks/train_step.py --from-json /tmp/ts.json         # that table again, from the results
    JAX_PLATFORMS=cuda python benchmarks/train_step.py --configs 1b   # a GPU: the 1.1B decoder in bf16
    python benchmarks/train_step.py --modes lazy,lazy_pure,compiled,ptxla --ptxla-python /tmp/ptxla/bin/python

``ptxla`` adds the same step under PyTorch/XLA 2.9's lazy tensors
(``_ptxla_worker.py``: its ``SpmdFullyShardedDataParallel`` per decoder layer,
``torch.optim.AdamW``, one ``torch_xla.sync()`` per step) as one more worker
taking turns with the others, and a column with each lazy mode's ratio to it
(issue 19's target: at most 0.5). PyTorch/XLA 2.9 needs torch 2.9, so it runs
in an interpreter of its own: ``python -m venv /tmp/ptxla && /tmp/ptxla/bin/pip
install torch==2.9.0 torch_xla==2.9.0 numpy``.

On an accelerator every mode runs on all its devices (each process takes an
equal share of their memory), and the table adds tokens/s, MFU (PaLM's FLOP
count, ``model_flops``, over the device kind's dense bf16 peak) and the
host's share of a step: under 100%, each step is launched before the device
finishes the one before; ``device idle`` says how long the device waited
nonetheless.
"""

from __future__ import annotations

import os
import sys

from spmdtorch.runtime.cpu_devices import simulate_cpu_devices

_NUM_DEVICES = 8  # simulated CPU devices; on an accelerator, every device (_num_devices)
if __name__ == "__main__":  # before anything queries devices (also in each worker process)
    simulate_cpu_devices(_NUM_DEVICES, unless_accelerator=True)

import argparse
import contextlib
import dataclasses
import datetime
import functools
import json
import platform
import queue
import shutil
import statistics
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import NamedTuple

from _train_setup import (
    BETAS,
    CONFIGS,
    EPS,
    HOST_STEPS,
    LR,
    TRACE_STEPS,
    WARMUP_STEPS,
    WD,
    Session,
    make_train_step,
    model_flops,
    now,
    serve,
    setup,
)
from _train_setup import dtype_name as _dtype_name

# Dense bf16 peak by device kind (vendor datasheets, SXM parts), for MFU.
PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
# *_pure: every decoder layer marked `spmdtorch.assume_pure` (recorded once,
# then one node per layer call and one per its backward, differentiated by jax.vjp).
# ptxla: the same step under PyTorch/XLA 2.9's lazy tensors (_ptxla_worker.py), run by the
# interpreter --ptxla-python names (PyTorch/XLA needs its own torch).
# dynamo: the lazy step with the model torch.compile'd (backend="spmdtorch"; issue 46).
# dtensor: the lazy step with the model laid out through spmdtorch.dtensor (torch's
# DTensor placements, FSDPv2's layout: dtensor_step; issue 43); compiled_dtensor: that
# step under spmdtorch.compile. ptxla stays last.
ALL_MODES = ("jax", "lazy", "lazy_pure", "compiled", "compiled_pure", "dynamo", "dtensor", "compiled_dtensor", "ptxla")
MODES = ALL_MODES  # the driver narrows it with --modes ("jax" always runs)
PTXLA_PYTHON: str | None = None  # --ptxla-python
# --baseline: another checkout of spmdtorch (e.g. `git worktree add /tmp/base
# <commit>`); each spmdtorch mode M also runs as "M@base", its worker started
# from that checkout's own benchmarks/train_step.py with that checkout first
# on PYTHONPATH, so a change is timed before/after in one alternating run.
BASELINE: Path | None = None
BASE_SUFFIX = "@base"
TARGETS = {"compiled": 1.00, "compiled_pure": 1.00, "lazy": 1.25, "lazy_pure": 1.25, "first": 1.1}  # issue 19
TARGETS["dynamo"] = 1.10  # issue 46, item 4
# Issue 19: a lazy step at most half of PyTorch/XLA's (both ratios to the same round's twin).
PTXLA_TARGET = 0.5
# The steady state is timed as blocks of N steps, the three modes' blocks
# interleaved (run_round), and a ratio is the median over blocks of a block's
# time over the twin's block next to it: on a shared 2-core machine the twin
# alone moved 15-20% between runs minutes apart, and one hiccup (another
# process waking up) moved a single ~20 ms tiny block by up to 25%.
BLOCKS = 5


# =============================================================================
# Worker: one (config, mode) in this process; prints one JSON line.
# =============================================================================


def _shard_bytes(arr) -> int:
    """Bytes of ``arr`` on one device (its first addressable shard)."""
    return int(arr.addressable_shards[0].data.nbytes)


def _num_devices() -> int:
    """The devices the step runs on: 8 simulated CPU devices, or every accelerator."""
    import jax

    return jax.device_count()


def _setup(cfg_name: str, seq: int | None = None, dtype: str | None = None):
    """The config, the torch model (seed 0, in ``dtype``) and a token batch for the devices jax sees."""
    return setup(cfg_name, _num_devices(), seq=seq, dtype=dtype)


def _device_info(cfg, tokens) -> dict:
    """The device kind, its dense bf16 peak if known, and the step's model FLOPs."""
    import jax

    dev = jax.devices()[0]
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in dev.device_kind), None)
    return {
        "devices": jax.device_count(),
        "device_kind": dev.device_kind,
        "platform": dev.platform,
        "peak_flops": peak,
        "flops": model_flops(cfg, *tokens.shape),
        "tokens": int(tokens.numel()),
    }


def adamw_tx():
    """``optax.adamw`` with torch.optim.AdamW's defaults."""
    import optax

    return optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD)


@dataclasses.dataclass
class JaxTwin:
    """The pure-JAX twin's training step: ``jitted(params, opt_state, tokens) -> (params, opt_state, loss)``."""

    jitted: object
    params: dict
    opt_state: object
    tokens: object
    loss_fn: object


def fsdp_dim(shape) -> int:
    """The dim FSDPv2 shards a parameter of ``shape`` on: its largest (the first on a tie)."""
    return max(range(len(shape)), key=lambda d: (shape[d], -d))


def jax_twin(cfg, model, tokens, *, remat: bool = False, tx=None) -> JaxTwin:
    """The decoder in jax.numpy with FSDPv2's shardings and constraints, ``tx`` (default AdamW), donated state.

    ``remat``: every decoder layer under ``jax.checkpoint``.
    """
    sys.path.insert(0, str(Path(__file__).parent))
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P
    from step_time import make_jax_llama_loss  # first: it checks that jax has not started

    mesh = Mesh(np.array(jax.devices()), ("fsdp",))

    def fsdp_spec(shape):  # FSDPv2's rule over "fsdp"
        dim = fsdp_dim(shape)
        return NamedSharding(mesh, P(*[("fsdp" if d == dim else None) for d in range(len(shape))]))

    def to_jax(v):  # numpy has no bfloat16: through float32 (exact), then ml_dtypes' bfloat16 (exact)
        dtype = jnp.dtype(str(v.dtype).removeprefix("torch."))
        return jax.device_put(v.detach().float().numpy().astype(dtype), fsdp_spec(v.shape))

    params = {k: to_jax(v) for k, v in model.state_dict().items()}
    tok = jax.device_put(tokens.numpy().astype(np.int32), NamedSharding(mesh, P("fsdp", None)))
    loss_fn = make_jax_llama_loss(cfg, act_sharding=NamedSharding(mesh, P("fsdp", None, None)), remat=remat)
    tx = tx or adamw_tx()
    replicated = NamedSharding(mesh, P())
    # Moments sharded like their params (the same rule), the step counter replicated.
    state_sh = jax.tree.map(lambda a: fsdp_spec(a.shape) if a.ndim else replicated, jax.eval_shape(tx.init, params))
    opt_state = jax.jit(tx.init, out_shardings=state_sh)(params)

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    param_sh = jax.tree.map(lambda a: a.sharding, params)
    opt_sh = jax.tree.map(lambda a: a.sharding, opt_state)
    jitted = jax.jit(step, donate_argnums=(0, 1), out_shardings=(param_sh, opt_sh, replicated))
    return JaxTwin(jitted, params, opt_state, tok, loss_fn)


def spmdtorch_step(model, tokens, *, auto_wrapper_callable=None, zero_grad_after: bool = False):
    """The model under FSDPv2 per decoder layer, its AdamW, the sharded tokens and the (uncompiled) step.

    ``zero_grad_after``: see ``_train_setup.make_train_step``.
    """
    import numpy as np
    import torch

    from spmdtorch.mesh import Mesh
    from spmdtorch.models.llama import DecoderLayer
    from spmdtorch.partition import FSDPv2, mark_sharding, transformer_auto_wrap_policy

    n = _num_devices()
    mesh = Mesh(np.arange(n), (n,), ("fsdp",))
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(model, mesh=mesh, auto_wrap_policy=policy, auto_wrapper_callable=auto_wrapper_callable)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    tok = mark_sharding(tokens.to("xla"), mesh, ("fsdp", None))
    return model, opt, tok, make_train_step(model, opt, zero_grad_after)


def dtensor_step(model, tokens, *, zero_grad_after: bool = False):
    """``spmdtorch_step``'s model laid out through ``spmdtorch.dtensor`` (torch's DTensor API) instead of FSDPv2.

    The same layout in torch.distributed's terms (issue 43): on a 1-D
    ``"fsdp"`` mesh every parameter is ``Shard(d)``, ``d`` the dim FSDPv2
    shards (``distribute_module``), the tokens are ``Shard(0)``, and each
    decoder layer's output and the logits are redistributed to ``Shard(0)``,
    as FSDPv2 annotates every wrapped module's output. What differs is inside
    a layer: each op's result carries the placement torch's sharding
    propagation gives it (an annotation), where the FSDPv2 model leaves it to
    GSPMD, and every op pays DTensor's dispatch on the host.

    Returns:
        The model, its AdamW, the tokens and the (uncompiled) step, as
        ``spmdtorch_step``; the step's loss is an ``XlaDTensor`` (replicated).
    """
    import torch
    from torch.distributed.tensor import DTensor, Shard

    from spmdtorch.dtensor import distribute_module, distribute_tensor, init_device_mesh
    from spmdtorch.models.llama import DecoderLayer

    n = _num_devices()
    mesh = init_device_mesh("xla", (n,), mesh_dim_names=("fsdp",))

    def partition(_name, module, mesh):
        for key, param in list(module.named_parameters(recurse=False)):
            placed = distribute_tensor(param.data, mesh, [Shard(fsdp_dim(param.shape))])
            module.register_parameter(key, torch.nn.Parameter(placed, requires_grad=param.requires_grad))

    def batch_sharded(_module, _inputs, output):
        return output.redistribute(mesh, [Shard(0)]) if isinstance(output, DTensor) else output

    model = distribute_module(model.to("xla"), mesh, partition)
    for module in model.modules():
        if isinstance(module, DecoderLayer) or module is model:
            module.register_forward_hook(batch_sharded)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    tok = distribute_tensor(tokens, mesh, [Shard(0)])
    return model, opt, tok, make_train_step(model, opt, zero_grad_after)


def compilable_dtensor_step(train_step, opt, tok):
    """``dtensor_step``'s step in the form ``spmdtorch.compile`` replays today: ``(step, tokens)``.

    Two gaps of ``spmdtorch.compile`` with DTensors (issue 43), worked around
    here: it takes no DTensor argument (it tries to upload one as a host
    tensor), so the tokens go in as their global xla tensor and are a DTensor
    again inside the step, and the loss comes out as its (replicated) global
    tensor; and it makes an optimizer capturable only when a parameter is a
    plain xla tensor, so AdamW over DTensor parameters would keep its step
    counter on the host, a new number every call, and be traced every call
    without ever replaying: its groups are made capturable here, as
    ``spmdtorch.compile`` makes them for FSDPv2's parameters.
    """
    from spmdtorch.dtensor import from_local

    for group in opt.param_groups:
        group["capturable"] = True
    mesh, placements = tok.device_mesh, tok.placements

    def step(tokens):
        return train_step(from_local(tokens, mesh, placements)).to_local()

    return step, tok.to_local()


def idle_share(logdir: str, mode: str = "") -> float | None:
    """The share of the time the devices sat idle over the trace in ``logdir``.

    ``spmdtorch.debug.device_activity``: from the first program work to the
    last, the part no work covers, averaged over the devices (on simulated CPU
    devices, XLA's CPU client as a whole). None when the trace shows no device
    work, or when no readable trace was written there (said on stderr, naming
    ``mode``: the column reads "-" and the run goes on).
    """
    from spmdtorch.debug import ProfilerArgumentError, device_activity

    try:
        acts = device_activity(logdir)
    except ProfilerArgumentError as e:
        print(f"device idle{f' of {mode}' if mode else ''}: {e}", file=sys.stderr, flush=True)
        return None
    return statistics.mean(a.idle_fraction for a in acts) if acts else None


def device_idle(run_block, capture) -> float | None:
    """``idle_share`` of ``TRACE_STEPS`` steps launched back to back, traced by ``capture(logdir)``
    (a context manager that writes a trace there).

    None, said on stderr, where the profiler cannot trace here (a GPU without
    CUPTI, say): the other columns of a long run are not lost for this one.
    """
    with tempfile.TemporaryDirectory() as logdir:
        with contextlib.ExitStack() as tracing:
            try:
                tracing.enter_context(capture(logdir))
            except RuntimeError as e:  # the profiler cannot start here (jaxlib raises RuntimeError)
                print(f"device idle: no trace ({e})", file=sys.stderr, flush=True)
                return None
            run_block(TRACE_STEPS)  # the step's own errors are not the profiler's: they propagate
        return idle_share(logdir)


def session_jax(cfg_name: str, warmup: int, dtype: str | None = None) -> Session:
    sys.path.insert(0, str(Path(__file__).parent))
    import jax
    import step_time  # noqa: F401  (first: it checks that jax has not started)

    cfg, model, tokens = _setup(cfg_name, dtype=dtype)
    info = _device_info(cfg, tokens)
    twin = jax_twin(cfg, model, tokens)
    jitted, tok = twin.jitted, twin.tokens
    state = {"params": twin.params, "opt": twin.opt_state, "loss": None}
    state_arrays = jax.tree.leaves((state["params"], state["opt"]))
    per_device = sum(_shard_bytes(a) for a in state_arrays)
    total = sum(int(a.nbytes) for a in state_arrays)

    def step():
        state["params"], state["opt"], state["loss"] = jitted(state["params"], state["opt"], tok)

    t0 = now()
    step()
    losses = [float(state["loss"])]
    first = now() - t0
    for _ in range(warmup - 1):
        step()
        losses.append(float(state["loss"]))
    warm = now() - t0

    def run_block(steps):
        jax.block_until_ready(state["params"])
        for _ in range(steps):
            step()
        jax.block_until_ready((state["params"], state["opt"], state["loss"]))

    def finish():
        host = []
        for _ in range(HOST_STEPS):  # an idle device: the call's own host cost, no back-pressure
            jax.block_until_ready((state["params"], state["opt"]))
            h = now()
            step()
            host.append(now() - h)
        losses.append(float(state["loss"]))
        # Compiled again (lower().compile() does not reuse the jit's executable),
        # so only here: a first-step-only worker never pays it.
        mem = jitted.lower(state["params"], state["opt"], tok).compile().memory_analysis()
        return {
            "host_ms": statistics.median(host) * 1e3,
            "device_idle": device_idle(run_block, jax.profiler.trace),
            "aten_ops": 0,
            "per_device": per_device,
            "total": total,
            "args": mem.argument_size_in_bytes,
            "temp": mem.temp_size_in_bytes,
            "compiles": 1,
            **info,
        }

    return Session(first, warm, losses, run_block, finish)


def session_spmdtorch(
    cfg_name: str, mode: str, warmup: int, zero_grad_after: bool = False, dtype: str | None = None
) -> Session:
    from torch.distributed.tensor import DTensor

    import spmdtorch
    from spmdtorch import debug
    from spmdtorch.tensor.xla_tensor import XlaTensor

    cfg, model, tokens = _setup(cfg_name, dtype=dtype)
    info = _device_info(cfg, tokens)
    make_step = dtensor_step if mode.endswith("dtensor") else spmdtorch_step
    model, opt, tok, train_step = make_step(model, tokens, zero_grad_after=zero_grad_after)

    if mode.endswith("_pure"):
        for layer in model.layers:  # the FSDPv2 wrappers of the decoder layers
            spmdtorch.assume_pure(layer)
    if mode == "dynamo":  # no annotation: the whole model under torch.compile, the step lazy
        import torch

        train_step = make_train_step(torch.compile(model, backend="spmdtorch"), opt, zero_grad_after)
    if mode == "compiled_dtensor":
        train_step, tok = compilable_dtensor_step(train_step, opt, tok)
    if mode.startswith("compiled"):
        run = spmdtorch.compile(train_step)
    else:

        def run(tokens):
            with spmdtorch.step():
                return train_step(tokens)

    compiles0 = debug.counter_value("UncachedCompile")
    t0 = now()
    losses = [run(tok).item()]
    first = now() - t0
    for _ in range(warmup - 1):
        losses.append(run(tok).item())
    warm = now() - t0
    last = {}

    def run_block(steps):
        spmdtorch.wait_device_ops()
        for _ in range(steps):
            last["loss"] = run(tok)
        spmdtorch.wait_device_ops()

    def finish():
        host, ops = [], []
        for _ in range(HOST_STEPS):  # an idle device: tracing + launch, no back-pressure
            spmdtorch.wait_device_ops()
            o = debug.counter_value("DispatchedOps")
            h = now()
            loss = run(tok)
            host.append(now() - h)
            ops.append(debug.counter_value("DispatchedOps") - o)
        losses.append(loss.item())
        state = [  # a DTensor's local tensor is the global xla tensor (spmdtorch.dtensor)
            t.to_local() if isinstance(t, DTensor) else t
            for t in [*model.parameters(), *(v for s in opt.state.values() for v in s.values())]
        ]
        state = [t for t in state if isinstance(t, XlaTensor)]
        per_device = sum(_shard_bytes(t._st.value) for t in state)
        total = sum(int(t.numel()) * t.element_size() for t in state)
        exe = run.executable() if mode.startswith("compiled") else debug.last_executable()
        mem = exe.memory_analysis()
        return {
            "host_ms": statistics.median(host) * 1e3,
            "device_idle": device_idle(run_block, debug.profile),
            # ATen ops recorded per step (0 for a compiled replay: no op is dispatched).
            "aten_ops": statistics.median(ops),
            "per_device": per_device,
            "total": total,
            "args": mem.argument_size_in_bytes,
            "temp": mem.temp_size_in_bytes,
            "compiles": debug.counter_value("UncachedCompile") - compiles0,
            **info,
        }

    return Session(first, warm, losses, run_block, finish)


def worker_main(args) -> None:
    """Serve the driver on stdin/stdout: set up, print READY, then time a block of
    steps per ``BLOCK`` line, and on ``FINISH`` print the RESULT and exit."""
    warmup = 1 if args.first_only else WARMUP_STEPS
    if args.worker == "jax":
        sess = session_jax(args.config, warmup, dtype=args.dtype)
    else:
        sess = session_spmdtorch(
            args.config, args.worker, warmup, zero_grad_after=args.zero_grad_after, dtype=args.dtype
        )
    serve(sess, args.first_only)


# =============================================================================
# Driver: runs the workers, prints the tables.
# =============================================================================


class Worker:
    """One worker process (one config and mode), driven a block at a time."""

    def __init__(
        self,
        mode: str,
        config: str,
        timeout: int,
        zero_grad_after: bool = False,
        dtype: str | None = None,
        first_only: bool = False,
    ):
        self.mode, self.timeout = mode, timeout
        self._err = tempfile.TemporaryFile(mode="w+")  # a pipe could fill up and stall the worker
        env = dict(os.environ)
        if mode == "ptxla":
            if PTXLA_PYTHON is None:
                raise ValueError("mode 'ptxla' needs --ptxla-python: an interpreter with torch_xla")
            cmd = [PTXLA_PYTHON, str(Path(__file__).with_name("_ptxla_worker.py")), "--worker", mode]
        elif mode.endswith(BASE_SUFFIX):
            if BASELINE is None:
                raise ValueError(f"mode {mode!r} needs --baseline: a checkout of spmdtorch to time beside this one")
            cmd = [sys.executable, str(BASELINE / "benchmarks" / "train_step.py"), "--worker"]
            cmd.append(mode.removesuffix(BASE_SUFFIX))
            # Ahead of site-packages, so the checkout's spmdtorch wins over an editable install of this one.
            env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(BASELINE), env.get("PYTHONPATH"))))
        else:
            cmd = [sys.executable, __file__, "--worker", mode]
        cmd += ["--config", config]
        if zero_grad_after:
            cmd.append("--zero-grad-after")
        if first_only:
            cmd.append("--first-only")
        if dtype:
            cmd += ["--dtype", dtype]
        # Every mode's process lives on the same accelerator at once: each
        # takes an equal part of its memory instead of JAX's default 75%.
        env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / len(MODES):.2f}")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, bufsize=1, env=env
        )
        self._lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        if first_only:
            self.first = self._expect("FIRST")["first_s"]
            self._exited()
        else:
            self._expect("READY")

    def _pump(self):
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _expect(self, tag: str):
        deadline = now() + self.timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - now()))
            except queue.Empty:
                self.proc.kill()
                raise RuntimeError(f"worker {self.mode} sent no {tag} within {self.timeout} s") from None
            if line is None:
                self.proc.wait()
                self._err.seek(0)
                raise RuntimeError(
                    f"worker {self.mode} exited ({self.proc.returncode}) before {tag}:\n{self._err.read()[-3000:]}"
                )
            if line == tag + "\n" or line.startswith(tag + " "):
                return json.loads(line[len(tag) + 1 :]) if line.startswith(tag + " ") else None

    def block(self, steps: int) -> tuple[float, float]:
        self.proc.stdin.write(f"BLOCK {steps}\n")
        self.proc.stdin.flush()
        return tuple(self._expect("BLOCK"))

    def finish(self) -> dict:
        self.proc.stdin.write("FINISH\n")
        self.proc.stdin.flush()
        res = self._expect("RESULT")
        self._exited()
        trace_dir = res.pop("trace_dir", None)
        if trace_dir is not None:  # PyTorch/XLA's worker has no jax to read its trace with
            res["device_idle"] = idle_share(trace_dir, self.mode)
            shutil.rmtree(trace_dir, ignore_errors=True)
        return res

    def _exited(self) -> None:
        """Wait for the worker to exit after its last message."""
        self.proc.wait(timeout=self.timeout)
        self._err.close()


def _rotated(modes: tuple, k: int) -> tuple:
    """``modes`` starting at position ``k`` (mod its length): who goes first takes turns."""
    k %= len(modes)
    return modes[k:] + modes[:k]


def run_round(
    config: str,
    steps: int,
    blocks: int,
    timeout: int,
    zero_grad_after: bool = False,
    dtype: str | None = None,
    rnd: int = 0,
) -> dict:
    """Every mode's first step alone, then every mode in its own process, set
    up one after the other, their blocks interleaved (twin, lazy, compiled,
    twin, ...) so that the machine's drift over seconds (other tenants) hits
    each mode alike. ``rnd`` (the round's number) rotates who goes first in
    the first-step phase."""
    firsts = {}
    for mode in _rotated(MODES, rnd):  # alone: no other worker alive (see the module docstring)
        firsts[mode] = Worker(mode, config, timeout, zero_grad_after, dtype, first_only=True).first
    workers = []
    try:
        for mode in MODES:  # one at a time: first steps and compiles do not overlap
            workers.append(Worker(mode, config, timeout, zero_grad_after, dtype))
        times = {mode: [] for mode in MODES}
        for b in range(blocks):
            order = _rotated(MODES, b)
            for w in sorted(workers, key=lambda w: order.index(w.mode)):
                times[w.mode].append(w.block(steps))
        out = {}
        for w in workers:
            res = w.finish()
            walls = [t[0] for t in times[w.mode]]
            res["step_ms"] = statistics.median(walls) * 1e3
            res["cpu_ms"] = statistics.median(t[1] for t in times[w.mode]) * 1e3
            res["blocks_ms"] = [x * 1e3 for x in walls]
            # The first step the table reports is the one measured alone; the
            # one this worker measured while set up beside the others is kept.
            res["first_s_beside"], res["first_s"] = res["first_s"], firsts[w.mode]
            out[w.mode] = res
        return out
    finally:
        for w in workers:
            if w.proc.poll() is None:
                w.proc.kill()


# Row labels of the modes that are not spmdtorch's (the rich tables prefix the others with "spmdtorch").
_MODE_LABELS = {"jax": "JAX twin", "ptxla": "PyTorch/XLA 2.9 lazy"}


def mode_label(mode: str, prefix: str = "") -> str:
    """A mode's row label: ``prefix`` before spmdtorch's modes; ``--baseline``'s rows name the checkout."""
    if mode in _MODE_LABELS:
        return _MODE_LABELS[mode]
    if mode.endswith(BASE_SUFFIX):
        return f"{prefix}{mode.removesuffix(BASE_SUFFIX)} (baseline {BASELINE_NAME})"
    return prefix + mode


BASELINE_NAME = "baseline"  # --baseline's commit (git rev-parse --short HEAD there), set by main


def block_ratios(runs: list[dict], base: list[dict]) -> list[float]:
    """Per round, the median over blocks of a block's time over ``base``'s block beside it."""
    return [statistics.median(b / t for b, t in zip(r["blocks_ms"], j["blocks_ms"])) for r, j in zip(runs, base)]


class ModeStats(NamedTuple):
    """One mode of one config over its rounds (each list: one value per round).

    Attributes:
        ratios: step time over the twin's (``block_ratios``).
        first: first step over the twin's.
        cpu: whole-process CPU per step over the twin's.
        vs_ptxla: a lazy mode's step time over PyTorch/XLA's (None: not a lazy mode, or no ptxla run).
        shown: the round whose step-time ratio is the median one (the upper of two middles), as the tables show it.
    """

    ratios: list[float]
    first: list[float]
    cpu: list[float]
    vs_ptxla: list[float] | None
    shown: dict


def mode_stats(runs: dict) -> dict[str, ModeStats]:
    """Every mode's ``ModeStats`` from one config's results (mode -> one result per round)."""
    twin = runs["jax"]
    out = {}
    for mode, rounds in runs.items():
        ratios = block_ratios(rounds, twin)
        out[mode] = ModeStats(
            ratios=ratios,
            first=[r["first_s"] / j["first_s"] for r, j in zip(rounds, twin)],
            cpu=[r["cpu_ms"] / j["cpu_ms"] for r, j in zip(rounds, twin)],
            vs_ptxla=block_ratios(rounds, runs["ptxla"]) if "ptxla" in runs and mode.startswith("lazy") else None,
            shown=rounds[sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]],
        )
    return out


def rounds_text(xs: list[float]) -> str:
    """Every round's value, as the tables print them in brackets."""
    return " ".join(f"{x:.2f}" for x in xs)


def markdown_table(raw: dict) -> str:
    """The Markdown table of ``benchmarks/README.md`` from ``--json``'s ``configs`` (every round's results).

    One row per config and mode: the round with the median step-time ratio,
    ratios as medians over rounds with every round's in brackets.
    """
    header = (
        "| config | mode | step ms | × twin [rounds] | × PyTorch/XLA [rounds] | first step s (× twin) [rounds] "
        "| host ms/step | device idle | ATen ops/step, µs/op | CPU ms/step (× twin) | compiles |"
    )
    lines = [header, "|---|---|---:|---|---|---|---:|---:|---|---|---:|"]

    def med(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f} [{rounds_text(xs)}]"

    for cfg, runs in raw.items():
        stats = mode_stats(runs)
        for mode in (m for m in ALL_MODES if m in runs):
            st = stats[mode]
            r = st.shown
            if mode == "jax":
                ratio, first = "1.00", f"{r['first_s']:.2f} (1.00)"
            else:
                ratio = med(st.ratios)
                first = f"{r['first_s']:.2f} ({statistics.median(st.first):.2f}) [{rounds_text(st.first)}]"
            vs = "1.00" if mode == "ptxla" else "–" if st.vs_ptxla is None else med(st.vs_ptxla)
            ops = f"{r['aten_ops']:.0f}, {r['host_ms'] * 1e3 / r['aten_ops']:.1f}" if r["aten_ops"] else "–"
            lines.append(
                f"| {cfg} | {mode_label(mode)} | {r['step_ms']:.1f} | {ratio} | {vs} | {first} "
                f"| {r['host_ms']:.2f} | {idle_text(r, '–')} | {ops} | {r['cpu_ms']:.0f} ({statistics.median(st.cpu):.2f}) "
                f"| {r['compiles']} |"
            )
    return "\n".join(lines)


def idle_text(r: dict, missing: str = "-") -> str:
    """A result's device idle share (``device_idle``), or ``missing`` where none was traced
    (a run from before it was measured, or a trace with no device work)."""
    idle = r.get("device_idle")
    return missing if idle is None else f"{idle:.0%}"


def machine_line() -> str:
    import jax
    import torch

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; python "
        f"{platform.python_version()}, torch {torch.__version__}, jax {jax.__version__}; "
        f"{datetime.date.today().isoformat()}"
    )  # the devices: in each table's title (the driver itself never starts a backend)


def accel_cells(r: dict) -> tuple[str, str, str]:
    """tokens/s, MFU and the host's share of a steady-state step, for one mode's result."""
    step_s = r["step_ms"] / 1e3
    mfu = f"{r['flops'] / step_s / r['peak_flops']:.1%}" if r["peak_flops"] else "-"
    return f"{r['tokens'] / step_s:,.0f}", mfu, f"{r['host_ms'] / r['step_ms']:.0%}"


def _first_target(mode: str) -> float | None:
    """The first-step target of a spmdtorch mode (PyTorch/XLA's row has none)."""
    return None if mode == "ptxla" else TARGETS["first"]


def _vs_ptxla_cell(rounds: list[float] | None, mode: str) -> str:
    """A lazy mode's ratio to PyTorch/XLA's lazy step (target PTXLA_TARGET), every round's in brackets."""
    if mode == "ptxla":
        return "1.00x"
    if rounds is None:
        return "-"
    return f"{ratio_cell(rounds, PTXLA_TARGET)} [{rounds_text(rounds)}]"


def ratio_cell(rounds: list[float], target: float | None) -> str:
    """The median of the rounds' ratios, marked against its target (None: no target).

    A target counts as met only when every round meets it; a median under the
    target with a round over it is marked as such.
    """
    median = statistics.median(rounds)
    if target is None:
        return f"{median:.2f}x"
    if max(rounds) <= target:
        mark = "[green]ok[/]"
    elif median <= target:
        mark = "[yellow]not every round[/]"
    else:
        mark = "[red]over[/]"
    return f"{median:.2f}x (<= {target}) {mark}"


def _set_baseline(p: argparse.ArgumentParser, checkout: Path) -> None:
    """Check ``--baseline``'s checkout and add its ``M@base`` twin after every spmdtorch mode ``M``."""
    global MODES, BASELINE, BASELINE_NAME
    script = checkout / "benchmarks" / "train_step.py"
    if not script.is_file() or not (checkout / "spmdtorch" / "__init__.py").is_file():
        p.error(f"--baseline {checkout}: not a spmdtorch checkout (no {script} or spmdtorch/__init__.py)")
    BASELINE = checkout.resolve()
    rev = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    BASELINE_NAME = rev.stdout.strip() if rev.returncode == 0 else checkout.name
    ours = [m for m in MODES if m not in ("jax", "ptxla")]
    MODES = (*MODES, *(m + BASE_SUFFIX for m in ours))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--configs", default="tiny,small,deep", help="comma-separated: tiny, small, deep (tiny at 32 layers)"
    )
    p.add_argument("--quick", action="store_true", help="5 measured steps instead of 20")
    p.add_argument("--json", metavar="PATH", help="also write every round's raw results to PATH")
    p.add_argument("--steps", type=int, default=None, help="measured steps per mode")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="fresh processes for every mode this many times (ratios: the median over rounds)",
    )
    p.add_argument(
        "--blocks",
        type=int,
        default=BLOCKS,
        help="timed blocks of --steps steps per mode and round, interleaved across the modes",
    )
    p.add_argument(
        "--zero-grad-after",
        action="store_true",
        help="spmdtorch's step ends with opt.zero_grad() instead of starting with it (the gradients "
        "then never leave the program; the twin is unchanged)",
    )
    p.add_argument(
        "--modes",
        default="lazy,lazy_pure,compiled",
        help=f"comma-separated modes beside the twin: {', '.join(ALL_MODES[1:])} (ptxla: PyTorch/XLA, "
        "with --ptxla-python)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="parameter dtype (default: float32; bfloat16 for 1b)",
    )
    p.add_argument(
        "--ptxla-python",
        metavar="PYTHON",
        help="for mode ptxla: a Python interpreter with torch_xla 2.9 and its torch (e.g. a venv's bin/python)",
    )
    p.add_argument(
        "--markdown", action="store_true", help="also print the results as benchmarks/README.md's Markdown table"
    )
    p.add_argument(
        "--from-json", metavar="PATH", help="print the Markdown table of an earlier run's --json results and exit"
    )
    p.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="another checkout of spmdtorch (e.g. `git worktree add /tmp/base <commit>`): each spmdtorch mode "
        "also runs from it, alternating with this tree's, and a line per mode gives this tree's step over the "
        "baseline's",
    )
    p.add_argument("--worker", choices=ALL_MODES[:-1], help=argparse.SUPPRESS)
    p.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", choices=tuple(CONFIGS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.from_json:
        print(markdown_table(json.loads(Path(args.from_json).read_text())["configs"]))
        return 0
    if args.steps is None:
        args.steps = 5 if args.quick else 20
    if args.worker:
        worker_main(args)
        return 0
    global MODES, PTXLA_PYTHON
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in ALL_MODES[1:]:
            p.error(f"--modes: unknown mode {m!r}; choose from {', '.join(ALL_MODES[1:])}")
    if "ptxla" in modes and not args.ptxla_python:
        p.error("--modes ptxla: name PyTorch/XLA's interpreter with --ptxla-python (it needs its own torch)")
    if args.ptxla_python and shutil.which(args.ptxla_python) is None:
        p.error(f"--ptxla-python {args.ptxla_python}: no such executable (a Python with torch_xla 2.9)")
    MODES = ("jax", *(m for m in ALL_MODES[1:] if m in modes))
    PTXLA_PYTHON = args.ptxla_python
    if args.baseline:
        _set_baseline(p, Path(args.baseline))

    from rich.console import Console
    from rich.table import Table

    # The tables are wide; don't wrap them in a pipe (PyTorch/XLA's adds a column).
    console = Console(width=max(Console().width, 230 if "ptxla" in MODES else 190))
    console.print(f"[bold]machine:[/] {machine_line()}")
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown config {c!r}; choose from {', '.join(CONFIGS)}")
    summary, raw = [], {}
    for cfg in configs:
        # Rounds: every mode once per round, in turn, so that the machine's
        # drift over minutes (other tenants, clocks) hits each mode alike;
        # each ratio is taken against the twin of the same round.
        runs = {mode: [] for mode in MODES}
        for rnd in range(args.rounds):
            console.print(
                f"  running {cfg}: round {rnd + 1} of {args.rounds} ({', '.join(MODES)}, "
                f"{args.blocks} interleaved blocks) ..."
            )
            res = run_round(
                cfg,
                args.steps,
                args.blocks,
                timeout=900,
                zero_grad_after=args.zero_grad_after,
                dtype=args.dtype,
                rnd=rnd,
            )
            for mode in MODES:
                runs[mode].append(res[mode])
        # A round's ratio: the median over blocks of (block / the twin's block beside it);
        # each row shows the round whose ratio is the median one.
        stats = mode_stats(runs)
        batch, seq = CONFIGS[cfg]
        loop = "zero_grad() after opt.step()" if args.zero_grad_after else "zero_grad() first"
        twin = stats["jax"].shown
        devices = f"{twin['devices']} {twin['device_kind']}" + ("s" if twin["devices"] > 1 else "")
        table = Table(
            title=f"Llama {cfg} ({_dtype_name(cfg, args.dtype)}), batch {batch}x{seq}, FSDPv2 over {devices}, "
            f"AdamW, {loop} ({args.steps} steps x {args.blocks} interleaved blocks, {args.rounds} rounds)"
        )
        # On an accelerator: throughput, model FLOP utilisation (PaLM's FLOP
        # count over the device kind's dense bf16 peak) and the host's share
        # of a step (under 100%, the next step is launched before the device
        # finishes this one: the device does not wait for the host).
        accel = twin["platform"] != "cpu"
        for col in (
            "mode",
            "step ms",
            "x twin",
            "x twin, all rounds",
            "first step s",
            "x twin (first)",
            "warm-up s",
            "host ms/step",
            "device idle",
            *(("tokens/s", "MFU", "host % of step") if accel else ()),
            "ATen ops, us/op",
            "CPU ms/step",
            "CPU x twin",
            *(("x PyTorch/XLA [rounds]",) if "ptxla" in MODES else ()),
            "param+opt /device",
            "args / temp MiB",
            "compiles",
            "loss first -> last",
        ):
            table.add_column(col, justify="left" if col == "mode" else "right")
        for mode in MODES:
            st = stats[mode]
            r = st.shown
            table.add_row(
                mode_label(mode, "spmdtorch "),
                f"{r['step_ms']:.1f}",
                "1.00x" if mode == "jax" else ratio_cell(st.ratios, TARGETS.get(mode)),
                rounds_text(st.ratios),
                f"{r['first_s']:.2f}",
                "1.00x" if mode == "jax" else ratio_cell(st.first, _first_target(mode)),
                f"{r['warmup_s']:.2f}",
                f"{r['host_ms']:.2f}",
                idle_text(r),
                *(accel_cells(r) if accel else ()),
                f"{r['aten_ops']:.0f}, {r['host_ms'] * 1e3 / r['aten_ops']:.1f}" if r["aten_ops"] else "-",
                f"{r['cpu_ms']:.1f}",
                "1.00x" if mode == "jax" else f"{statistics.median(st.cpu):.2f}x",
                *((_vs_ptxla_cell(st.vs_ptxla, mode),) if "ptxla" in MODES else ()),
                f"{r['per_device'] / 2**20:.3f} MiB = 1/{r['total'] / r['per_device']:.2f}",
                "-" if r["args"] is None else f"{r['args'] / 2**20:.2f} / {r['temp'] / 2**20:.2f}",
                str(r["compiles"]),
                f"{r['losses'][0]:.4f} -> {r['losses'][-1]:.4f}",
            )
        console.print(table)
        for mode in MODES:
            if mode + BASE_SUFFIX in runs:
                vs = block_ratios(runs[mode], runs[mode + BASE_SUFFIX])
                console.print(
                    f"  {mode}: this tree's step / the baseline's ({BASELINE_NAME}), same blocks: "
                    f"{statistics.median(vs):.3f} [{' '.join(f'{x:.3f}' for x in vs)}]"
                )
        raw[cfg] = runs
        summary.append((cfg, stats))
    if len(summary) > 1:
        table = Table(title="Summary: ratio to the JAX twin, median over rounds (every round's in brackets)")
        shown = MODES[1:]
        lazy = [m for m in shown if m.startswith("lazy")] if "ptxla" in MODES else []
        cols = (
            "config",
            "twin ms/step",
            *shown,
            f"first step: {', '.join(shown)}",
            "host ms: " + ", ".join(shown),
            *((f"{', '.join(lazy)} x PyTorch/XLA",) if lazy else ()),
        )
        for col in cols:
            table.add_column(col, justify="left" if col == "config" else "right")
        for cfg, stats in summary:
            table.add_row(
                cfg,
                f"{stats['jax'].shown['step_ms']:.1f}",
                *(f"{ratio_cell(stats[m].ratios, TARGETS.get(m))} [{rounds_text(stats[m].ratios)}]" for m in shown),
                ", ".join(ratio_cell(stats[m].first, _first_target(m)) for m in shown),
                ", ".join(f"{stats[m].shown['host_ms']:.1f}" for m in shown),
                *((", ".join(_vs_ptxla_cell(stats[m].vs_ptxla, m) for m in lazy),) if lazy else ()),
            )
        console.print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine_line(), "configs": raw}, indent=1))
    if args.markdown:
        print(markdown_table(raw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
