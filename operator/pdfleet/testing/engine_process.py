"""Start and stop emulator processes for tests, benchmarks and demos (on 127.0.0.1 unless told another address).

with start_engine("prefill", rack="rack-a") as prefill, start_engine("decode", rack="rack-a") as decode:
    httpx.post(prefill.url + "/v1/completions", ...)

`free_loopback_host()` picks a 127.x address nothing listens on, so an engine can have an address of its own (its
`remote_host` in kv_transfer_params then names it, not a shared 127.0.0.1); `pdfleet.testing.vllm_process` starts real
vLLM engines behind the same interface (url, host, port, log(), stop(), kill()).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from pdfleet.localfleet.processes import free_port, stop_process

KV_ROLE_BY_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer", "both": "kv_both"}
DEFAULT_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
HEALTH_POLL_S = 0.05
TEST_LOOPBACK_PREFIX = "127.1.9."  # addresses for test engines, one each; Linux answers all of 127.0.0.0/8 on lo
_TCP_LISTEN = "0A"


def listening_hosts() -> set[str]:
    """IPv4 addresses with a listening TCP socket on this machine (from /proc/net/tcp; empty where that is missing)."""
    hosts = set()
    try:
        with open("/proc/net/tcp", encoding="ascii") as handle:
            next(handle, None)
            for line in handle:
                fields = line.split()
                if len(fields) > 3 and fields[3] == _TCP_LISTEN:
                    address = fields[1].split(":")[0]  # little-endian hex, e.g. 0109017F = 127.1.9.1
                    hosts.add(".".join(str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)))
    except OSError:
        pass
    return hosts


def free_loopback_host(prefix: str = TEST_LOOPBACK_PREFIX, taken: Sequence[str] = ()) -> str:
    """A loopback address `prefix`N (N in 2..254) that nothing listens on and that is not in `taken`.

    Two engines on distinct addresses never share a port space, so each can use the same ports (vLLM's NIXL side
    channel defaults to 5600) and advertise an address that is really its own. Raises RuntimeError if all are busy.
    """
    busy = listening_hosts() | set(taken)  # a wildcard (0.0.0.0) listener holds a port, not an address: free_port's job
    for last in range(2, 255):
        host = f"{prefix}{last}"
        if host not in busy:
            return host
    raise RuntimeError(f"no free loopback address under {prefix}*")


class EngineProcess:
    """A running emulator process; a context manager that stops it on exit."""

    def __init__(self, proc: subprocess.Popen, host: str, port: int, role: str, rack: str, log_path: str) -> None:
        self.proc = proc
        self.host = host
        self.port = port
        self.role = role
        self.rack = rack
        self.log_path = log_path

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        """Process id."""
        return self.proc.pid

    def alive(self) -> bool:
        """True while the process runs."""
        return self.proc.poll() is None

    def log(self) -> str:
        """Everything the process wrote to stdout/stderr so far."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                return handle.read()
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL the process (a crashed instance) without removing its log."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; removes the log file."""
        stop_process(self.proc, grace_s=timeout, reap_s=timeout)
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)

    def __enter__(self) -> EngineProcess:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def engine_command(
    role: str,
    port: int,
    *,
    host: str = "127.0.0.1",
    rack: str = "",
    model: str = DEFAULT_MODEL,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    kv_extra_config: Mapping[str, object] | None = None,
) -> list[str]:
    """The `python -m pdfleet engine serve ...` command line for one instance (`kv_extra_config`: the
    kv-transfer-config's kv_connector_extra_config, e.g. {"kv_lease_duration": 10})."""
    if role not in KV_ROLE_BY_ROLE:
        raise ValueError(f"role must be one of {', '.join(KV_ROLE_BY_ROLE)}")
    kv_config: dict[str, object] = {"kv_connector": "NixlConnector", "kv_role": KV_ROLE_BY_ROLE[role]}
    if kv_extra_config:
        kv_config["kv_connector_extra_config"] = dict(kv_extra_config)
    cmd = [
        sys.executable,
        "-m",
        "pdfleet",
        "engine",
        "serve",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--kv-transfer-config",
        json.dumps(kv_config),
        "--rack",
        rack,
    ]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    return cmd + list(extra_args)


def start_engine(
    role: str = "both",
    port: int | None = None,
    *,
    rack: str = "",
    model: str = DEFAULT_MODEL,
    served_model_name: str | None = None,
    extra_args: Sequence[str] = (),
    host: str = "127.0.0.1",
    env: dict[str, str] | None = None,
    startup_timeout: float = 20.0,
    kv_extra_config: Mapping[str, object] | None = None,
) -> EngineProcess:
    """Start one emulator process and wait until /health answers 200; raises RuntimeError (with its log) otherwise."""
    port = port or free_port(host)
    fd, log_path = tempfile.mkstemp(prefix=f"pdfleet-engine-{role}-{port}-", suffix=".log")
    cmd = engine_command(
        role,
        port,
        host=host,
        rack=rack,
        model=model,
        served_model_name=served_model_name,
        extra_args=extra_args,
        kv_extra_config=kv_extra_config,
    )
    with os.fdopen(fd, "wb") as log_file:
        proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})}
        )
    engine = EngineProcess(proc, host, port, role, rack, log_path)
    deadline = time.monotonic() + startup_timeout
    while time.monotonic() < deadline:
        if not engine.alive():
            break
        try:
            with urllib.request.urlopen(engine.url + "/health", timeout=1.0) as resp:
                if resp.status == 200:
                    return engine
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(HEALTH_POLL_S)
    log = engine.log()
    engine.stop()
    raise RuntimeError(f"engine {role} on port {port} did not become healthy:\n{log}")
