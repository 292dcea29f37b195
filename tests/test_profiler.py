"""spmdtorch.debug.profiler: traces with spmdtorch's step and program names, PyTorch/XLA's names."""

from __future__ import annotations

import gzip
import json
import threading

import pytest
import torch

import spmdtorch
from spmdtorch.debug import profiler as xp
from spmdtorch.lazy import _profiling


def _events(files) -> list[str]:
    """Names of every event in the Chrome-format traces among ``files``."""
    names = []
    for f in files:
        if f.name.endswith(".trace.json.gz"):
            with gzip.open(f, "rt") as fh:
                names += [e.get("name", "") for e in json.load(fh)["traceEvents"]]
    return names


def _train(w, steps):
    for _ in range(steps):
        with spmdtorch.step():
            w.mul_(2).add_(1)


def test_profile_writes_a_trace_with_spmdtorch_names(devices8, tmp_path):
    w = torch.ones(8, device="xla")
    _train(w, 1)  # compiled before the trace: cached programs still get their names
    with xp.profile(tmp_path / "p1"):
        assert xp.is_tracing() and _profiling.STATE.active
        _train(w, 3)
        y = (w * 3).sum()  # a new program: compiled while tracing
        spmdtorch.sync()
    assert not xp.is_tracing() and not _profiling.STATE.active
    files = xp.trace_files(tmp_path / "p1")
    suffixes = {f.name.split(".", 1)[1] for f in files}
    assert {"xplane.pb", "trace.json.gz"} <= suffixes, files
    names = _events(files)
    assert sum(n == "spmdtorch.step" for n in names) == 3, sorted(set(names))
    assert "spmdtorch.sync" in names
    assert "spmdtorch.compile" in names
    programs = {n for n in names if n.startswith("spmdtorch.program_")}
    assert len(programs) >= 2, sorted(set(names))  # the step's program and y's
    assert any("jit_spmdtorch_program" in n for n in names), sorted(set(names))
    xplane = next(f for f in files if f.name.endswith(".xplane.pb")).read_bytes()
    assert b"spmdtorch.step" in xplane and b"spmdtorch.program_" in xplane
    # The trace observed the computation without changing it.
    expected = torch.ones(8)
    for _ in range(4):
        expected = expected * 2 + 1
    torch.testing.assert_close(w.cpu(), expected)
    assert y.item() == float(expected.sum() * 3)


def test_annotations_and_compiled_functions(devices8, tmp_path):
    w = torch.ones(4, device="xla")

    @spmdtorch.compile
    def train_step(w):
        w.mul_(2)

    with xp.profile(tmp_path, create_perfetto_trace=True):
        for step in range(2):
            with xp.StepTrace("train_step", step_num=step):
                with xp.Trace("forward"):
                    w.add_(1)
        train_step(w)

        @xp.trace_me("decorated")
        def f():
            return 1

        assert f() == 1
    files = xp.trace_files(tmp_path)
    assert any(f.name == "perfetto_trace.json.gz" for f in files)
    names = _events(files)
    assert names.count("train_step") == 2 and "forward" in names and "decorated" in names
    assert any(n.startswith("spmdtorch.compiled:") and "train_step" in n for n in names), sorted(set(names))
    # StepTrace syncs at exit (PyTorch/XLA), so the values are computed.
    torch.testing.assert_close(w.cpu(), (torch.ones(4) + 1 + 1) * 2)


def test_no_annotations_without_a_trace(devices8):
    assert not _profiling.STATE.active
    assert type(_profiling.annotate("x")).__name__ == "nullcontext"


def test_errors(devices8, tmp_path):
    with pytest.raises(xp.ProfilerError, match=r"no trace is being captured; call start_trace"):
        xp.stop_trace()
    with pytest.raises(ValueError, match="log_dir must be a non-empty directory path"):
        xp.start_trace("")
    xp.start_trace(tmp_path / "a")
    try:
        with pytest.raises(xp.ProfilerError, match=r"already being captured into .*a'; call stop_trace\(\)"):
            xp.start_trace(tmp_path / "b")
    finally:
        xp.stop_trace()
    with pytest.raises(ValueError, match="port must be an int in 1..65535, got 0"):
        xp.start_server(0)
    with pytest.raises(xp.ProfilerError, match="no profiler server runs"):
        xp.stop_server()
    with pytest.raises(xp.ProfilerError, match=r"cannot capture a trace from '10.9.9.9:9012'.*xprof"):
        xp.trace("10.9.9.9:9012", tmp_path / "c")
    with pytest.raises(ValueError, match="duration_ms must be an int > 0"):
        xp.trace("localhost:1", tmp_path / "c", duration_ms=0)


@pytest.mark.slow  # 9 s of capture; the in-process trace tests above run by default
def test_server_and_detached_capture_of_this_process(devices8, tmp_path):
    from spmdtorch.launch import free_port

    port = free_port()
    server = xp.start_server(port)
    try:
        assert server is not None and _profiling.STATE.active  # annotate: a capture may come any time
        with pytest.raises(xp.ProfilerError, match=f"already runs on port {port}"):
            xp.start_server(port)
        thread = xp.trace_detached(f"localhost:{port}", tmp_path, duration_ms=1500)
        assert isinstance(thread, threading.Thread)
        w = torch.ones(4, device="xla")
        deadline_steps = 0
        while thread.is_alive() and deadline_steps < 2000:
            _train(w, 1)
            deadline_steps += 1
        thread.join(timeout=60)
        assert not thread.is_alive()
    finally:
        xp.stop_server()
    assert not _profiling.STATE.active
    names = _events(xp.trace_files(tmp_path))
    assert "spmdtorch.step" in names, sorted(set(names))
