"""``F.scaled_dot_product_attention`` on xla: one fused op lowered to
``jax.nn.dot_product_attention``, forward and backward equal to eager CPU.

Covers causal, bool and float masks (a row with no allowed key included),
``scale``, grouped-query heads, bfloat16, query/key lengths that differ,
sharded batch and heads on 8 devices, ``spmdtorch.compile``; and the cases
left to torch's math decomposition (dropout, a mask that needs a gradient,
3-d inputs), which must still equal eager.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import spmdtorch
from spmdtorch import debug
from spmdtorch.mesh import Mesh
from spmdtorch.ops import attention
from spmdtorch.partition import mark_sharding


@pytest.fixture
def jax_calls(monkeypatch):
    """Counts the traces of the jax lowering (caches cleared, so each program traces anew)."""
    debug.clear_caches()
    calls = []
    real = attention._jax_attention

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "_jax_attention", spy)
    return calls


def _qkv(b=2, h=4, hk=None, lq=8, lk=6, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hk = hk or h
    return (
        torch.randn(b, h, lq, d, generator=g).to(dtype),
        torch.randn(b, hk, lk, d, generator=g).to(dtype),
        torch.randn(b, hk, lk, d, generator=g).to(dtype),
    )


def _compare(q, k, v, tol=1e-5, prepare=None, **kw):
    """Forward and the gradients of q, k, v on xla vs eager CPU."""
    prepare = prepare or (lambda t: t)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, **kw)
    # Seeded: the test must not depend on what drew from torch's global generator before it.
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(out.dtype)
    out.backward(grad)
    xleaves = [t.to("xla").requires_grad_() for t in (q, k, v)]
    xkw = {n: a.to("xla") if isinstance(a, torch.Tensor) else a for n, a in kw.items()}
    xout = F.scaled_dot_product_attention(*(prepare(t) for t in xleaves), **xkw)
    xout.backward(grad.to("xla"))
    assert xout.dtype == out.dtype and xout.shape == out.shape
    torch.testing.assert_close(xout.cpu(), out.detach(), rtol=tol, atol=tol)
    for name, x, t in zip("qkv", xleaves, leaves):
        # In 16-bit floats a gradient sums many rounded products (over query
        # positions and grouped heads), so its rounding error grows with its
        # magnitude: the absolute tolerance is relative to the largest entry.
        gtol = tol * max(1.0, t.grad.abs().max().item()) if t.dtype in (torch.bfloat16, torch.float16) else tol
        torch.testing.assert_close(x.grad.cpu(), t.grad, rtol=tol, atol=gtol, msg=lambda m, n=name: f"grad {n}: {m}")


def _bool_mask(lq=8, lk=6, seed=1):
    m = torch.rand(lq, lk, generator=torch.Generator().manual_seed(seed)) > 0.4
    m[:, 0] = True
    return m


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"is_causal": True},
        {"scale": 0.2},
        {"is_causal": True, "scale": 0.5},
        {"attn_mask": _bool_mask()},
        {"attn_mask": torch.randn(2, 1, 8, 6)},  # additive, broadcast over heads
        {"attn_mask": torch.randn(8, 6).masked_fill(~_bool_mask(), -1e9)},
    ],
    ids=["plain", "causal", "scale", "causal-scale", "bool-mask", "float-mask", "float-mask-large-negative"],
)
def test_fused_attention_matches_eager(kw, jax_calls):
    _compare(*_qkv(), **kw)
    assert jax_calls, "the fused jax lowering was not used"


def test_causal_with_longer_keys_and_self_attention(jax_calls):
    _compare(*_qkv(lq=5, lk=9), is_causal=True)
    q, k, v = _qkv(lq=8, lk=8)
    _compare(q, k, v, is_causal=True)
    assert jax_calls


def test_bool_mask_with_a_fully_masked_row_gives_zeros_like_eager(jax_calls):
    mask = _bool_mask()
    mask[3] = False  # query 3 may attend to nothing: torch's safe softmax gives 0
    _compare(*_qkv(), attn_mask=mask)
    out = F.scaled_dot_product_attention(*(t.to("xla") for t in _qkv()), attn_mask=mask.to("xla"))
    assert (out.cpu()[:, :, 3] == 0).all()


def test_grouped_query_heads(jax_calls):
    _compare(*_qkv(h=8, hk=2), enable_gqa=True)
    _compare(*_qkv(h=8, hk=2), enable_gqa=True, is_causal=True)
    assert jax_calls


def test_bfloat16(jax_calls):
    _compare(*_qkv(dtype=torch.bfloat16), is_causal=True, tol=2e-2)
    assert jax_calls


@pytest.mark.parametrize("spec", [("data", None, None, None), (None, "data", None, None)], ids=["batch", "heads"])
def test_sharded_batch_or_heads_on_8_devices(spec, devices8, jax_calls):
    mesh = Mesh(np.arange(8), (8,), ("data",))
    q, k, v = _qkv(b=8, h=8, lq=8, lk=8)
    _compare(q, k, v, is_causal=True, prepare=lambda t: mark_sharding(t, mesh, spec))
    assert jax_calls


def test_under_compile():
    q, k, v = _qkv()

    @spmdtorch.compile
    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    for _ in range(3):
        got = attend(q.to("xla"), k.to("xla"), v.to("xla"))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_cases_left_to_the_math_decomposition_match_eager(jax_calls):
    # A float mask that needs a gradient: torch's math path gives it one.
    q, k, v = _qkv()
    mask = torch.randn(8, 6, requires_grad=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    out.sum().backward()
    xmask = mask.detach().to("xla").requires_grad_()
    xout = F.scaled_dot_product_attention(q.to("xla"), k.to("xla"), v.to("xla"), attn_mask=xmask)
    xout.sum().backward()
    torch.testing.assert_close(xout.cpu(), out.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xmask.grad.cpu(), mask.grad, rtol=1e-5, atol=1e-5)
    # 3-d inputs (no head dim).
    _compare(*(t[:, 0] for t in _qkv()), is_causal=True)
    assert not jax_calls
    # Dropout: drawn from xla's stream, so only its statistics match eager.
    torch.manual_seed(0)
    # Uniform probabilities (q = k = 0) times v = I: out[i, j] is p_ij, dropped or doubled.
    zeros, eye = torch.zeros(1, 1, 64, 64, device="xla"), torch.eye(64, device="xla")[None, None]
    out = F.scaled_dot_product_attention(zeros, zeros, eye, dropout_p=0.5)
    assert 0.4 < float((out == 0).float().mean()) < 0.6
    torch.testing.assert_close(out.cpu()[out.cpu() != 0].unique(), torch.tensor([2 / 64]))


def test_argument_errors_are_torchs():
    q, k, v = (t.to("xla") for t in _qkv())
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(
            q, k, v, attn_mask=torch.ones(8, 6, dtype=torch.bool, device="xla"), is_causal=True
        )
    with pytest.raises(RuntimeError):
        q8, k2, v2 = (t.to("xla") for t in _qkv(h=8, hk=2))
        F.scaled_dot_product_attention(q8, k2, v2)  # heads differ without enable_gqa


# -- the Pallas flash-attention kernel (TPU; here in Pallas's interpret mode) ---------------


@pytest.fixture
def pallas_calls(monkeypatch):
    """SPMDTORCH_ATTENTION_KERNEL=pallas; counts the traces of the Pallas forward and backward.

    Interpreted, the kernel is HLO loops, and XLA:CPU's while-loop simplifier
    takes minutes merging their call-site stack frames when each op carries
    jax's full traceback (deep here: torch's dispatch); locations without
    tracebacks keep the compile to seconds. (On TPU the kernel is one opaque
    custom call.)
    """
    import jax

    from spmdtorch import config

    full_tracebacks = jax.config.jax_include_full_tracebacks_in_locations
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
    from spmdtorch.ops import _pallas_attention as pallas

    monkeypatch.setenv("SPMDTORCH_ATTENTION_KERNEL", "pallas")
    config.reload()
    debug.clear_caches()
    calls = {"forward": 0, "backward": 0}
    for name, fn in (("forward", pallas.attention), ("backward", pallas.attention_vjp)):

        def spy(*args, _fn=fn, _name=name, **kwargs):
            calls[_name] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setattr(pallas, fn.__name__, spy)
    yield calls
    jax.config.update("jax_include_full_tracebacks_in_locations", full_tracebacks)
    monkeypatch.delenv("SPMDTORCH_ATTENTION_KERNEL")
    config.reload()
    debug.clear_caches()


@pytest.mark.parametrize(
    "spec", [("data", "model", None, None), (None, None, "data", None)], ids=["batch-heads", "sequence-gathered"]
)
def test_pallas_kernel_sharded_causal_gqa_matches_eager(spec, devices8, pallas_calls):
    mesh = Mesh(np.arange(8), (4, 2), ("data", "model"))
    q, k, v = _qkv(b=4, h=4, hk=2, lq=128, lk=256, d=16)
    _compare(q, k, v, is_causal=True, enable_gqa=True, prepare=lambda t: mark_sharding(t, mesh, spec), tol=2e-5)
    assert pallas_calls == {"forward": 1, "backward": 1}


@pytest.mark.parametrize(
    "kw,dtype",
    [({}, torch.float32), ({"scale": 0.3}, torch.float32), ({"is_causal": True}, torch.bfloat16)],
    ids=["plain", "scale", "causal-bf16"],
)
def test_pallas_kernel_matches_eager(kw, dtype, pallas_calls):
    _compare(*_qkv(b=2, h=2, lq=256, lk=128, d=32, dtype=dtype), tol=2e-2 if dtype == torch.bfloat16 else 2e-5, **kw)
    assert pallas_calls == {"forward": 1, "backward": 1}


def test_pallas_kernel_leaves_what_it_cannot_take_to_xla(pallas_calls, jax_calls):
    # A mask, a sequence that is not whole 128-blocks: XLA's attention, still equal to eager.
    _compare(*_qkv(lq=128, lk=128), attn_mask=torch.rand(128, 128) > 0.3)
    _compare(*_qkv(lq=64, lk=128), is_causal=True)
    assert pallas_calls == {"forward": 0, "backward": 0} and len(jax_calls) >= 2


def test_auto_uses_pallas_only_on_tpu(monkeypatch):
    import jax

    from spmdtorch import config
    from spmdtorch.ops import _pallas_attention as pallas

    q = k = v = jax.ShapeDtypeStruct((1, 2, 128, 16), np.float32)
    for mode, backend, want in [("auto", "cpu", False), ("auto", "tpu", True), ("xla", "tpu", False)]:
        monkeypatch.setenv("SPMDTORCH_ATTENTION_KERNEL", mode)
        config.reload()
        monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
        assert pallas.use_pallas(q, k, v, None) is want, (mode, backend)
    monkeypatch.delenv("SPMDTORCH_ATTENTION_KERNEL")
    config.reload()


def test_pallas_kernel_is_partitioned_per_shard_not_gathered(devices8, monkeypatch):
    """Pure jax: batch/head-sharded inputs run the kernel on their shard, with no collective."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from spmdtorch.ops import _pallas_attention as pallas

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))
    sh = NamedSharding(mesh, PartitionSpec("data", "model", None, None))
    q, k, v, g = (jax.device_put(jnp.ones((4, 2, 128, 16)) * (i + 1) / 7, sh) for i in range(4))
    fwd = jax.jit(lambda q, k, v: pallas.attention(q, k, v, True, None))
    bwd = jax.jit(lambda g, q, k, v: pallas.attention_vjp(g, q, k, v, True, None))
    for f, args in ((fwd, (q, k, v)), (bwd, (g, q, k, v))):
        hlo = f.lower(*args).compile().as_text()
        for collective in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
            assert collective not in hlo, f"{collective} in the partitioned Pallas program"
    assert fwd(q, k, v).sharding.spec[:2] == ("data", "model")


