#!/usr/bin/env python
"""Run PyTorch's OpInfo database through spmdtorch and compare with eager CPU torch.

For every entry of ``torch.testing._internal.common_methods_invocations.op_db``
and a *mode* (``float32`` forward, ``bfloat16`` forward, ``float32-grad``:
forward plus the gradient of every input that requires grad), each sample of
``op.sample_inputs("cpu", dtype)`` is run on CPU and on copies moved with
``.to("xla")`` (tensors nested in args/kwargs too, ``device="cpu"`` keyword
arguments become ``"xla"``), and the results are compared with
``torch.testing.assert_close`` using the OpInfo's own tolerance overrides where
it has any.

Every sample gets exactly one verdict; none is skipped:

* ``pass``: matched (values, or shape and dtype only for ops whose values are
  random or uninitialised: ``has_nondeterministic_output``, dropout,
  ``empty``..., and samples with ``dropout_p > 0``; counted as shape-only in
  the report);
* ``fail``: spmdtorch raised or disagreed; the reason is the exception's first line;
* ``eager_error``: eager torch itself raises on the sample (nothing to compare);
* ``n/a``: the sample cannot exist on the xla device (a sparse layout).

An entry is ``fail`` if any sample fails, else ``pass`` if any sample passed,
else ``n/a`` (also when eager torch does not support the dtype, or in grad mode
when the op has no autograd support).

Speed: the samples of one entry are traced lazily and computed by one
``spmdtorch.sync()`` per chunk of samples; samples that fail in the batch are
re-run one by one so that each failure is attributed to its own sample. Work is
spread over ``--jobs`` worker processes (``nice``d; XLA's default optimization
level, as in CI, unless ``--opt-level`` says otherwise). A worker that hangs past ``--entry-timeout``,
crashes, or grows past ``--max-rss-gb`` is killed and restarted and the entry
is recorded as a failure (``Timeout`` / ``WorkerCrash``); results are appended
to ``build/opinfo/<mode>.partial.jsonl`` as they finish, so an interrupted run
loses nothing (``--resume``).

The JSON next to ``--out`` holds every mode (``modes.<mode>.entries.<name>``);
a run replaces the records of the entries it ran and keeps the others, so the
database can be covered in chunks (``--start/--stop`` over op_db indices,
``--ops``, ``--failed``). The markdown is re-rendered from the whole JSON.

Usage::

    python tools/opinfo_report.py --mode float32 --start 0 --stop 200
    python tools/opinfo_report.py --mode bfloat16 --failed        # re-run failures
    python tools/opinfo_report.py --render                        # markdown from JSON
    python tools/opinfo_report.py --write-expected tests/ops/opinfo_expected_failures.py
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import inspect
import itertools
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import traceback

# mode -> (dtype name, gradients too)
MODES = {"float32": ("float32", False), "bfloat16": ("bfloat16", False), "float32-grad": ("float32", True)}
DEFAULT_OUT = "docs/opinfo_coverage.md"
PARTIAL_DIR = "build/opinfo"
MAX_FAILURE_DETAILS = 4  # per entry in the JSON (every failing index is listed)


def mode_key(dtype: str, grad: bool) -> str:
    return dtype + ("-grad" if grad else "")


def entry_name(op) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _first_line(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    first = msg[0] if msg else ""
    out = f"{type(exc).__name__}: {first}".strip()
    return out[:300]


def _details(exc: BaseException) -> str:
    return str(exc).strip()[:1500]


class SampleTimeout(Exception):
    pass


class SampleNotApplicable(Exception):
    """The sample cannot exist on the xla device (recorded as n/a, with this reason)."""


@contextlib.contextmanager
def _alarm(seconds: float):
    """Raise SampleTimeout in the main thread after ``seconds`` (Python-level hangs)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SampleTimeout(f"sample ran longer than {seconds:.0f}s")

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# Ops whose outputs are random draws or uninitialised memory: eager and xla
# cannot agree on values (OpInfo skips them in TestCommon.test_compare_cpu).
RANDOM_OPS = frozenset(
    {
        "bernoulli",
        "normal",
        "uniform",
        "cauchy",
        "exponential",
        "geometric",
        "log_normal",
        "multinomial",
        "rand_like",
        "randn_like",
        "randint_like",
        "randint",
        "randn",
        "rand",
        "nn.functional.dropout",
        "nn.functional.dropout2d",
        "nn.functional.dropout3d",
        "nn.functional.alpha_dropout",
        "nn.functional.feature_alpha_dropout",
        "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d",
        "nn.functional.fractional_max_pool3d",
        "svd_lowrank",
        "pca_lowrank",
        "empty",
        "empty_like",
        "empty_strided",
        "empty_permuted",
        "new_empty",
        "new_empty_strided",
        "torch.ops.aten._flash_attention_forward",
        "torch.ops.aten._efficient_attention_forward",
    }
)


# -- tolerances ------------------------------------------------------------------


def tolerances(op, dtype):
    """(atol, rtol) for ``dtype``: assert_close's defaults, raised to the largest
    ``toleranceOverride``/``precisionOverride`` the OpInfo declares for CPU (or any
    device) and this dtype, in any test class. None means assert_close's defaults."""
    import torch
    from torch.testing._internal.common_device_type import (
        precisionOverride,
        toleranceOverride,
    )
    from torch.testing._internal.opinfo.core import DecorateInfo

    atol = rtol = None
    for info in list(op.decorators or ()):
        if not isinstance(info, DecorateInfo):
            continue
        if info.device_type not in (None, "cpu"):
            continue
        if info.dtypes is not None and dtype not in info.dtypes:
            continue
        if not info.active_if:
            continue
        for dec in info.decorators:
            if isinstance(dec, toleranceOverride):
                t = dec.d.get(dtype)
                if t is not None:
                    atol = max(atol or 0.0, t.atol)
                    rtol = max(rtol or 0.0, t.rtol)
            elif isinstance(dec, precisionOverride):
                p = dec.d.get(dtype)
                if p is not None:
                    atol = max(atol or 0.0, p)
                    rtol = max(rtol or 0.0, 0.0)
    if atol is None:
        return None
    default_rtol, default_atol = torch.testing._comparison.default_tolerances(dtype)
    return max(atol, default_atol), max(rtol, default_rtol)


# -- moving samples ----------------------------------------------------------------


