"""GPU-only numerics checks, run by tests/accelerator/test_gpu.py in its own process.

The tests' conftest puts the process on simulated CPU devices, so these run
in a fresh interpreter on JAX's default platform. Prints ``NO_GPU`` and
exits 0 when there is no GPU; otherwise raises on the first failed check
and prints ``OK`` at the end.

Checks:
* ``torch.set_float32_matmul_precision`` reaches the GPU: "highest" is float32
  (relative error of a 1024-wide product ~1e-6), "high" and "medium" are
  TF32 (~1e-3: visibly less precise, still within TF32's bound), and a
  bf16 product accumulates in float32 as torch's does;
* ``F.scaled_dot_product_attention`` (bf16, causal, forward and backward)
  runs as cuDNN's fused attention (a ``__cudnn$fmha`` custom call in the
  compiled program) and matches eager CPU float32.
"""

from __future__ import annotations

import sys

import jax


def main() -> int:
    if not any(d.platform == "gpu" for d in jax.devices()):
        print("NO_GPU")
        return 0
    import numpy as np
    import torch
    import torch.nn.functional as F

    import spmdtorch
    from spmdtorch import debug

    torch.manual_seed(0)
    a = torch.randn(1024, 1024)
    b = torch.randn(1024, 1024)
    exact = (a.double() @ b.double()).numpy()

    def rel_err(setting: str) -> float:
        torch.set_float32_matmul_precision(setting)
        got = (a.to("xla") @ b.to("xla")).cpu()
        if got.device.type != "cpu":
            raise AssertionError(f".cpu() of an xla tensor on GPU gave a tensor on {got.device}, expected cpu")
        got = got.double().numpy()
        return float(np.abs(got - exact).max() / np.abs(exact).max())

    errs = {s: rel_err(s) for s in ("highest", "high", "medium")}
    torch.set_float32_matmul_precision("highest")
    print("float32 matmul relative error by setting:", errs)
    if errs["highest"] > 1e-5:
        raise AssertionError(f"'highest' should be float32 on GPU: relative error {errs['highest']:.2e} > 1e-5")
    for s in ("high", "medium"):
        if not (errs[s] > 10 * errs["highest"] and errs[s] < 5e-3):
            raise AssertionError(
                f"'{s}' should be TF32 on GPU: relative error {errs[s]:.2e} (highest {errs['highest']:.2e})"
            )

    ab, bb = a.bfloat16(), b.bfloat16()
    torch.testing.assert_close((ab.to("xla") @ bb.to("xla")).cpu(), ab @ bb, rtol=1.6e-2, atol=1e-1)

    q, k, v = (torch.randn(2, 8, 256, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    ref.sum().backward()
    qx, kx, vx = (t.detach().to("xla").requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qx, kx, vx, is_causal=True)
    out.float().sum().backward()
    spmdtorch.sync()
    hlo = debug.last_executable().as_text()
    if "__cudnn$fmha" not in hlo:
        raise AssertionError("scaled_dot_product_attention did not lower to cuDNN's fused attention on this GPU")
    torch.testing.assert_close(out.cpu().float(), ref, rtol=2e-2, atol=2e-2)
    for t, tx in ((q, qx), (k, kx), (v, vx)):
        torch.testing.assert_close(tx.grad.cpu().float(), t.grad.float(), rtol=5e-2, atol=5e-2)
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
