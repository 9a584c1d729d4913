"""Free ports and stopping child processes -- shared by the local fleet, the test launchers, the tests and the benches.

    port = free_port()
    stop_process(popen, grace_s=10)               # SIGTERM, 10 s grace, then SIGKILL; reaped either way
    stop_processes(popens, grace_s=10, group=True)  # many at once: one grace period for all, whole process groups

`group=True` signals the child's process group (`os.killpg`), so grandchildren stop too; only for children started
with `start_new_session=True` (they lead their own group). Otherwise only the child itself gets the signals.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence

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


def signal_process(popen: subprocess.Popen, sig: signal.Signals, *, group: bool = False) -> None:
    """Send `sig` to the child (or its whole process group); nothing if it has exited already."""
    if popen.poll() is not None:
        return
    try:
        if group:
            os.killpg(popen.pid, sig)
        else:
            popen.send_signal(sig)
    except ProcessLookupError:
        pass


def stop_processes(
    popens: Sequence[subprocess.Popen], grace_s: float, *, group: bool = False, reap_s: float = 5.0
) -> None:
    """SIGTERM every process at once, give them `grace_s` s in all, then SIGKILL what is left and reap it.

    Waits up to `reap_s` s per process after its SIGKILL (TimeoutExpired if one still has not gone).
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


def stop_process(popen: subprocess.Popen, grace_s: float, *, group: bool = False, reap_s: float = 5.0) -> None:
    """SIGTERM the process (or its group), wait up to `grace_s` s, then SIGKILL and reap it (see `stop_processes`)."""
    stop_processes([popen], grace_s, group=group, reap_s=reap_s)