def _tree_map(fn, x):
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple (torch.return_types)
        return type(x)(*[_tree_map(fn, y) for y in x])
    if isinstance(x, (list, tuple)):
        return type(x)(_tree_map(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: _tree_map(fn, v) for k, v in x.items()}
    return fn(x)


def _leaves(x):
    out = []
    _tree_map(lambda y: out.append(y), x)
    return out


def _to_xla_leaf(x):
    import torch

    if isinstance(x, torch.Tensor):
        if x.layout != torch.strided:
            raise SampleNotApplicable(f"{x.layout} input: the xla device holds dense (strided) arrays only")
        y = x.detach().to("xla")
        if x.requires_grad:
            y.requires_grad_(True)
        return y
    if isinstance(x, torch.device) and x.type == "cpu":
        return torch.device("xla")
    return x


def _to_xla_kwargs(kwargs):
    import torch

    out = {}
    for k, v in kwargs.items():
        if k == "device" and (v == "cpu" or (isinstance(v, torch.device) and v.type == "cpu")):
            out[k] = "xla"
        else:
            out[k] = _tree_map(_to_xla_leaf, v)
    return out


def _to_cpu_leaf(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, torch.device) and x.type == "xla":
        return torch.device("cpu")
    return x


def _detach_leaf(x):
    import torch

    return x.detach() if isinstance(x, torch.Tensor) else x


# -- one entry -----------------------------------------------------------------------


def _random_sample(op, sample) -> bool:
    """A sample whose values are random draws (dropout inside attention):
    compared on shape and dtype only, like the RANDOM_OPS entries."""
    import torch

    kw = dict(sample.kwargs)
    # dropout_p may be positional (multi_head_attention_forward, whose OpInfo
    # wraps it in a lambda): bind against the torch function of that name.
    fn = torch
    for part in op.name.split("."):
        fn = getattr(fn, part, None)
    for f in (op.op, fn):
        try:
            bound = inspect.signature(f).bind_partial(sample.input, *sample.args, **sample.kwargs)
        except (TypeError, ValueError):
            continue
        kw = {**bound.arguments, **kw}
    p = kw.get("dropout_p", kw.get("dropout"))
    if not isinstance(p, (int, float)) or p <= 0:
        return False
    return bool(kw.get("training", True))


def _grad_pieces(sample, out):
    """(outputs that need a gradient, inputs that require grad) of a sample run."""
    import torch

    out = sample.output_process_fn_grad(out)
    outs = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    ins = [
        t
        for t in _leaves((sample.input, sample.args, sample.kwargs))
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    return outs, ins


def _run_cpu(op, sample, grad, seed):
    import torch

    out = op(sample.input, *sample.args, **sample.kwargs)
    # Outputs are compared after the sample's output_process_fn_grad, as
    # PyTorch's own device comparison (TestCommon.test_compare_cpu) does: it
    # makes non-unique results comparable (signs of singular vectors...).
    res = {"out": _tree_map(_detach_leaf, sample.output_process_fn_grad(out))}
    if grad:
        outs, ins = _grad_pieces(sample, out)
        if outs and ins:
            g = torch.Generator().manual_seed(seed)
            gouts = [torch.randn(o.shape, generator=g, dtype=torch.float32).to(o.dtype) for o in outs]
            grads = torch.autograd.grad(outs, ins, gouts, allow_unused=True)
            res["grads"] = [None if x is None else x.detach() for x in grads]
            res["gouts"] = gouts
    return res


def _clone_leaf(x):
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().clone().requires_grad_(x.requires_grad)
    return x


def _snapshot(sample):
    """CPU copies of a sample's tensors, taken BEFORE the eager run (which may
    write into its inputs: running stats of batch_norm); each xla run moves
    its own copy of them to the device."""
    return (
        _tree_map(_clone_leaf, sample.input),
        _tree_map(_clone_leaf, tuple(sample.args)),
        {k: _tree_map(_clone_leaf, v) for k, v in sample.kwargs.items()},
    )


def _run_xla(op, sample, cpu_res, snap):
    x_input = _tree_map(_to_xla_leaf, snap[0])
    x_args = _tree_map(_to_xla_leaf, snap[1])
    x_kwargs = _to_xla_kwargs(snap[2])
    from torch.testing._internal.opinfo.core import SampleInput

    xsample = SampleInput(x_input, args=x_args, kwargs=x_kwargs, output_process_fn_grad=sample.output_process_fn_grad)
    out = op(xsample.input, *xsample.args, **xsample.kwargs)
    res = {"out": xsample.output_process_fn_grad(out)}
    if "gouts" in cpu_res:
        import torch

        outs, ins = _grad_pieces(xsample, out)
        if len(outs) != len(cpu_res["gouts"]):
            raise AssertionError(f"{len(outs)} differentiable outputs on xla, {len(cpu_res['gouts'])} on CPU")
        gouts = [g.to("xla") for g in cpu_res["gouts"]]
        grads = torch.autograd.grad(outs, ins, gouts, allow_unused=True)
        res["grads"] = list(grads)
        res["out"] = _tree_map(_detach_leaf, res["out"])
    return res


_LOW_PRECISION = ("bfloat16", "float16")


def _rmse(a, b):
    import torch

    d = a.double() - b.double()
    finite = torch.isfinite(d)
    return float(torch.sqrt(torch.mean(torch.where(finite, d, 0.0) ** 2))) if d.numel() else 0.0


def _at_least_eager_accuracy(op, sample, snap, cpu_res, xla_res):
    """For bf16/f16 values that differ from eager beyond tolerance: are they at
    least as accurate as eager's, measured against the op run in float64?

    The criterion of torch's own low-precision comparisons (torch._dynamo's
    ``same(..., fp64_ref)``): error ≤ 2 × eager's error + 1e-5 (RMS over each
    output). Eager CPU rounds intermediates to bf16 where XLA keeps float32,
    so the two legitimately differ by more than bf16's rtol; this separates
    that from wrong results. Non-finite positions must agree exactly.
    Returns a description when it holds, else None.
    """
    import torch

    def up(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().to(torch.float64)
        if x in (torch.bfloat16, torch.float16):  # dtype= arguments
            return torch.float64
        return x

    try:
        # the snapshot: the eager run may have written into the sample's inputs
        ref = op(_tree_map(up, snap[0]), *_tree_map(up, snap[1]), **{k: _tree_map(up, v) for k, v in snap[2].items()})
        ref = sample.output_process_fn_grad(ref)
    except Exception:  # noqa: BLE001  (no float64 reference: the eager comparison stands)
        return None
    got = _leaves(_tree_map(_to_cpu_leaf, xla_res["out"]))
    want = _leaves(cpu_res["out"])
    refs = _leaves(ref)
    if not (len(got) == len(want) == len(refs)):
        return None
    worst = 0.0
    for g, w, r in zip(got, want, refs):
        if not isinstance(w, torch.Tensor) or not w.is_floating_point():
            if isinstance(w, torch.Tensor) and not torch.equal(g, w):
                return None
            continue
        if g.shape != w.shape or g.dtype != w.dtype or r.shape != w.shape:
            return None
        gf, wf = torch.isfinite(g), torch.isfinite(w)
        if not torch.equal(gf, wf) or not torch.equal(
            torch.where(gf, 0, g.double()).nan_to_num(7.0), torch.where(wf, 0, w.double()).nan_to_num(7.0)
        ):
            return None
        e_got, e_eager = _rmse(g, r), _rmse(w, r)
        if e_got > 2.0 * e_eager + 1e-5:
            return None
        worst = max(worst, e_got / max(e_eager, 1e-30))
    return f"within eager's accuracy vs float64 (RMS error ratio {worst:.2f})"


def _compare(cpu_res, xla_res, tol, shape_only):
    import torch

    actual = _tree_map(_to_cpu_leaf, xla_res["out"])
    expected = cpu_res["out"]
    kw = {} if tol is None else {"atol": tol[0], "rtol": tol[1]}
    if shape_only:
        a, e = _leaves(actual), _leaves(expected)
        if len(a) != len(e):
            raise AssertionError(f"{len(a)} outputs, expected {len(e)}")
        for x, y in zip(a, e):
            if isinstance(y, torch.Tensor):
                if not isinstance(x, torch.Tensor):
                    raise AssertionError(f"got {type(x).__name__}, expected a tensor")
                if x.shape != y.shape or x.dtype != y.dtype:
                    raise AssertionError(f"got {tuple(x.shape)} {x.dtype}, expected {tuple(y.shape)} {y.dtype}")
    else:
        torch.testing.assert_close(actual, expected, equal_nan=True, **kw)
    if "grads" in cpu_res and shape_only:
        # random forward values: their gradients are random too
        for i, (g, w) in enumerate(zip(xla_res.get("grads", []), cpu_res["grads"])):
            if (g is None) != (w is None) or (w is not None and (g.shape != w.shape or g.dtype != w.dtype)):
                raise AssertionError(
                    f"grad {i}: got {None if g is None else (tuple(g.shape), g.dtype)}, "
                    f"expected {None if w is None else (tuple(w.shape), w.dtype)}"
                )
        return
    if "grads" in cpu_res:
        got = [None if g is None else g.detach().cpu() for g in xla_res.get("grads", [])]
        want = cpu_res["grads"]
        for i, (g, w) in enumerate(zip(got, want)):
            if (g is None) != (w is None):
                raise AssertionError(
                    f"grad {i}: got {'None' if g is None else 'a tensor'}, "
                    f"expected {'None' if w is None else 'a tensor'}"
                )
            if g is not None:
                try:
                    torch.testing.assert_close(g, w, equal_nan=True, **kw)
                except AssertionError as e:
                    raise AssertionError(f"grad {i}: {e}") from None


def _no_test_fn():
    return None


def select_samples(op, dtype, requires_grad, max_samples=None, also=()):
    """``[(index, SampleInput)]``: all samples, or the first ``max_samples`` plus
    the indices in ``also``. Samples are drawn with torch's RNG seeded to 0 and
    materialised before anything runs, so index ``i`` is the same sample in
    every run (and in the full report)."""
    import torch
    from torch.testing._internal import common_utils
    from torch.testing._internal.opinfo import core

    torch.manual_seed(0)
    # OpInfo's sample iterator looks for the calling unittest method with
    # inspect.stack() (~60 ms a call, more than most entries take to run);
    # there is none here, so the answer is None either way.
    find = common_utils.extract_test_fn
    common_utils.extract_test_fn = core.extract_test_fn = _no_test_fn
    try:
        gen = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    finally:
        common_utils.extract_test_fn = core.extract_test_fn = find
    if max_samples is None:
        return list(enumerate(gen))
    last = max([max_samples - 1, *also])
    want = set(range(max_samples)) | set(also)
    return [(i, s) for i, s in enumerate(itertools.islice(gen, last + 1)) if i in want]


class EntryRun:
    """One OpInfo entry in one dtype/mode, run in phases so that several entries
    can share one ``spmdtorch.sync()`` (``run_entries``).

    ``prepare()`` draws the samples and runs them in eager torch; ``trace(ids)``
    records the xla runs of those samples; after a sync, ``compare(ids)``
    checks them; ``record()`` returns the result dict.
    """

    def __init__(self, op, dtype, grad=False, sample_timeout=60.0, max_samples=None, also=()):
        self.op, self.dtype, self.grad = op, dtype, bool(grad)
        self.sample_timeout = sample_timeout
        self.max_samples, self.also = max_samples, tuple(also)
        dname = str(dtype).replace("torch.", "")
        self.rec = {"name": entry_name(op), "dtype": dname, "mode": mode_key(dname, grad), "grad": self.grad}
        self.finished = False  # the record is final without running anything
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self.idx: list = []
        self.samples: list = []
        self.results: list = []  # per sample: "pass" | (kind, reason, detail), kind "fail" | "eager_error" | "n/a"
        self.xres: dict = {}
        self.fp64_passes = 0  # low-precision samples that pass by the float64-reference criterion

    def prepare(self):
        op, dtype, rec = self.op, self.dtype, self.rec
        if dtype not in op.supported_dtypes("cpu"):
            rec.update(status="n/a", reason="dtype not supported by eager torch", samples=0)
        elif self.grad and not op.supports_autograd:
            rec.update(status="n/a", reason="op does not support autograd (OpInfo supports_autograd=False)", samples=0)
        elif self.grad and dtype not in op.supported_backward_dtypes("cpu"):
            rec.update(status="n/a", reason="dtype not supported by eager torch's backward", samples=0)
        if "status" in rec:
            self.finished = True
            return self
        # getattr: OpInfo has the field only in newer torch (2.13 does, 2.11 does not)
        self.shape_only = getattr(op, "has_nondeterministic_output", False) or op.name in RANDOM_OPS
        self.tol = tolerances(op, dtype)
        rec["tol"] = self.tol
        try:
            with _alarm(self.sample_timeout * 4):
                picked = select_samples(op, dtype, self.grad, self.max_samples, self.also)
        except Exception as e:  # noqa: BLE001
            rec.update(status="fail", reason="sample_inputs raised: " + _first_line(e), samples=0)
            self.finished = True
            return self
        self.idx = [i for i, _ in picked]
        self.samples = [s for _, s in picked]
        self.random = [_random_sample(op, s) for s in self.samples]
        n = len(self.samples)
        self.results = [None] * n
        self.cpu_res = [None] * n
        self.snaps = [None] * n
        for i, s in enumerate(self.samples):
            try:
                with _alarm(self.sample_timeout):
                    self.snaps[i] = _snapshot(s)
            except Exception as e:  # noqa: BLE001
                self.results[i] = ("fail", _first_line(e), _details(e))
                continue
            try:
                with _alarm(self.sample_timeout):
                    self.cpu_res[i] = _run_cpu(op, s, self.grad, seed=self.idx[i])
            except Exception as e:  # noqa: BLE001
                self.results[i] = ("eager_error", _first_line(e), _details(e))
        return self

    def todo(self):
        return [i for i, r in enumerate(self.results) if r is None]

    def trace(self, ids, sync_each=False):
        """Record the xla runs of samples ``ids`` (results stay pending unless ``sync_each``)."""
        import spmdtorch

        for i in ids:
            try:
                with _alarm(self.sample_timeout):
                    self.xres[i] = _run_xla(self.op, self.samples[i], self.cpu_res[i], self.snaps[i])
                    if sync_each:
                        spmdtorch.sync()
            except SampleNotApplicable as e:
                self.results[i] = ("n/a", str(e), "")
                self.xres.pop(i, None)
            except Exception as e:  # noqa: BLE001
                self.results[i] = ("fail", _first_line(e), _details(e))
                self.xres.pop(i, None)

    def fail_pending(self, exc):
        """The sync that was to compute the traced samples raised."""
        for i in self.xres:
            self.results[i] = ("fail", _first_line(exc), _details(exc))
        self.xres.clear()

    def compare(self):
        for i, r in self.xres.items():
            try:
                with _alarm(self.sample_timeout):
                    _compare(self.cpu_res[i], r, self.tol, self.shape_only or self.random[i])
                self.results[i] = "pass"
            except AssertionError as e:
                self.results[i] = ("fail", _first_line(e), _details(e))
                if self.rec["dtype"] in _LOW_PRECISION and not self.grad and "close" in str(e):
                    with _alarm(self.sample_timeout):
                        why = _at_least_eager_accuracy(self.op, self.samples[i], self.snaps[i], self.cpu_res[i], r)
                    if why is not None:
                        self.results[i] = "pass"
                        self.fp64_passes += 1
            except Exception as e:  # noqa: BLE001
                self.results[i] = ("fail", _first_line(e), _details(e))
        self.xres.clear()

    def redo_failures_alone(self, ids):
        """Samples ``ids`` that failed in a batched sync or comparison are re-run
        one per sync, so that each failure is the sample's own."""
        for i in ids:
            if self.results[i] == "pass" or self.results[i][0] != "fail":
                continue
            self.results[i] = None
            self.trace([i], sync_each=True)
            self.compare()

    def record(self):
        import spmdtorch  # noqa: F401

        rec = self.rec
        if self.finished:
            return rec
        idx, results = self.idx, self.results

        def of(kind):
            return [(idx[i], r) for i, r in enumerate(results) if r != "pass" and r[0] == kind]

        fails, eager, na = of("fail"), of("eager_error"), of("n/a")
        passed = sum(r == "pass" for r in results)
        rec.update(
            samples=len(results),
            passed=passed,
            failed=len(fails),
            eager_error=len(eager),
            not_applicable=len(na),
            failing_samples=[i for i, _ in fails],
            failures=[{"sample": i, "reason": r[1], "detail": r[2]} for i, r in fails[:MAX_FAILURE_DETAILS]],
            eager_errors=[{"sample": i, "reason": r[1]} for i, r in eager[:MAX_FAILURE_DETAILS]],
            na_reasons=dict(collections.Counter(r[1] for _, r in na)),
            shape_only=bool(self.shape_only),
            shape_only_samples=len(results) if self.shape_only else sum(self.random),
            passed_vs_fp64=self.fp64_passes,
        )
        if fails:
            rec.update(status="fail", reason=fails[0][1][1])
        elif passed:
            rec.update(status="pass", reason="")
        elif eager and not na:
            rec.update(status="n/a", reason="eager torch raised on every sample")
        elif na and not eager:
            rec.update(status="n/a", reason="no sample can run on xla: " + "; ".join(sorted(rec["na_reasons"])))
        else:
            rec.update(
                status="n/a",
                reason="every sample raised in eager torch or cannot run on xla" if results else "no samples",
            )
        rec["seconds"] = round(time.perf_counter() - self.t0, 3)
        return rec


def _sync_or_fail(runs, sample_timeout):
    """One sync for every sample traced by ``runs``; a failing sync fails them all
    (they are then re-run alone by ``redo_failures_alone``)."""
    import spmdtorch

    pending = sum(len(r.xres) for r in runs)
    if not pending:
        return
    try:
        with _alarm(sample_timeout * max(1, pending) / 2):
            spmdtorch.sync()
    except Exception as e:  # noqa: BLE001
        for r in runs:
            r.fail_pending(e)


def run_entry(op, dtype, grad=False, sample_timeout=60.0, batch=True, chunk=48, max_samples=None, also=()):
    """Run the samples of one OpInfo entry for ``dtype``; return a result dict.

    Args:
        op: an OpInfo.
        dtype: torch dtype of the samples.
        grad: compare gradients too (ops with autograd support; others are n/a).
        sample_timeout: seconds per sample (Python-level guard).
        batch: trace several samples per ``spmdtorch.sync()``.
        chunk: samples per sync.
        max_samples: only the first N samples (None: all)...
        also: ...plus these sample indices.
    """
    import spmdtorch

    c0 = spmdtorch.debug.counter_value("UncachedCompile")
    run = EntryRun(op, dtype, grad, sample_timeout, max_samples, also).prepare()
    if run.finished:
        return run.rec
    todo = run.todo()
    if batch and len(todo) > 1:
        # One sync per chunk: a graph of hundreds of samples compiles slower
        # than several of ~50 (max_pool3d: 2 min for 576 samples at once).
        batched = []
        for c in range(0, len(todo), chunk):
            run.trace(todo[c : c + chunk])
            batched += list(run.xres)
            _sync_or_fail([run], sample_timeout)
            run.compare()
        if len(todo) > 4 * chunk:
            gc.collect()  # ~1 s with op_db loaded: only after big entries
        run.redo_failures_alone(batched)
    else:
        for i in todo:
            run.trace([i], sync_each=True)
            run.compare()
    rec = run.record()
    rec["compiles"] = spmdtorch.debug.counter_value("UncachedCompile") - c0
    return rec


def run_entries(specs, sample_timeout=60.0):
    """Run several entries with ONE sync for all their samples (then failures alone).

    Args:
        specs: ``(op, dtype, grad, max_samples, also)`` tuples.
        sample_timeout: seconds per sample.

    Returns:
        The result dicts, in order. The same verdicts as ``run_entry`` gives
        each entry; the shared sync just saves one compile per entry.
    """
    runs = [EntryRun(op, dt, g, sample_timeout, ms, also).prepare() for op, dt, g, ms, also in specs]
    live = [r for r in runs if not r.finished]
    for r in live:
        r.trace(r.todo())
    _sync_or_fail(live, sample_timeout)
    for r in live:
        batched = list(r.xres)
        r.compare()
        r.redo_failures_alone(batched)
    return [r.record() for r in runs]


# -- classification --------------------------------------------------------------------


def category(rec) -> str:
    """Coarse group of a failure reason."""
    r = rec.get("reason", "")
    if rec["status"] != "fail":
        return rec["status"]
    if "no lowering" in r or "has no lowering" in r or ("NotImplementedError" in r and "aten." in r):
        return "missing lowering"
    if r.startswith(("Timeout", "SampleTimeout", "WorkerCrash")):
        return "timeout/crash"
    if "dtype" in r and ("AssertionError" in r or "do not match" in r):
        return "dtype issue"
    if r.startswith("AssertionError") and ("not close" in r or "not equal" in r or "Scalars" in r):
        return "numerical mismatch"
    if r.startswith("AssertionError") and ("shape" in r or "attribute" in r):
        return "shape/metadata mismatch"
    if "OverflowError" in r and "int32" in r:
        return "dtype issue"
    return "engine/lowering error"


def _normalize_reason(r: str) -> str:
    """Reason text with numbers/shapes collapsed, for grouping."""
    return re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", r)


def compare_cpu_xfails(op_db) -> list[str]:
    """Entries OpInfo itself marks ``expectedFailure`` in TestCommon.test_compare_cpu
    (eager CPU and other devices are known to disagree)."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    out = []
    for op in op_db:
        for info in list(op.skips or ()) + list(op.decorators or ()):
            if (
                isinstance(info, DecorateInfo)
                and info.test_name == "test_compare_cpu"
                and info.device_type is None
                and any(getattr(d, "__name__", "") == "expectedFailure" for d in info.decorators)
            ):
                out.append(entry_name(op))
                break
    return out


# -- the JSON database and the markdown report -----------------------------------------


def load_db(out_json):
    if os.path.exists(out_json):
        with open(out_json) as f:
            db = json.load(f)
        if db.get("format") == 2:
            return db
    return {"format": 2, "modes": {}}


def _trimmed(rec):
    """A record as stored: failure details cut to their head, at most 100 failing indices."""
    rec = dict(rec)
    if rec.get("failures"):
        rec["failures"] = [dict(f, detail=(f.get("detail") or "")[:500]) for f in rec["failures"]]
    fs = rec.get("failing_samples")
    if fs and len(fs) > 100:
        rec["failing_samples"] = fs[:100]
        rec["failing_samples_truncated"] = len(fs)
    return rec


def save_db(db, out_json):
    """One line per entry record: reviewable diffs, a fraction of indented JSON's size."""
    os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
    lines = ['{"format": 2, "modes": {']
    modes = list(db["modes"].items())
    for mi, (m, body) in enumerate(modes):
        lines.append(f' {json.dumps(m)}: {{"meta": {json.dumps(body.get("meta", {}), default=str)}, "entries": {{')
        ents = list(body["entries"].items())
        for ei, (name, rec) in enumerate(ents):
            comma = "," if ei < len(ents) - 1 else ""
            rec = _trimmed(rec)
            lines.append(f"  {json.dumps(name)}: {json.dumps(rec, default=str, separators=(',', ':'))}{comma}")
        lines.append(" }}" + ("," if mi < len(modes) - 1 else ""))
    lines.append("}}")
    with open(out_json, "w") as f:
        f.write("\n".join(lines) + "\n")


def _totals(entries):
    c = collections.Counter(r["status"] for r in entries)
    s = {
        k: sum(r.get(k, 0) or 0 for r in entries)
        for k in ("samples", "passed", "failed", "eager_error", "not_applicable")
    }
    return c, s


def _pct(a, b):
    return f"{100.0 * a / b:.1f}%" if b else "-"


def render_markdown(db, out_md, op_db_len):
    modes = [m for m in MODES if m in db["modes"]]
    lines = [
        "# OpInfo coverage",
        "",
        "Generated by `tools/opinfo_report.py` from `docs/opinfo_coverage.json`: every entry of",
        "PyTorch's OpInfo database (`torch.testing._internal.common_methods_invocations.op_db`)",
        "run through spmdtorch and compared with eager CPU torch (`torch.testing.assert_close`,",
        "the OpInfo's tolerance overrides where it declares any), **every sample** of each entry.",
        "",
        "The CI test (`tests/ops/test_opinfo.py`) runs every entry in every mode too, but only its",
        "first samples (plus the first failing sample of entries in the expected-failure list",
        "`tests/ops/opinfo_expected_failures.py`, which is generated from this report); this report",
        "is the full run.",
        "",
        "Verdicts: an entry **passes** when every sample matches (values; shape and dtype only for",
        "random/uninitialised outputs), **fails** when any sample fails, and is **n/a** when eager",
        "torch does not support the dtype (or, in grad mode, the op has no autograd), or none of its",
        "samples can run at all. Samples that raise in eager torch too are counted, not compared;",
        "samples that cannot exist on the xla device (sparse layouts) are counted as n/a.",
        "bfloat16 values that differ from eager bfloat16 beyond the tolerance pass only if they are at least",
        "as accurate as eager's against the op run in float64 (how many, and which entries, is listed per mode).",
        "",
        "## Totals",
        "",
        (
            "| mode | entries run | pass | fail | n/a | **pass rate** (pass / (pass + fail)) "
            "| samples: pass / fail / eager error / n/a | sample pass rate |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in modes:
        ents = list(db["modes"][m]["entries"].values())
        c, s = _totals(ents)
        lines.append(
            f"| {m} | {len(ents)} of {op_db_len} | {c['pass']} | {c['fail']} | {c['n/a']} | "
            f"**{_pct(c['pass'], c['pass'] + c['fail'])}** | {s['passed']} / {s['failed']} / {s['eager_error']} / "
            f"{s['not_applicable']} | {_pct(s['passed'], s['passed'] + s['failed'])} |"
        )
    lines.append("")
    lines.append(
        "Each entry's record comes from the last run that included it: a full run per mode, then "
        "`--failed` re-runs after fixes (passing entries keep their full-run record; CI re-checks "
        "every entry's first samples with the current code)."
    )
    lines.append("")
    lines.append(
        "A known source of float32 mismatches: XLA's CPU compiler always contracts a multiply "
        "feeding an add into one fused multiply-add (one rounding; more accurate), eager rounds "
        "twice. Where a formula cancels (`1 - x*x` in the `asin`/`atanh` gradients near |x| = 1) "
        "the difference exceeds OpInfo's tolerance."
    )
    lines.append("")
    for m in modes:
        meta = db["modes"][m].get("meta", {})
        lines.append(
            f"- {m}: torch {meta.get('torch')}, jax {meta.get('jax')}; last run "
            f"`{meta.get('command')}` ({meta.get('wall_s', 0):.0f} s, {meta.get('jobs')} worker(s), "
            f"XLA_FLAGS `{meta.get('xla_flags')}`)"
        )
    xfail = set()
    for m in modes:
        xfail |= set(db["modes"][m].get("meta", {}).get("compare_cpu_xfails", ()))
    for m in modes:
        ents = sorted(db["modes"][m]["entries"].values(), key=lambda r: r.get("index", 0))
        c, _ = _totals(ents)
        lines += ["", f"## {m}", ""]
        shape_only = sum(1 for r in ents if r.get("shape_only") and r["status"] == "pass")
        so_samples = sum(r.get("shape_only_samples", 0) or 0 for r in ents)
        lines.append(
            f"{c['pass']} pass ({shape_only} of them random/uninitialised ops checked on shape and dtype "
            f"only; {so_samples} samples in all are checked that way), {c['fail']} fail, {c['n/a']} n/a."
        )
        fp64 = [r for r in ents if (r.get("passed_vs_fp64") or 0) > 0]
        if fp64:
            lines.append("")
            lines.append(
                f"{sum(r['passed_vs_fp64'] for r in fp64)} samples in {len(fp64)} entries "
                f"({sum(r['status'] == 'pass' for r in fp64)} of them passing) differ from eager {m} beyond the "
                "OpInfo tolerance but pass as at least as accurate as eager against the op run in float64 "
                "(RMS error ≤ 2 × eager's + 1e-5; eager CPU rounds intermediates to bf16 where XLA keeps "
                "float32). Without this criterion these entries would fail: "
                + ", ".join(f"`{r['name']}`" for r in fp64 if r["status"] == "pass")
                + "."
            )
        cats = collections.Counter(category(r) for r in ents if r["status"] == "fail")
        if cats:
            lines += ["", "| failure category | entries |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in cats.most_common()]
        reasons = collections.Counter(_normalize_reason(r["reason"]) for r in ents if r["status"] == "fail")
        common = [(k, v) for k, v in reasons.most_common(12) if v > 1]
        if common:
            lines += ["", "| entries | most common reasons |", "|---|---|"]
            lines += [f"| {v} | `{k.replace('|', '/')[:160]}` |" for k, v in common]
        fails = sorted((r for r in ents if r["status"] == "fail"), key=lambda r: (category(r), r["reason"], r["name"]))
        if fails:
            lines += [
                "",
                (
                    "Failing entries (samples: failing/total; the reason is the first failing sample's; "
                    '"OpInfo xfail": OpInfo itself marks the entry expectedFailure in '
                    "`TestCommon.test_compare_cpu`):"
                ),
                "",
                "| entry | category | samples | reason |",
                "|---|---|---|---|",
            ]
            for r in fails:
                mark = " (OpInfo xfail)" if r["name"] in xfail else ""
                lines.append(
                    f"| `{r['name']}`{mark} | {category(r)} | {r.get('failed', '?')}/{r.get('samples', '?')} "
                    f"| `{r['reason'].replace('|', '/')[:200]}` |"
                )
        na = [r for r in ents if r["status"] == "n/a"]
        if na:
            by = collections.defaultdict(list)
            for r in na:
                by[r["reason"]].append(r["name"])
            lines += ["", "Not applicable:", ""]
            for rsn, names in sorted(by.items(), key=lambda kv: -len(kv[1])):
                lines.append(f"- {rsn} ({len(names)}): " + ", ".join(f"`{x}`" for x in sorted(names)))
        na_samples = collections.Counter()
        for r in ents:
            for k, v in (r.get("na_reasons") or {}).items():
                na_samples[k] += v
        if na_samples:
            lines += [
                "",
                "Samples that cannot run on xla (counted as n/a): "
                + "; ".join(f"{k}: {v}" for k, v in na_samples.most_common()),
            ]
    with open(out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    return out_md


# -- the expected-failure list ------------------------------------------------------------

_EXPECTED_HEADER = '''"""OpInfo entries that fail through spmdtorch, per dtype and mode, with the reason.

GENERATED by ``python tools/opinfo_report.py --write-expected {path}`` from the
full run in docs/opinfo_coverage.json; regenerate after fixing ops (and re-run
the report for them first). ``tests/ops/test_opinfo.py`` holds every entry to
this list: an entry listed here that passes fails the test ("unexpectedly
passed"), an entry not listed that fails fails the test.

Keys are ``(op name, variant_test_name, dtype, mode)`` with mode ``"forward"``
or ``"grad"``. Values are ``(first failing sample index, reason)``; the CI test
runs that sample besides the first few, so the failure is re-checked every time.
A ``None`` sample means the entry timed out or crashed its worker in the full
run: CI cannot re-run all of it, so it checks that the first samples pass.
"""

EXPECTED_FAILURES: dict[tuple[str, str, str, str], tuple[int | None, str]] = {{
'''


def short_reason(rec) -> str:
    """``category: first line`` of a failure, shortened for the expected-failure list."""
    r = rec["reason"]
    m = re.search(r"has no lowering for ATen op '([^']+)'", r)
    if m:
        r = f"no lowering for {m.group(1)} (and no torch decomposition)"
    r = r.replace("AssertionError: ", "")
    return f"{category(rec)}: {r}"[:200]


def write_expected(db, path, op_db):
    by_name = {entry_name(op): (op.name, op.variant_test_name or "") for op in op_db}
    rows = []
    for m, (dtype, grad) in MODES.items():
        for r in db["modes"].get(m, {}).get("entries", {}).values():
            if r["status"] != "fail":
                continue
            name, variant = by_name[r["name"]]
            fs = r.get("failing_samples") or [None]
            rows.append(((name, variant, dtype, "grad" if grad else "forward"), (fs[0], short_reason(r))))
    rows.sort()
    lines = [_EXPECTED_HEADER.format(path=path)]
    for k, v in rows:
        lines.append(f"    {k!r}: ({v[0]!r}, {v[1]!r}),\n")
    lines.append("}\n")
    with open(path, "w") as f:
        f.write("".join(lines))
    return len(rows)


# -- worker processes ----------------------------------------------------------------


def _select(op_db, names):
    entries = list(enumerate(op_db))
    if names:
        want = set(names)
        entries = [(i, op) for i, op in entries if op.name in want or entry_name(op) in want]
        missing = want - {op.name for _, op in entries} - {entry_name(op) for _, op in entries}
        if missing:
            raise SystemExit(f"unknown OpInfo entries: {sorted(missing)}")
    return entries


def worker_main(args):
    """Read op_db indices on stdin, write one JSON record per line on the protocol fd."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from ops go to stderr
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    import spmdtorch  # noqa: F401

    dtype = getattr(torch, args.dtype)
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        idx = int(line)
        op = op_db[idx]
        try:
            rec = run_entry(
                op, dtype, grad=args.grad, sample_timeout=args.sample_timeout, max_samples=args.max_samples or None
            )
        except BaseException as e:  # noqa: BLE001
            rec = {
                "name": entry_name(op),
                "status": "fail",
                "reason": "HarnessError: " + _first_line(e),
                "detail": traceback.format_exc()[-1500:],
            }
        rec["index"] = idx
        proto.write(json.dumps(rec, default=str) + "\n")


def _rss_gb(pid) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


class _Worker:
    """One worker process; killed on timeout or when its memory passes the limit."""

    def __init__(self, argv, env, nice, max_rss_gb, recycle_gb):
        self.argv, self.env, self.nice = argv, env, nice
        self.max_rss_gb, self.recycle_gb = max_rss_gb, recycle_gb
        self.proc = None
        self.lines: queue.Queue = queue.Queue()

    def start(self):
        nice = self.nice
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=self.env,
            text=True,
            bufsize=1,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        )
        self.lines = queue.Queue()
        proc, lines = self.proc, self.lines

        def pump():
            for ln in proc.stdout:
                lines.put(ln)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        ready = self.lines.get(timeout=600)
        if ready is None:
            raise RuntimeError("worker failed to start")

    def run(self, idx, timeout):
        if self.proc is None or self.proc.poll() is not None:
            try:
                self.start()
            except Exception as e:  # noqa: BLE001
                self.kill()
                return {"status": "fail", "reason": f"WorkerCrash: worker did not start ({_first_line(e)})"}
        self.proc.stdin.write(f"{idx}\n")
        self.proc.stdin.flush()
        deadline = time.time() + timeout
        peak = 0.0
        while True:
            try:
                ln = self.lines.get(timeout=0.5)
                break
            except queue.Empty:
                rss = _rss_gb(self.proc.pid)
                peak = max(peak, rss)
                if rss > self.max_rss_gb:
                    self.kill()
                    return {
                        "status": "fail",
                        "reason": f"WorkerCrash: worker memory {rss:.1f} GB passed "
                        f"--max-rss-gb {self.max_rss_gb} (worker killed)",
                    }
                if time.time() > deadline:
                    self.kill()
                    return {
                        "status": "fail",
                        "reason": f"Timeout: entry ran longer than {timeout:.0f}s (worker killed)",
                    }
        if ln is None:
            rc = self.proc.wait()
            self.proc = None
            return {"status": "fail", "reason": f"WorkerCrash: worker exited with code {rc}"}
        rec = json.loads(ln)
        rec["worker_rss_gb"] = round(max(peak, _rss_gb(self.proc.pid)), 2)
        if _rss_gb(self.proc.pid) > self.recycle_gb:
            self.kill()  # compile caches and leaked graphs grow: start a fresh one
        return rec

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=list(MODES), default=None)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--grad", action="store_true", help="also compare gradients (same as --mode float32-grad)")
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (name or name.variant)")
    p.add_argument("--start", type=int, default=0, help="first op_db index to run")
    p.add_argument("--stop", type=int, default=None, help="op_db index to stop before")
    p.add_argument("--failed", action="store_true", help="only entries that failed (or crashed) in the JSON's mode")
    p.add_argument("--max-samples", type=int, default=0, help="only the first N samples of each entry (0: all)")
    p.add_argument("--out", default=DEFAULT_OUT)
    p.add_argument("--jobs", type=int, default=1, help="worker processes (0: run in this process)")
    p.add_argument("--nice", type=int, default=10, help="niceness of the workers")
    p.add_argument("--max-rss-gb", type=float, default=5.0, help="kill a worker whose memory passes this")
    p.add_argument("--recycle-gb", type=float, default=2.5, help="restart a worker above this between entries")
    p.add_argument("--sample-timeout", type=float, default=60.0, help="seconds per sample (Python-level guard)")
    p.add_argument("--entry-timeout", type=float, default=300.0, help="hard limit per entry (worker killed)")
    # XLA's default level, as in CI (tests/ops/test_opinfo.py): near-tolerance
    # numerics differ between levels, and the expected-failure list must hold there.
    p.add_argument("--opt-level", default="", help="--xla_backend_optimization_level for the run ('' keeps XLA's)")
    p.add_argument("--resume", action="store_true", help="reuse records of an interrupted run (.partial.jsonl)")
    p.add_argument("--render", action="store_true", help="only re-render the markdown from the JSON")
    p.add_argument("--write-expected", default="", help="write the expected-failure module from the JSON and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode:
        args.dtype, args.grad = MODES[args.mode]
    mode = mode_key(args.dtype, args.grad)

    # The same 8 simulated CPU devices as tests/conftest.py: XLA's CPU
    # programs (thread split, summation order) depend on it, and the CI test
    # must reproduce this report's near-tolerance verdicts.
    from spmdtorch.runtime.cpu_devices import cpu_device_env

    env = cpu_device_env(8)
    if args.opt_level != "" and "xla_backend_optimization_level" not in env["XLA_FLAGS"]:
        env["XLA_FLAGS"] += f" --xla_backend_optimization_level={args.opt_level}"
    if args.worker:
        return worker_main(args)
    if args.jobs == 0:
        os.environ.update({k: env[k] for k in ("XLA_FLAGS", "JAX_PLATFORMS", "PJRT_DEVICE", "NPROC")})

    import warnings

    warnings.filterwarnings("ignore")
    import jax
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    out_json = os.path.splitext(args.out)[0] + ".json"
    db = load_db(out_json)
    if args.render:
        print("wrote", render_markdown(db, args.out, len(op_db)))
        return
    if args.write_expected:
        n = write_expected(db, args.write_expected, op_db)
        print(f"wrote {args.write_expected}: {n} expected failures")
        return

    names = [s.strip() for s in args.ops.split(",") if s.strip()]
    entries = _select(op_db, names)
    entries = [(i, op) for i, op in entries if i >= args.start and (args.stop is None or i < args.stop)]
    if args.failed:
        old = db["modes"].get(mode, {}).get("entries", {})
        entries = [(i, op) for i, op in entries if old.get(entry_name(op), {}).get("status") == "fail"]
    dtype = getattr(torch, args.dtype)
    t0 = time.time()
    records = [None] * len(entries)
    done = [0]
    lock = threading.Lock()
    partial = os.path.join(PARTIAL_DIR, f"{mode}.partial.jsonl")
    os.makedirs(PARTIAL_DIR, exist_ok=True)
    finished = {}
    if args.resume and os.path.exists(partial):
        with open(partial) as f:
            for ln in f:
                r = json.loads(ln)
                finished[r["index"]] = r
    partial_f = open(partial, "a" if args.resume else "w")

    def progress(k, rec):
        with lock:
            partial_f.write(json.dumps(rec, default=str) + "\n")
            partial_f.flush()
            done[0] += 1
            print(
                f"[{done[0]}/{len(entries)} {time.time() - t0:6.0f}s] {rec['name']:45s} {rec['status']:4s} "
                f"{rec.get('passed', 0)}/{rec.get('samples', 0)} {rec.get('seconds', '')}s "
                f"{rec.get('reason', '')[:90]}",
                flush=True,
            )

    if args.jobs == 0:
        import spmdtorch  # noqa: F401

        for k, (idx, op) in enumerate(entries):
            if idx in finished:
                records[k] = finished[idx]
                continue
            rec = run_entry(
                op, dtype, grad=args.grad, sample_timeout=args.sample_timeout, max_samples=args.max_samples or None
            )
            rec["index"] = idx
            records[k] = rec
            progress(k, rec)
    else:
        work: queue.Queue = queue.Queue()
        for k, (idx, op) in enumerate(entries):
            if idx in finished:
                records[k] = finished[idx]
                done[0] += 1
            else:
                work.put((k, idx, op))
        wargv = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--dtype",
            args.dtype,
            "--sample-timeout",
            str(args.sample_timeout),
            "--max-samples",
            str(args.max_samples),
        ]
        wargv += ["--grad"] if args.grad else []

        def loop():
            w = _Worker(wargv, env, args.nice, args.max_rss_gb, args.recycle_gb)
            while True:
                try:
                    k, idx, op = work.get_nowait()
                except queue.Empty:
                    break
                try:
                    rec = w.run(idx, args.entry_timeout)
                except Exception as e:  # noqa: BLE001  (a thread must not die with work left)
                    w.kill()
                    rec = {"status": "fail", "reason": "HarnessError: " + _first_line(e)}
                rec.setdefault("name", entry_name(op))
                rec.setdefault("dtype", args.dtype)
                rec.setdefault("mode", mode)
                rec["index"] = idx
                records[k] = rec
                progress(k, rec)
            w.kill()

        threads = [threading.Thread(target=loop) for _ in range(max(1, args.jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    partial_f.close()

    command = "python tools/opinfo_report.py " + " ".join(argv if argv is not None else sys.argv[1:])
    m = db["modes"].setdefault(mode, {"meta": {}, "entries": {}})
    m["meta"].update(
        {
            "dtype": args.dtype,
            "grad": args.grad,
            "torch": torch.__version__,
            "jax": jax.__version__,
            "op_db_entries": len(op_db),
            "jobs": args.jobs,
            "xla_flags": env["XLA_FLAGS"],
            "wall_s": time.time() - t0,
            "command": command,
            "max_samples": args.max_samples or None,
            "compare_cpu_xfails": compare_cpu_xfails(op_db),
        }
    )
    for r in records:
        if r is not None:
            m["entries"][r["name"]] = r
    m["entries"] = dict(sorted(m["entries"].items(), key=lambda kv: kv[1].get("index", 0)))
    save_db(db, out_json)
    md = render_markdown(db, args.out, len(op_db))
    counts = collections.Counter(r["status"] for r in records if r is not None)
    print(f"wrote {md} and {out_json}: {mode} {dict(counts)} in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
