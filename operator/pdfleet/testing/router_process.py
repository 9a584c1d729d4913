"""Start a `pdfleet router` process on 127.0.0.1 with a fleet file of its own -- for tests and benchmarks."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import httpx

from pdfleet.localfleet.processes import free_ports, stop_process
from pdfleet.render.router_access import admin_headers


class RouterProcess:
    """A router process fed from a fleet file in a temp dir; `write_fleet` swaps the file atomically (like a
    ConfigMap update). Its admin API wants `admin_token` (a fresh one in a file of the dir, as the operator's Secret
    is mounted); `admin_headers` carry it. Waits until /ready; `stop()` ends it and removes the dir."""

    def __init__(self, fleet: dict[str, Any], extra_args: Sequence[str] = (), ready_timeout: float = 20.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="pdfleet-router-"))
        self.fleet_file = self.dir / "fleet.json"
        self.write_fleet(fleet)
        self.admin_token = secrets.token_urlsafe(32)
        self.admin_headers = admin_headers(self.admin_token)
        token_file = self.dir / "admin-token"
        token_file.write_text(self.admin_token)
        self.port, self.admin_port = free_ports(2)
        self.url, self.admin = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.admin_port}"
        self.log_path = self.dir / "router.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pdfleet",
                    "router",
                    "--fleet-file",
                    str(self.fleet_file),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--admin-port",
                    str(self.admin_port),
                    "--admin-token-file",
                    str(token_file),
                    *extra_args,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + ready_timeout
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log_text = self.log()
                self.stop()
                raise RuntimeError("router did not become ready:\n" + log_text)
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return httpx.get(self.admin + "/ready", timeout=1, trust_env=False).status_code == 200
        except httpx.HTTPError:
            return False

    def write_fleet(self, fleet: dict[str, Any]) -> None:
        """Replace the router's fleet file atomically."""
        tmp = self.fleet_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(fleet))
        os.replace(tmp, self.fleet_file)

    def log(self) -> str:
        """Everything the router wrote so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> str:
        """Stop the router (SIGTERM, then SIGKILL); returns its log."""
        stop_process(self.proc, grace_s=10, reap_s=5)
        log = self.log()
        shutil.rmtree(self.dir, ignore_errors=True)
        return log

    def __enter__(self) -> RouterProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
