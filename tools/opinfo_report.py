#!/usr/bin/env python
"""Run PyTorch's OpInfo database through spmdtorch and compare with eager CPU torch.

For every entry of ``torch.testing._internal.common_methods_invocations.op_db``
and the chosen dtype, each sample of ``op.sample_inputs("cpu", dtype)`` is run
on CPU and on copies moved with ``.to("xla")`` (tensors nested in args/kwargs
too, ``device="cpu"`` keyword arguments become ``"xla"``), and the results are
compared with ``torch.testing.assert_close`` using the OpInfo's own tolerance
overrides where it has any. With ``--grad`` (ops with ``supports_autograd``)
the gradients of every input that requires grad are compared too.

Each entry is classified as

* ``pass``: every sample matched;
* ``fail``: at least one sample failed; the reason is the first line of the
  first failing sample's exception (``NotImplementedError: spmdtorch has no
  lowering for aten.foo.default``), every failing sample is in the JSON;
* ``n/a``: the dtype is not in ``op.supported_dtypes("cpu")`` (eager torch
  does not support it), or eager torch itself raises on every sample.

No sample is skipped. Samples whose eager run raises are counted (and listed in
the JSON) as ``eager_error``. Ops whose values are random or uninitialised
(``has_nondeterministic_output``, dropout, ``bernoulli``, ``empty``...) are
compared on shape and dtype only and counted as ``pass_shape_only``.

Speed: the samples of one entry are traced lazily and computed by ONE
``spmdtorch.sync()`` (one XLA compile per entry instead of one per sample);
samples that fail in the batch are re-run one by one so that each failure is
attributed to its own sample. Work is spread over ``--jobs`` worker processes
(``XLA_FLAGS=--xla_backend_optimization_level=0`` there by default: compile
time dominates and the numbers are the same), each entry under a hard
time limit: a worker that hangs or crashes is restarted and the entry is a
failure (``Timeout`` / ``WorkerCrash``).

Usage::

    python tools/opinfo_report.py [--dtype float32|bfloat16] [--grad] [--ops name,...]
                                  [--limit N] [--jobs 2] [--out docs/opinfo_coverage.md]

The JSON (same path, ``.json``) has one record per entry with per-sample
failures.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
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

DTYPES = ("float32", "bfloat16")

# Ops whose outputs are random draws or uninitialised memory: eager and xla
# cannot agree on values (OpInfo skips them in TestCommon.test_compare_cpu).
RANDOM_OPS = frozenset({
    "bernoulli", "normal", "uniform", "cauchy", "exponential", "geometric", "log_normal",
    "multinomial", "rand_like", "randn_like", "randint_like", "randint", "randn", "rand",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
    "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d", "svd_lowrank", "pca_lowrank",
    "empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided",
    "torch.ops.aten._flash_attention_forward", "torch.ops.aten._efficient_attention_forward",
})


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


# -- tolerances ------------------------------------------------------------------


def tolerances(op, dtype):
    """(atol, rtol) for ``dtype``: assert_close's defaults, raised to the largest
    ``toleranceOverride``/``precisionOverride`` the OpInfo declares for CPU (or any
    device) and this dtype, in any test class. None means assert_close's defaults."""
    import torch
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
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
            raise NotImplementedError(f"sample has a {x.layout} tensor; only strided tensors go to xla")
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


