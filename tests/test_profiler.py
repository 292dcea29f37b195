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


# -- device_activity: busy and idle time read off a trace ---------------------------------


def _plane(name, lines):
    """A stand-in for a ``jax.profiler.ProfileData`` plane: ``{line name: [(event name, start, end)]}``."""
    from types import SimpleNamespace as NS

    return NS(
        name=name,
        lines=[NS(name=ln, events=[NS(name=n, start_ns=s, end_ns=e) for n, s, e in evs]) for ln, evs in lines.items()],
    )


def test_summarize_merges_overlaps_and_counts_gaps():
    from spmdtorch.debug._activity import summarize

    a = summarize("d", [(50, 60), (0, 10), (5, 20), (20, 30), (40, 45)])  # unordered; 20 touches 20: no gap
    assert (a.start_ns, a.end_ns, a.busy_ns) == (0, 60, 30 + 5 + 10)
    assert (a.gaps, a.longest_gap_ns, a.idle_ns, a.window_ns) == (2, 10, 15, 60)
    assert a.idle_fraction == pytest.approx(15 / 60)
    nested = summarize("d", [(0, 100), (10, 20), (30, 40)])  # kernels inside a longer one count once
    assert (nested.busy_ns, nested.gaps, nested.idle_ns) == (100, 0, 0)
    assert summarize("d", []) is None
    point = summarize("d", [(7, 7)])
    assert (point.window_ns, point.idle_fraction) == (0, 0.0)


def test_activity_reads_the_device_planes_and_ignores_derived_lines():
    from types import SimpleNamespace as NS

    gpu = _plane(
        "/device:GPU:0",
        {
            "Stream #13(Kernel,MemcpyH2D)": [("fusion_1", 0, 40), ("memcpy", 100, 110)],
            "Stream #14(Kernel)": [("gemm", 30, 60)],
            "XLA Modules": [("jit_spmdtorch_program", 0, 110)],  # derived: spans the gaps, not work
            "CUPTI overhead": [("overhead", 60, 100)],
        },
    )
    tpu = _plane("/device:TPU:0", {"XLA Ops": [("fusion", 0, 5), ("dot", 15, 20)], "Steps": [("0", 0, 20)]})
    host = _plane("/host:CPU", {"tf_XLAPjRtCpuClient/1": [("ynn_fusion", 0, 1000)]})
    acts = xp.device_activity(NS(planes=[host, gpu, tpu]))
    assert [a.device for a in acts] == ["/device:GPU:0", "/device:TPU:0"]  # the host's threads are not a device here
    g, t = acts
    assert (g.busy_ns, g.idle_ns, g.gaps, g.longest_gap_ns) == (70, 40, 1, 40)
    assert (t.busy_ns, t.idle_ns, t.gaps) == (10, 10, 1)


def test_activity_of_cpu_devices_is_the_cpu_clients_threads():
    from types import SimpleNamespace as NS

    host = _plane(
        "/host:CPU",
        {
            "python": [("PjitFunction(step)", 0, 500)],  # the host's own work is not the devices'
            "tf_XLAPjRtCpuClient/77": [("ThreadpoolListener::StartRegion", 0, 0), ("all-gather", 100, 150)],
            "tf_XLAEigen/5": [("ynn_fusion", 140, 200), ("ThreadpoolListener::Record", 250, 260)],
            "tf_XLAPjRtCpuClient/78": [("wrapped_copy", 300, 320)],
        },
    )
    [a] = xp.device_activity(NS(planes=[_plane("/host:metadata", {}), host]))
    assert (a.device, a.start_ns, a.end_ns, a.busy_ns, a.gaps, a.longest_gap_ns) == ("cpu", 100, 320, 120, 1, 100)
    assert xp.device_activity(NS(planes=[_plane("/host:CPU", {"python": [("x", 0, 9)]})])) == []
    # Beside an accelerator that did nothing, the CPU client's threads ran host work: not a device.
    idle_gpu = _plane("/device:GPU:0", {"Stream #7(Kernel)": []})
    assert xp.device_activity(NS(planes=[idle_gpu, host])) == []


def test_device_activity_of_a_captured_cpu_trace_sees_the_host_waits(devices8, tmp_path):
    """Steps with a host pause between them: the CPU devices sit idle at least that long, each time."""
    import time

    w = torch.ones(512, 512, device="xla")

    def step():
        nonlocal w
        with spmdtorch.step():
            w = torch.tanh(w @ w)

    step()
    spmdtorch.wait_device_ops()  # compiled before the trace
    pause = 0.15
    with xp.profile(tmp_path):
        for _ in range(3):
            step()
            spmdtorch.wait_device_ops()
            time.sleep(pause)  # the host keeps the devices waiting
        step()
        spmdtorch.wait_device_ops()
    [a] = xp.device_activity(tmp_path)
    [xspace] = [f for f in xp.trace_files(tmp_path) if f.name.endswith(".xplane.pb")]
    assert xp.device_activity(xspace) == [a]  # the file itself reads the same
    assert a.device == "cpu" and a.busy_ns > 0
    assert a.idle_ns >= 3 * pause * 1e9 and a.longest_gap_ns >= pause * 1e9, a
    assert a.idle_ns < a.window_ns and a.gaps >= 3


def test_device_activity_errors(tmp_path):
    with pytest.raises(xp.ProfilerArgumentError, match=r"device_activity: trace must be a directory holding"):
        xp.device_activity(tmp_path)  # nothing captured there
    with pytest.raises(xp.ProfilerArgumentError, match="spmdtorch.debug.profile"):
        xp.device_activity(tmp_path / "missing")
    with pytest.raises(xp.ProfilerArgumentTypeError, match="device_activity: trace must be"):
        xp.device_activity(3)
    bogus = tmp_path / "host.xplane.pb"
    bogus.write_bytes(b"not a trace")
    with pytest.raises(xp.ProfilerArgumentError, match="does not parse as one"):
        xp.device_activity(tmp_path)
