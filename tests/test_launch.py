"""The local launcher (spmdtorch.launch) with small plain-Python child processes.

The jobs that really join through JAX are in tests/multiprocess; here the
children are tiny ``python -c`` programs, so these tests take ~0.1-2 s each.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import textwrap
import time

import pytest

from spmdtorch.launch import LaunchError, child_env, free_port, launch, local
from spmdtorch.launch import __main__ as cli


def run(code: str, nprocs: int = 2, **kwargs):
    out = io.StringIO()
    result = launch(["-c", textwrap.dedent(code)], nprocs=nprocs, out=out, **kwargs)
    return result, out.getvalue().splitlines()


def waiter(marker) -> str:
    """Child code (imports included) defining ``wait_for_marker()``: returns once ``marker`` exists, at most 30 s.

    A rank that must fail only after another rank reached a point waits for
    that rank's marker file: a fixed sleep races a slow start under load.
    """
    return (
        "import os, time\n"
        "def wait_for_marker():\n"
        "    deadline = time.monotonic() + 30\n"
        f"    while not os.path.exists({str(marker)!r}) and time.monotonic() < deadline:\n"
        "        time.sleep(0.01)\n"
    )


def test_every_rank_runs_with_its_environment_and_prefixed_output():
    result, lines = run(
        """
        import os
        keys = ["SPMDTORCH_PROCESS_ID", "SPMDTORCH_NUM_PROCESSES", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "JAX_PLATFORMS", "PJRT_DEVICE", "XLA_FLAGS"]
        print(*(os.environ[k] for k in keys))
        print("coordinator", os.environ["SPMDTORCH_COORDINATOR_ADDRESS"], "master", os.environ["MASTER_ADDR"],
              os.environ["MASTER_PORT"])
        """,
        nprocs=3,
        devices_per_proc=4,
    )
    assert result.returncode == 0 and result.first_failure is None and not result.timed_out
    assert [r.returncode for r in result.ranks] == [0, 0, 0]
    for rank in range(3):
        mine = [line for line in lines if line.startswith(f"[rank {rank}] ")]
        assert len(mine) == 2, lines
        prefix = f"[rank {rank}] {rank} 3 {rank} 3 {rank} cpu CPU "
        assert mine[0].startswith(prefix), mine[0]
        # The device count replaces the test run's own; its other XLA flags pass through.
        flags = mine[0][len(prefix) :].split()
        assert [f for f in flags if "device_count" in f] == ["--xla_force_host_platform_device_count=4"]
        assert os.environ["XLA_FLAGS"].replace("--xla_force_host_platform_device_count=8", "").split() == [
            f for f in flags if "device_count" not in f
        ]
    coords = {line.split()[3] for line in lines if "coordinator" in line}
    assert len(coords) == 1  # one coordinator for the job ...
    (coord,) = coords
    host, port = coord.rsplit(":", 1)
    master_port = {line.split()[-1] for line in lines if "coordinator" in line}
    assert host == "127.0.0.1" and master_port != {port}  # ... on another port than torch.distributed's


def test_a_stderr_write_never_splits_an_output_line():
    # An unbuffered print() writes its text and its newline separately; a C++
    # library writing to stderr in between (gloo's "[Gloo] Rank 1 is
    # connected ...") split the line when both streams shared one pipe.
    result, lines = run(
        """
        import os, sys
        sys.stdout.write("RESULT {")
        sys.stdout.flush()
        os.write(2, b"noise from C++\\n")
        sys.stdout.write("}\\n")
        sys.stdout.flush()
        """,
        nprocs=1,
    )
    assert result.returncode == 0, lines
    assert sorted(lines) == ["[rank 0] RESULT {}", "[rank 0] noise from C++"], lines


def test_failure_stops_the_others_with_sigkill_after_the_grace_period(tmp_path):
    # Rank 0 ignores SIGTERM (as JAX does in a multi-process job) and would
    # sleep for a minute; rank 1 fails, once rank 0's marker file says that
    # it ignores SIGTERM (a fixed sleep raced a slow start under load).
    marker = str(tmp_path / "ignoring_sigterm")
    start = time.monotonic()
    result, lines = run(
        waiter(marker)
        + textwrap.dedent(f"""
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
            wait_for_marker()
            sys.exit(3)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({marker!r}, "w").close()
        print("ready", flush=True)
        time.sleep(60)
        """),
        grace_period_s=1.0,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 3 and result.first_failure == 1
    r0, r1 = result.ranks
    assert (r1.returncode, r1.stopped_by_launcher) == (3, False)
    assert (r0.returncode, r0.stopped_by_launcher) == (-signal.SIGKILL, True)
    assert 1.0 <= r0.elapsed_s - r1.elapsed_s < 5.0
    assert elapsed < 20
    assert "[launch] rank 1 failed with exit status 3; stopping the other processes" in lines
    # The summary at the end: the first failure named, then every rank with what its status means.
    assert any(line.startswith("[launch] first failure: rank 1 (failed (exit status 3))") for line in lines), lines
    assert any(
        line.startswith("[launch]   rank 0: exit status -9, killed by SIGKILL, stopped by the launcher")
        for line in lines
    ), lines
    assert any(line.startswith("[launch]   rank 1: exit status 3, failed (exit status 3), after") for line in lines), (
        lines
    )


def test_a_rank_killed_from_outside_is_the_cause_even_when_its_peer_is_seen_ending_first(tmp_path):
    # Rank 0 dies of a SIGKILL the launcher never sends (the OOM killer's, a
    # test's) just after its peer reported losing it: the launcher sees the
    # peer end first and sends rank 0 SIGTERM, which rank 0 answers by dying
    # of SIGKILL (standing in for the outside kill that raced it). Rank 0 is
    # the cause, not "stopped by the launcher" (a race a CI run hit).
    from spmdtorch.runtime import PEER_LOST_EXIT_STATUS

    marker = str(tmp_path / "rank0_ready")
    result, lines = run(
        waiter(marker)
        + textwrap.dedent(f"""
        import os, signal, sys, time
        if os.environ["RANK"] == "1":
            wait_for_marker()
            sys.exit({PEER_LOST_EXIT_STATUS})
        signal.signal(signal.SIGTERM, lambda *_: os.kill(os.getpid(), signal.SIGKILL))
        open({marker!r}, "w").close()
        time.sleep(60)
        """),
        grace_period_s=10.0,
    )
    r0, r1 = result.ranks
    assert r1.returncode == PEER_LOST_EXIT_STATUS and r0.returncode == -signal.SIGKILL
    assert not r0.stopped_by_launcher and r0.elapsed_s - r1.elapsed_s < 5  # within the grace period: no escalation
    assert result.first_failure == 0 and result.returncode == 128 + signal.SIGKILL, lines
    assert any(line.startswith("[launch] first failure: rank 0 (killed by SIGKILL)") for line in lines), lines


def test_a_hung_rank_is_named_not_the_peer_that_finished_and_died_waiting_for_it():
    # Stand-in for JAX: rank 0 finishes its script (the peer watch notes it in
    # SPMDTORCH_LAUNCH_FINISHED_DIR, done here by hand) and then aborts, as JAX's
    # shutdown barrier does after waiting for a hung rank; rank 1 hangs. The
    # launcher used to name rank 0 (the first to fail) as the cause.
    result, lines = run(
        """
        import os, time
        if os.environ["RANK"] == "0":
            open(os.path.join(os.environ["SPMDTORCH_LAUNCH_FINISHED_DIR"], "0"), "w").close()
            os.abort()
        time.sleep(60)
        """,
        grace_period_s=1.0,
    )
    r0, r1 = result.ranks
    assert r0.returncode == -signal.SIGABRT and r0.finished_script and not r1.finished_script
    assert result.first_failure == 1, lines
    assert any("rank 1 never finished its script (hung or still running)" in line for line in lines), lines
    assert "after its script had finished (waiting for the others)" in r0.meaning
    assert any(line.startswith("[launch] first failure: rank 1 ") for line in lines), lines


def test_a_rank_that_fails_before_finishing_stays_the_cause():
    # Without the note, nothing changes: the first rank to fail is named.
    result, lines = run(
        """
        import os, sys, time
        if os.environ["RANK"] == "0":
            sys.exit(4)
        time.sleep(60)
        """,
        grace_period_s=1.0,
    )
    assert result.first_failure == 0 and result.returncode == 4 and not result.ranks[0].finished_script, lines


def test_a_rank_killed_by_a_signal_gives_a_shell_style_status():
    result, lines = run(
        """
        import os, signal, time
        if os.environ["RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)
        """,
        grace_period_s=0.5,
    )
    assert result.returncode == 128 + signal.SIGKILL and result.first_failure == 0
    assert any("killed by SIGKILL" in line for line in lines)
    assert result.ranks[1].stopped_by_launcher  # SIGTERM ended it within the grace period
    assert result.ranks[1].returncode == -signal.SIGTERM


def test_timeout_stops_every_process():
    result, lines = run("import time; time.sleep(60)", timeout_s=1.0, grace_period_s=0.5)
    assert result.timed_out and result.returncode == 124 and result.first_failure is None
    assert all(r.stopped_by_launcher and r.returncode != 0 for r in result.ranks)
    assert "[launch] timed out after 1 s; stopping every process" in lines


def test_interrupt_stops_every_process_and_propagates(monkeypatch, tmp_path):
    pids_file = tmp_path / "pids"

    def started() -> list[int]:
        return [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []

    class InterruptingClock:
        """time as the launcher sees it, with Ctrl-C arriving once both children run."""

        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(s):
            time.sleep(s)
            if len(started()) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(local, "time", InterruptingClock)
    code = f"import os, time; open({str(pids_file)!r}, 'a').write(f'{{os.getpid()}} '); time.sleep(60)"
    with pytest.raises(KeyboardInterrupt):
        launch(["-c", code], nprocs=2, out=io.StringIO(), grace_period_s=0.5)
    for pid in started():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # stopped and reaped


def test_cli_runs_a_script_and_returns_its_status(tmp_path, capfd):
    # Rank 1 fails, which makes the launcher stop rank 0: so rank 1 waits until
    # rank 0 has printed (it leaves a marker file) to keep the test free of a race.
    script = tmp_path / "job.py"
    marker = tmp_path / "rank0_printed"
    script.write_text(
        waiter(marker) + "import sys\n"
        "rank = int(os.environ['RANK'])\n"
        "print('args', sys.argv[1:], flush=True)\n"
        f"if rank == 0:\n    open({str(marker)!r}, 'w').close()\n"
        "else:\n    wait_for_marker()\n"
        "sys.exit(rank * 5)\n"
    )
    assert cli.main(["--nprocs", "2", "--grace-period", "0.5", str(script), "--flag", "x"]) == 5
    out = capfd.readouterr().out
    assert "[rank 0] args ['--flag', 'x']" in out and "[rank 1] args ['--flag', 'x']" in out


def test_cli_runs_a_module(capfd):
    assert cli.main(["--nprocs", "1", "-m", "json.tool", "--help"]) == 0
    assert "[rank 0] usage:" in capfd.readouterr().out


def test_cli_rejects_bad_counts(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--nprocs", "0", "x.py"])
    assert "--nprocs and --devices-per-proc must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"nprocs": 0}, "nprocs must be an int >= 1, got 0"),
        ({"nprocs": 2, "devices_per_proc": 0}, "devices_per_proc must be an int >= 1"),
        ({"nprocs": 2, "grace_period_s": -1}, "grace_period_s must be >= 0"),
        ({"nprocs": 2, "timeout_s": 0}, "timeout_s must be > 0"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(LaunchError, match=match):
        launch(["x.py"], **kwargs)


def test_bad_command():
    with pytest.raises(LaunchError, match="non-empty list"):
        launch("train.py", nprocs=1)
    with pytest.raises(LaunchError, match="non-empty list"):
        launch([], nprocs=1)


def test_child_env_replaces_the_device_count_and_keeps_other_flags():
    base = {"XLA_FLAGS": "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=8", "NPROC": "4", "KEEP": "1"}
    base["SPMDTORCH_CPU_DEVICES"] = "8"  # the caller's own: import spmdtorch would apply it over XLA_FLAGS
    env = child_env(1, 2, 12, "10.0.0.1:5000", 5001, heartbeat_timeout_s=7, base=base)
    assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/d --xla_force_host_platform_device_count=12"
    assert env["SPMDTORCH_CPU_DEVICES"] == "12"
    assert env["NPROC"] == "24"  # at least 2 x devices (docs/design.md, hazard "CPU collective deadlock")
    assert env["KEEP"] == "1" and env["SPMDTORCH_HEARTBEAT_TIMEOUT"] == "7"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["SPMDTORCH_COORDINATOR_ADDRESS"]) == (
        "10.0.0.1",
        "5001",
        "10.0.0.1:5000",
    )
    assert base["XLA_FLAGS"].endswith("=8")  # the caller's mapping is not modified


def test_free_port_is_bindable():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_python_is_configurable():
    result, lines = run("import sys; print(sys.executable)", nprocs=1, python=sys.executable)
    assert result.returncode == 0 and lines == [f"[rank 0] {sys.executable}"]


@pytest.mark.parametrize("name", ["spmdtorch.launch", "spmdtorch.launch.local"])
def test_doctests(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0


def test_exit_statuses_are_described_in_words():
    from spmdtorch.launch import LaunchError, describe_exit
    from spmdtorch.runtime import PEER_LOST_EXIT_STATUS

    assert describe_exit(0) == "ok"
    assert describe_exit(PEER_LOST_EXIT_STATUS) == "peer lost (PeerLostError)"
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGABRT) == "aborted (SIGABRT)"
    assert describe_exit(-200) == "killed by signal 200"
    assert describe_exit(2) == "failed (exit status 2)"
    with pytest.raises(LaunchError, match="returncode"):
        describe_exit("1")  # type: ignore[arg-type]