def _grad_pieces(sample, out):
    """(outputs that need a gradient, inputs that require grad) of a sample run."""
    import torch

    out = sample.output_process_fn_grad(out)
    outs = [t for t in _leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    ins = [t for t in _leaves((sample.input, sample.args, sample.kwargs))
           if isinstance(t, torch.Tensor) and t.requires_grad]
    return outs, ins


def _run_cpu(op, sample, grad, seed):
    import torch

    out = op(sample.input, *sample.args, **sample.kwargs)
    res = {"out": _tree_map(_detach_leaf, out)}
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
    return (_tree_map(_clone_leaf, sample.input), _tree_map(_clone_leaf, tuple(sample.args)),
            {k: _tree_map(_clone_leaf, v) for k, v in sample.kwargs.items()})


def _run_xla(op, sample, cpu_res, snap):
    x_input = _tree_map(_to_xla_leaf, snap[0])
    x_args = _tree_map(_to_xla_leaf, snap[1])
    x_kwargs = _to_xla_kwargs(snap[2])
    from torch.testing._internal.opinfo.core import SampleInput

    xsample = SampleInput(x_input, args=x_args, kwargs=x_kwargs,
                          output_process_fn_grad=sample.output_process_fn_grad)
    out = op(xsample.input, *xsample.args, **xsample.kwargs)
    res = {"out": out}
    if "gouts" in cpu_res:
        import torch

        outs, ins = _grad_pieces(xsample, out)
        if len(outs) != len(cpu_res["gouts"]):
            raise AssertionError(f"{len(outs)} differentiable outputs on xla, {len(cpu_res['gouts'])} on CPU")
        gouts = [g.to("xla") for g in cpu_res["gouts"]]
        grads = torch.autograd.grad(outs, ins, gouts, allow_unused=True)
        res["grads"] = list(grads)
        res["out"] = _tree_map(_detach_leaf, out)
    return res


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
    if "grads" in cpu_res:
        got = [None if g is None else g.detach().cpu() for g in xla_res.get("grads", [])]
        want = cpu_res["grads"]
        for i, (g, w) in enumerate(zip(got, want)):
            if (g is None) != (w is None):
                raise AssertionError(f"grad {i}: got {'None' if g is None else 'a tensor'}, "
                                     f"expected {'None' if w is None else 'a tensor'}")
            if g is not None:
                try:
                    torch.testing.assert_close(g, w, equal_nan=True, **kw)
                except AssertionError as e:
                    raise AssertionError(f"grad {i}: {e}") from None


def run_entry(op, dtype, grad=False, sample_timeout=60.0, batch=True, chunk=48):
    """Run every sample of one OpInfo entry for ``dtype``; return a result dict."""
    import torch

    import spmdtorch

    t0 = time.perf_counter()
    c0 = spmdtorch.debug.counter_value("UncachedCompile")
    rec = {"name": entry_name(op), "dtype": str(dtype).replace("torch.", ""), "grad": bool(grad)}
    if dtype not in op.supported_dtypes("cpu"):
        rec.update(status="n/a", reason="dtype not supported by eager torch", samples=0)
        return rec
    do_grad = bool(grad and op.supports_autograd and dtype in op.supported_backward_dtypes("cpu"))
    rec["grad"] = do_grad
    shape_only = op.has_nondeterministic_output or op.name in RANDOM_OPS
    tol = tolerances(op, dtype)
    rec["tol"] = tol
    torch.manual_seed(0)
    try:
        with _alarm(sample_timeout * 4):
            samples = list(op.sample_inputs("cpu", dtype, requires_grad=do_grad))
    except Exception as e:  # noqa: BLE001
        rec.update(status="n/a", reason="sample_inputs raised: " + _first_line(e), samples=0)
        return rec

    n = len(samples)
    results: list = [None] * n  # per sample: "pass" | ("eager_error"|"fail", reason, detail)
    cpu_res: list = [None] * n
    snaps: list = [None] * n
    for i, s in enumerate(samples):
        try:
            with _alarm(sample_timeout):
                snaps[i] = _snapshot(s)
        except Exception as e:  # noqa: BLE001
            results[i] = ("fail", _first_line(e), _details(e))
            continue
        try:
            with _alarm(sample_timeout):
                cpu_res[i] = _run_cpu(op, s, do_grad, seed=i)
        except Exception as e:  # noqa: BLE001
            results[i] = ("eager_error", _first_line(e), _details(e))

    def one(idxs, sync_each):
        """Trace ``idxs`` (one sync at the end, or one per sample) and compare."""
        xres = {}
        for i in idxs:
            try:
                with _alarm(sample_timeout):
                    xres[i] = _run_xla(op, samples[i], cpu_res[i], snaps[i])
                    if sync_each:
                        spmdtorch.sync()
            except Exception as e:  # noqa: BLE001
                results[i] = ("fail", _first_line(e), _details(e))
                xres.pop(i, None)
        if not sync_each and xres:
            try:
                with _alarm(sample_timeout * max(1, len(xres)) / 2):
                    spmdtorch.sync()
            except Exception as e:  # noqa: BLE001
                for i in xres:
                    results[i] = ("fail", _first_line(e), _details(e))
                return
        for i, r in xres.items():
            try:
                with _alarm(sample_timeout):
                    _compare(cpu_res[i], r, tol, shape_only)
                results[i] = "pass"
            except Exception as e:  # noqa: BLE001
                results[i] = ("fail", _first_line(e), _details(e))
        xres.clear()

    todo = [i for i in range(n) if results[i] is None]
    if batch and len(todo) > 1:
        # One sync per chunk: a graph of hundreds of samples compiles slower
        # than several of ~50 (max_pool3d: 2 min for 576 samples at once).
        for c in range(0, len(todo), chunk):
            one(todo[c:c + chunk], sync_each=False)
        gc.collect()
        redo = [i for i in todo if results[i] != "pass"]
        for i in redo:  # failures are re-run alone so each is attributed to its own sample
            results[i] = None
            one([i], sync_each=True)
    else:
        for i in todo:
            one([i], sync_each=True)

    fails = [(i, r) for i, r in enumerate(results) if r != "pass" and r[0] == "fail"]
    eager = [(i, r) for i, r in enumerate(results) if r != "pass" and r[0] == "eager_error"]
    passed = sum(r == "pass" for r in results)
    rec.update(
        samples=n, passed=passed, failed=len(fails), eager_error=len(eager),
        failures=[{"sample": i, "reason": r[1], "detail": r[2]} for i, r in fails],
        eager_errors=[{"sample": i, "reason": r[1]} for i, r in eager],
        shape_only=bool(shape_only),
    )
    if fails:
        rec.update(status="fail", reason=fails[0][1][1])
    elif passed == 0:
        rec.update(status="n/a", reason="eager torch raised on every sample" if n else "no samples")
    else:
        rec.update(status="pass", reason="")
    rec["seconds"] = round(time.perf_counter() - t0, 3)
    rec["compiles"] = spmdtorch.debug.counter_value("UncachedCompile") - c0
    return rec


# -- classification --------------------------------------------------------------------


def category(rec) -> str:
    """Coarse group of a failure reason."""
    r = rec.get("reason", "")
    if rec["status"] != "fail":
        return rec["status"]
    if "no lowering" in r or "has no lowering" in r or ("NotImplementedError" in r and "aten." in r):
        return "missing lowering"
    if "sparse" in r and "strided" in r:
        return "unsupported layout (sparse)"
    if r.startswith("Timeout") or r.startswith("SampleTimeout") or r.startswith("WorkerCrash"):
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
            if (isinstance(info, DecorateInfo) and info.test_name == "test_compare_cpu"
                    and info.device_type is None
                    and any(getattr(d, "__name__", "") == "expectedFailure" for d in info.decorators)):
                out.append(entry_name(op))
                break
    return out


def write_report(records, out_md, meta):
    os.makedirs(os.path.dirname(out_md) or ".", exist_ok=True)
    out_json = os.path.splitext(out_md)[0] + ".json"
    with open(out_json, "w") as f:
        json.dump({"meta": meta, "entries": records}, f, indent=1, default=str)

    counts = collections.Counter(r["status"] for r in records)
    applicable = counts["pass"] + counts["fail"]
    samples = sum(r.get("samples", 0) for r in records)
    spass = sum(r.get("passed", 0) for r in records)
    sfail = sum(r.get("failed", 0) for r in records)
    seager = sum(r.get("eager_error", 0) for r in records)
    cats = collections.Counter(category(r) for r in records if r["status"] == "fail")
    lines = [
        "# OpInfo coverage",
        "",
        "Generated by `tools/opinfo_report.py` — every entry of PyTorch's OpInfo database",
        "(`torch.testing._internal.common_methods_invocations.op_db`) run through spmdtorch",
        "and compared with eager CPU torch (`torch.testing.assert_close`, the OpInfo's",
        "tolerance overrides where it declares any).",
        "",
        f"- torch {meta.get('torch')}, jax {meta.get('jax')}; dtype **{meta['dtype']}**, "
        f"{'forward + gradients' if meta['grad'] else 'forward only'}; "
        f"command: `{meta.get('command')}`",
        f"- entries run: {len(records)} of {meta.get('op_db_entries')} in op_db"
        + (f" (subset: {meta['subset']})" if meta.get("subset") else ""),
        f"- wall time: {meta.get('wall_s', 0):.0f} s with {meta.get('jobs')} worker(s), "
        f"XLA_FLAGS `{meta.get('xla_flags')}`",
        "",
        "## Totals",
        "",
        "| | entries |",
        "|---|---|",
        f"| pass | {counts['pass']} |",
        f"| fail | {counts['fail']} |",
        f"| n/a (dtype unsupported in eager / no runnable sample) | {counts['n/a']} |",
        f"| **pass rate** (pass / (pass + fail)) | **{100.0 * counts['pass'] / max(applicable, 1):.1f}%** |",
        "",
        f"Samples: {samples} total, {spass} pass, {sfail} fail, {seager} raise in eager torch too "
        f"(sample pass rate {100.0 * spass / max(spass + sfail, 1):.1f}%).",
        f"Entries whose values are random or uninitialised are checked on shape and dtype only: "
        f"{sum(1 for r in records if r.get('shape_only') and r['status'] == 'pass')} of the passes.",
        "",
        "## Failures by category",
        "",
        "| category | entries |",
        "|---|---|",
    ]
    for c, k in cats.most_common():
        lines.append(f"| {c} | {k} |")
    reasons = collections.Counter(_normalize_reason(r["reason"]) for r in records if r["status"] == "fail")
    lines += ["", "## Most common reasons", "", "| entries | reason |", "|---|---|"]
    for rsn, k in reasons.most_common(25):
        lines.append(f"| {k} | `{rsn.replace('|', '/')[:160]}` |")
    lines += [
        "",
        "## Failing entries",
        "",
        "Sorted by reason. `samples` is failing/total; the reason is the first failing sample's.",
        "\"OpInfo xfail\": OpInfo marks the entry expectedFailure in `TestCommon.test_compare_cpu`",
        "(eager CPU disagrees with other devices there by design).",
        "",
        "| entry | category | samples | reason |",
        "|---|---|---|---|",
    ]
    xfail = set(meta.get("compare_cpu_xfails", ()))
    fails = sorted((r for r in records if r["status"] == "fail"), key=lambda r: (category(r), r["reason"], r["name"]))
    for r in fails:
        mark = " (OpInfo xfail)" if r["name"] in xfail else ""
        lines.append(f"| `{r['name']}`{mark} | {category(r)} | {r.get('failed')}/{r.get('samples')} | "
                     f"`{r['reason'].replace('|', '/')[:200]}` |")
    na = sorted((r for r in records if r["status"] == "n/a"), key=lambda r: r["name"])
    if na:
        lines += ["", "## Not applicable", "", ", ".join(f"`{r['name']}` ({r['reason']})" for r in na)]
    with open(out_md, "w") as f:
        f.write("\n".join(lines) + "\n")
    return out_md, out_json


# -- worker processes ----------------------------------------------------------------


def _select(op_db, names, limit):
    entries = list(enumerate(op_db))
    if names:
        want = set(names)
        entries = [(i, op) for i, op in entries if op.name in want or entry_name(op) in want]
        missing = want - {op.name for _, op in entries} - {entry_name(op) for _, op in entries}
        if missing:
            raise SystemExit(f"unknown OpInfo entries: {sorted(missing)}")
    if limit:
        entries = entries[:limit]
    return entries


def worker_main(args):
    """Read op_db indices on stdin, write one JSON record per line on the protocol fd."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints from ops go to stderr
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    import spmdtorch  # noqa: F401
    from torch.testing._internal.common_methods_invocations import op_db

    dtype = getattr(torch, args.dtype)
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        idx = int(line)
        op = op_db[idx]
        try:
            rec = run_entry(op, dtype, grad=args.grad, sample_timeout=args.sample_timeout)
        except BaseException as e:  # noqa: BLE001
            rec = {"name": entry_name(op), "status": "fail", "reason": "HarnessError: " + _first_line(e),
                   "detail": traceback.format_exc()[-1500:]}
        rec["index"] = idx
        proto.write(json.dumps(rec, default=str) + "\n")


class _Worker:
    def __init__(self, argv, env):
        self.argv, self.env = argv, env
        self.proc = None
        self.lines: queue.Queue = queue.Queue()

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=self.env, text=True, bufsize=1)
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
        try:
            ln = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            return {"status": "fail", "reason": f"Timeout: entry ran longer than {timeout:.0f}s (worker killed)"}
        if ln is None:
            rc = self.proc.wait()
            self.proc = None
            return {"status": "fail", "reason": f"WorkerCrash: worker exited with code {rc}"}
        return json.loads(ln)

    def kill(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--grad", action="store_true", help="also compare gradients (ops with supports_autograd)")
    p.add_argument("--ops", default="", help="comma-separated OpInfo names (name or name.variant)")
    p.add_argument("--limit", type=int, default=0, help="only the first N selected entries")
    p.add_argument("--start", type=int, default=0, help="skip the first N selected entries")
    p.add_argument("--stride", type=int, default=1, help="every Nth selected entry (a sample of op_db)")
    p.add_argument("--out", default="docs/opinfo_coverage.md")
    p.add_argument("--jobs", type=int, default=2, help="worker processes (0: run in this process)")
    p.add_argument("--sample-timeout", type=float, default=60.0, help="seconds per sample (Python-level guard)")
    p.add_argument("--entry-timeout", type=float, default=300.0, help="hard limit per entry (worker killed)")
    p.add_argument("--opt-level", default="0", help="--xla_backend_optimization_level for the run ('' keeps XLA's)")
    p.add_argument("--update", action="store_true",
                   help="merge into the existing JSON next to --out (re-run entries replace old records)")
    p.add_argument("--failed-from", default="", help="run only the entries that failed in this JSON report")
    p.add_argument("--resume", action="store_true", help="reuse records of an interrupted run (.partial.jsonl)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    if args.opt_level != "" and "xla_backend_optimization_level" not in flags:
        flags = (flags + f" --xla_backend_optimization_level={args.opt_level}").strip()
    env["XLA_FLAGS"] = flags
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("PJRT_DEVICE", "CPU")
    if args.worker:
        return worker_main(args)
    if args.jobs == 0:
        os.environ.update({k: env[k] for k in ("XLA_FLAGS", "JAX_PLATFORMS", "PJRT_DEVICE")})

    import warnings

    warnings.filterwarnings("ignore")
    import jax
    import torch
    from torch.testing._internal.common_methods_invocations import op_db

    names = [s.strip() for s in args.ops.split(",") if s.strip()]
    if args.failed_from:
        with open(args.failed_from) as f:
            names += [r["name"] for r in json.load(f)["entries"] if r["status"] == "fail"]
    entries = _select(op_db, names, 0)[args.start::args.stride]
    if args.limit:
        entries = entries[: args.limit]
    dtype = getattr(torch, args.dtype)
    t0 = time.time()
    records = [None] * len(entries)
    done = [0]
    lock = threading.Lock()
    # Records are also appended here as they finish, so an interrupted run
    # keeps what it did (``--resume`` picks it up).
    partial = os.path.splitext(args.out)[0] + ".partial.jsonl"
    os.makedirs(os.path.dirname(partial) or ".", exist_ok=True)
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
            print(f"[{done[0]}/{len(entries)} {time.time() - t0:6.0f}s] {rec['name']:45s} {rec['status']:4s} "
                  f"{rec.get('passed', 0)}/{rec.get('samples', 0)} {rec.get('seconds', '')}s "
                  f"{rec.get('reason', '')[:90]}", flush=True)

    if args.jobs == 0:
        import spmdtorch  # noqa: F401

        for k, (idx, op) in enumerate(entries):
            rec = run_entry(op, dtype, grad=args.grad, sample_timeout=args.sample_timeout)
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
        wargv = [sys.executable, os.path.abspath(__file__), "--worker", "--dtype", args.dtype,
                 "--sample-timeout", str(args.sample_timeout)] + (["--grad"] if args.grad else [])

        def loop():
            w = _Worker(wargv, env)
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
                rec["index"] = idx
                records[k] = rec
                progress(k, rec)
            w.kill()

        threads = [threading.Thread(target=loop) for _ in range(max(1, args.jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    meta = {
        "dtype": args.dtype, "grad": args.grad, "torch": torch.__version__, "jax": jax.__version__,
        "op_db_entries": len(op_db), "jobs": args.jobs, "xla_flags": env["XLA_FLAGS"],
        "wall_s": time.time() - t0, "command": "python tools/opinfo_report.py " + " ".join(argv or sys.argv[1:]),
        "subset": ", ".join(x for x in [f"--ops {args.ops}" if args.ops else "",
                                         f"--start {args.start}" if args.start else "",
                                         f"--stride {args.stride}" if args.stride > 1 else "",
                                         f"--limit {args.limit}" if args.limit else ""] if x),
    }
    partial_f.close()
    records = [r for r in records if r is not None]
    out_json = os.path.splitext(args.out)[0] + ".json"
    if args.update and os.path.exists(out_json):
        with open(out_json) as f:
            old = json.load(f)
        new_names = {r["name"] for r in records}
        records = [r for r in old["entries"] if r["name"] not in new_names] + records
        records.sort(key=lambda r: r.get("index", 0))
        meta = dict(old["meta"], updated_by=meta["command"], update_wall_s=meta["wall_s"])
    meta["compare_cpu_xfails"] = compare_cpu_xfails(op_db)
    md, js = write_report(records, args.out, meta)
    counts = collections.Counter(r["status"] for r in records)
    print(f"wrote {md} and {js}: {dict(counts)} in {meta['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
