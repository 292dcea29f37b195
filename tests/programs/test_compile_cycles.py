"""spmdtorch.compile replays steps whose autograd graph holds tensors in reference cycles.

A trace runs with Python's cyclic collector paused, so a tensor that ``fn``
made and left in cyclic garbage (an autograd Function keeping its output on
``ctx``: the output's ``grad_fn`` holds ``ctx``) is still alive when the
program is planned. Taken for state ``fn`` kept, it became a program output;
after the next collection freed it, every replay found it gone and traced
again, with activation-checkpointed layers (``checkpoint_module``) on every
call. Each test collects garbage between calls, as a training loop's
allocations soon do, and compares with eager CPU torch.
"""

import copy
import functools
import gc
import weakref

import numpy as np
import pytest
import torch

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.models.llama import DecoderLayer, LlamaConfig, LlamaForCausalLM, causal_lm_loss
from spmdtorch.partition import FSDPv2, checkpoint_module, mark_sharding, transformer_auto_wrap_policy

CALLS = 6

pytestmark = pytest.mark.filterwarnings("ignore:checkpoint_module on the CPU backend:RuntimeWarning")


def _counts() -> tuple[int, int]:
    return debug.counter_value("CompiledTrace") or 0, debug.counter_value("CompiledReplay") or 0


class _SquareKeepingOutput(torch.autograd.Function):
    """x * x that keeps its output on ctx, a common custom-Function pattern (a reference cycle)."""

    @staticmethod
    def forward(ctx, x):
        out = x * x
        ctx.save_for_backward(x)
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_output_kept_on_ctx_replays(devices8):
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 8)
    lin = copy.deepcopy(ref).to("xla")
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, lin)]

    def step(m, opt, x):
        loss = _SquareKeepingOutput.apply(m(x)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    compiled = spmdtorch.compile(functools.partial(step, lin, opts[1]))
    traces, replays = _counts()
    for i in range(CALLS):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(i))
        got = compiled(x.to("xla"))
        gc.collect()
        torch.testing.assert_close(got.cpu(), step(ref, opts[0], x), atol=1e-6, rtol=1e-6)
    now_traces, now_replays = _counts()
    # SGD without momentum keeps no state: the first two traces agree and every later call replays.
    assert now_traces - traces <= 2 and now_replays - replays >= CALLS - 2, (now_traces - traces, now_replays - replays)
    torch.testing.assert_close(lin.weight.detach().cpu(), ref.weight.detach(), atol=1e-6, rtol=1e-6)


def test_checkpointed_block_output_is_freed_without_a_collection(devices8):
    """checkpoint_module's outputs are not in a reference cycle: dropped, they are freed at once (lazy mode)."""
    block = checkpoint_module(torch.nn.Linear(8, 8).to("xla"))
    x = torch.randn(4, 8).to("xla")
    gc.disable()
    try:
        y = block(x)
        y.sum().backward()
        out = weakref.ref(y)
        del y
        assert out() is None, "the checkpointed block's output is kept alive by a reference cycle"
    finally:
        gc.enable()


def test_fsdpv2_decoder_with_checkpointed_layers_replays(devices8):
    """The documented FSDPv2 recipe with checkpoint_module layers, compiled: eager's losses, one program replayed."""
    mesh = Mesh(np.arange(8), (8,), ("fsdp",))
    torch.manual_seed(0)
    ref = LlamaForCausalLM(LlamaConfig.tiny())
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={DecoderLayer})
    model = FSDPv2(
        copy.deepcopy(ref),
        mesh=mesh,
        auto_wrap_policy=policy,
        auto_wrapper_callable=lambda m, **kw: FSDPv2(checkpoint_module(m), **kw),
    )
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ref, model)]

    def step(m, opt, tokens):
        loss = causal_lm_loss(m(tokens), tokens)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    compiled = spmdtorch.compile(functools.partial(step, model, opts[1]))
    traces, replays = _counts()
    g = torch.Generator().manual_seed(1)
    for _ in range(CALLS):
        tokens = torch.randint(0, 256, (8, 16), generator=g)
        got = compiled(mark_sharding(tokens.to("xla"), mesh, ("fsdp", None)))
        gc.collect()
        torch.testing.assert_close(got.cpu(), step(ref, opts[0], tokens), atol=2e-5, rtol=2e-5)
    now_traces, now_replays = _counts()
    assert now_traces - traces <= 2 and now_replays - replays >= CALLS - 2, (now_traces - traces, now_replays - replays)


def test_log_recompiles_says_why_a_replayable_step_traces_again(devices8, caplog):
    """With the recompile log on, a replay that cannot run names its reason (here a gradient zero_grad dropped)."""
    lin = torch.nn.Linear(4, 4).to("xla")

    @spmdtorch.compile
    def step(x):
        lin(x).sum().backward()
        return lin.weight.grad.sum().detach()

    x = torch.ones(2, 4, device="xla")
    debug.log_recompiles(True)
    try:
        with caplog.at_level("INFO", logger="spmdtorch.compile"), pytest.warns(RuntimeWarning, match="zero_grad"):
            for _ in range(3):
                lin.zero_grad()  # drops the gradient the program writes: the next call cannot replay
                step(x)
    finally:
        debug.log_recompiles(False)
    msgs = [r.getMessage() for r in caplog.records if "traced again" in r.getMessage()]
    assert msgs and "kept outside its result (a gradient) was dropped" in msgs[0], msgs
    torch.testing.assert_close(lin.weight.grad.cpu(), torch.full((4, 4), 2.0))
