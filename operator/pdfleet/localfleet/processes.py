"""Free ports and stopping child processes -- shared by the local fleet, the test launchers, the tests and the benches.

    port = free_port()
    stop_process(popen, grace_s=10)               # SIGTERM, 10 s grace, then SIGKILL; reaped either way
    stop_processes(popens, grace_s=10, group=True)  # many at once: one grace period for all, whole process groups

`group=True` signals the child's process group (`os.killpg`), so grandchildren stop too; only for children started
with `start_new_session=True` (they lead their own group). Otherwise only the child itself gets the signals. A group is
stopped when none of its processes runs, not when its leader exits: a grandchild that outlives the leader's SIGTERM
gets SIGKILL at the end of the grace period like the leader would.

    with termination_as_interrupt():              # SIGTERM/SIGHUP raise KeyboardInterrupt: `finally` clean-up runs
        ...
        with interrupts_deferred():               # a second Ctrl-C or SIGTERM cannot cut the clean-up short
            stop_processes(...)
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from types import FrameType

LOOPBACK = "127.0.0.1"


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct TCP ports on `host` that were free a moment ago (OS-chosen, so parallel runs rarely collide)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port(host: str = LOOPBACK) -> int:
    """One TCP port on `host` that was free a moment ago (see `free_ports`)."""
    return free_ports(1, host)[0]


def running_process_groups() -> set[int]:
    """Ids of the process groups with a running process (zombies waiting for their reaper do not run), from /proc."""
    groups = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    state, _ppid, pgrp = stat.read().rsplit(")", 1)[1].split()[:3]
            except OSError:  # exited while we looked
                continue
            if state != "Z":
                groups.add(int(pgrp))
    return groups


def signal_process(popen: subprocess.Popen, sig: signal.Signals, *, group: bool = False) -> None:
    """Send `sig` to the child, or to its whole process group (even after the leader exited); nothing if none runs."""
    if not group and popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(popen.pid, sig)
        else:
            popen.send_signal(sig)


def stop_processes(
    popens: Sequence[subprocess.Popen], grace_s: float, *, group: bool = False, reap_s: float = 5.0
) -> None:
    """SIGTERM every process (or group) at once, give them `grace_s` s in all, then SIGKILL what is left and reap it.

    Waits up to `reap_s` s per process after its SIGKILL (TimeoutExpired if one still has not gone); with `group`,
    also until no process of any of the groups runs (TimeoutError if one still does).
    """
    for popen in popens:
        signal_process(popen, signal.SIGTERM, group=group)
    deadline = time.monotonic() + grace_s
    for popen in popens:
        try:
            popen.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            signal_process(popen, signal.SIGKILL, group=group)
            popen.wait(timeout=reap_s)
    if group:
        _stop_group_leftovers([popen.pid for popen in popens], deadline, reap_s)


def _stop_group_leftovers(pgids: Sequence[int], deadline: float, reap_s: float) -> None:
    """Wait for the groups' other processes until `deadline`, then SIGKILL the groups and wait `reap_s` s more."""
    killed = False
    while left := sorted(set(pgids) & running_process_groups()):
        now = time.monotonic()
        if now >= deadline:
            if killed:
                raise TimeoutError(f"process groups {left} still run after SIGKILL")
            for pgid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            killed, deadline = True, now + reap_s
        time.sleep(0.05)


def stop_process(popen: subprocess.Popen, grace_s: float, *, group: bool = False, reap_s: float = 5.0) -> None:
    """SIGTERM the process (or its group), wait up to `grace_s` s, then SIGKILL and reap it (see `stop_processes`)."""
    stop_processes([popen], grace_s, group=group, reap_s=reap_s)


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so `finally` clean-up runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ignore SIGINT, SIGTERM and SIGHUP while cleaning up (main thread only), so a second one cannot cut it short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
