"""Whatever a bench, test or demo starts is gone when it stops: whole process groups, grandchildren that outlive
their leader included, also when the bench itself gets SIGTERM."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pdfleet.localfleet.processes import running_process_groups, stop_process

REPO = Path(__file__).resolve().parents[2]

# A peer that forks a worker which ignores SIGTERM, prints the worker's pid, and exits on SIGTERM itself (as a
# launcher whose server keeps shutting down gracefully does).
FAKE_PEER = textwrap.dedent(
    """
    import subprocess, sys, time
    worker = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "up"
    print(worker.pid, flush=True)
    time.sleep(60)
    """
)


def _router_bench():
    spec = importlib.util.spec_from_file_location("router_bench", REPO / "bench" / "router_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _wait_for_line(path: Path, timeout_s: float = 10.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = path.read_text().split("\n") if path.exists() else []
        if len(lines) > 1:
            return lines[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing written to {path} in {timeout_s} s")


def _start_peer_group() -> subprocess.Popen:
    leader = subprocess.Popen(
        [sys.executable, "-c", FAKE_PEER], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert leader.stdout is not None
    int(leader.stdout.readline())  # the worker is up
    return leader


def test_a_grandchild_that_outlives_its_leaders_sigterm_is_killed_at_the_end_of_the_grace_period() -> None:
    leader = _start_peer_group()
    started = time.monotonic()
    stop_process(leader, grace_s=0.5, group=True)
    assert leader.returncode == -signal.SIGTERM
    assert leader.pid not in running_process_groups()
    assert 0.5 <= time.monotonic() - started < 5
    assert leader.stdout is not None
    leader.stdout.close()


def test_a_group_whose_leader_already_exited_is_still_stopped() -> None:
    leader = _start_peer_group()
    leader.kill()  # only the leader: its worker keeps running in the group
    leader.wait()
    assert leader.pid in running_process_groups()
    stop_process(leader, grace_s=0.5, group=True)
    assert leader.pid not in running_process_groups()
    assert leader.stdout is not None
    leader.stdout.close()


def test_the_router_bench_reaps_every_process_of_a_peer_it_started(tmp_path: Path) -> None:
    bench = _router_bench()
    peer = bench.start("fake-peer", [sys.executable, "-c", FAKE_PEER], tmp_path)
    _wait_for_line(peer.log)  # the worker is up
    assert peer.popen.pid in running_process_groups()
    peer.stop(grace_s=0.5)
    assert peer.popen.pid not in running_process_groups()
    assert bench.reap_all(grace_s=0.5) == []


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_bench_stopped_by_a_signal_leaves_no_peer_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """The bench's own shape: start peers under `termination_as_interrupt`, `reap_all` on the way out."""
    script = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        sys.path.insert(0, {str(REPO / "bench")!r})
        import router_bench as bench
        try:
            with bench.termination_as_interrupt():
                peer = bench.start("fake-peer", [sys.executable, "-c", {FAKE_PEER!r}], Path({str(tmp_path)!r}))
                print(peer.popen.pid, flush=True)
                time.sleep(60)
        except KeyboardInterrupt:
            pass
        finally:
            sys.exit(3 if bench.reap_all(grace_s=0.5) else 0)
        """
    )
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert run.stdout is not None
    pgid = int(run.stdout.readline())
    _wait_for_line(tmp_path / "fake-peer.log")
    run.send_signal(sig)
    assert run.wait(timeout=20) == 0
    run.stdout.close()
    assert pgid not in running_process_groups()
