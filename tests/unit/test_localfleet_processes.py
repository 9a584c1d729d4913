"""The one free-port helper and the one way tests and the local fleet stop child processes."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from pdfleet.localfleet.processes import free_port, free_ports, stop_process, stop_processes

IGNORE_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
)


def _python(code: str, **popen_kw: object) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, **popen_kw)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie no longer does: orphans are reaped by whatever init this machine has)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", free_port()))


def test_a_process_that_stops_on_sigterm_is_reaped_within_the_grace_period() -> None:
    child = subprocess.Popen(["sleep", "60"])
    started = time.monotonic()
    stop_process(child, grace_s=10)
    assert child.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 5


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period() -> None:
    child = _python(IGNORE_SIGTERM)
    started = time.monotonic()
    stop_process(child, grace_s=0.3)
    assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 0.3
    assert child.stdout is not None
    child.stdout.close()


def test_stopping_an_exited_process_is_a_no_op() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    stop_process(child, grace_s=1)
    assert child.returncode == 0


def test_group_stop_reaches_grandchildren_and_many_share_one_grace_period() -> None:
    spawn_grandchild = (
        "import subprocess, sys, time; g = subprocess.Popen(['sleep', '60']); print(g.pid); "
        "print('ready', flush=True); time.sleep(60)"
    )
    parents, grandchildren = [], []
    for _ in range(2):
        parent = subprocess.Popen(
            [sys.executable, "-c", spawn_grandchild], stdout=subprocess.PIPE, text=True, start_new_session=True
        )
        assert parent.stdout is not None
        grandchildren.append(int(parent.stdout.readline()))
        assert parent.stdout.readline().strip() == "ready"
        parents.append(parent)
    stubborn = _python(IGNORE_SIGTERM, start_new_session=True)
    started = time.monotonic()
    stop_processes([*parents, stubborn], grace_s=0.5, group=True)
    assert time.monotonic() - started < 3  # one grace period for all, not one each
    assert [p.returncode for p in parents] == [-signal.SIGTERM, -signal.SIGTERM]
    assert stubborn.returncode == -signal.SIGKILL
    for child in [*parents, stubborn]:
        assert child.stdout is not None
        child.stdout.close()
    deadline = time.monotonic() + 5
    while any(_running(pid) for pid in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_running(pid) for pid in grandchildren)