# -- cuDNN's fused attention (GPU; here the platform query answers "gpu") -----------------


def test_cudnn_is_asked_for_on_gpu_and_refusal_falls_back_to_xla(monkeypatch):
    """bf16 on GPU asks jax for cuDNN's kernel (jax's default, implementation=None, never
    picks it); here jax finds no cuDNN while tracing and refuses, and XLA's attention
    gives eager's values, forward and backward."""
    import jax

    debug.clear_caches()
    monkeypatch.setattr(attention, "_platform", lambda: "gpu")
    asked = []
    real = jax.nn.dot_product_attention

    def spy(*args, implementation=None, **kwargs):
        asked.append(implementation)
        return real(*args, implementation=implementation, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    _compare(*_qkv(b=2, h=4, hk=2, lq=16, lk=16, d=16, dtype=torch.bfloat16), is_causal=True, enable_gqa=True, tol=2e-2)
    debug.clear_caches()
    assert "cudnn" in asked and None in asked, asked


def test_cudnn_candidates(monkeypatch):
    import jax.numpy as jnp

    from spmdtorch import config

    for mode, platform, dtype, want in [
        ("auto", "gpu", jnp.float32, False),  # cuDNN's kernel takes bf16/f16
        ("auto", "gpu", jnp.bfloat16, True),
        ("auto", "cpu", jnp.bfloat16, False),
        ("auto", "tpu", jnp.bfloat16, False),
        ("xla", "gpu", jnp.bfloat16, False),
    ]:
        monkeypatch.setenv("SPMDTORCH_ATTENTION_KERNEL", mode)
        config.reload()
        monkeypatch.setattr(attention, "_platform", lambda p=platform: p)
        q = np.zeros((1, 8, 2, 16), dtype)
        assert attention._cudnn_candidate(q) is want, (mode, platform, dtype)
    monkeypatch.delenv("SPMDTORCH_ATTENTION_KERNEL")
    config.reload()
