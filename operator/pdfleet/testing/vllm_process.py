"""Start and stop real vLLM engines (CPU build, tiny Llama) for tests, behind the emulator EngineProcess's interface.

with start_vllm("prefill") as prefill, start_vllm("decode") as decode:
    httpx.post(prefill.url + "/v1/completions", ...)

Each engine gets a loopback address of its own (127.1.9.N) for its HTTP port and its NIXL side channel, so the
prefill's kv_transfer_params name its real address, never a shared localhost. KV moves over NIXL with UCX on TCP and
host (cpu) buffers. One vLLM server is 3-4 processes (API server, resource tracker, EngineCore, Worker); the launcher
starts it in a process group of its own and `stop()`/`kill()` signal the whole group. Start-up takes 45-90 s (imports
and process spawns); until then the HTTP port refuses connections, so /health polling never hangs.

Where vLLM is not installed, `pdfleet.localfleet.real_vllm.missing()` says why (tests pass it to missing_prerequisite).
Each engine takes about 3 GB and, with NIXL, a core even when idle: on a 2-core machine run at most two at a time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.processes import free_ports, stop_process
from pdfleet.testing.engine_process import KV_ROLE_BY_ROLE, EngineProcess, free_loopback_host

HEALTH_POLL_S = 0.5
STARTUP_TIMEOUT_S = 240.0
LOG_TAIL_CHARS = 6000
# environment variables of the test process that would steer the venv's Python away from its own packages
_DROPPED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")


class VllmProcess(EngineProcess):
    """A running real vLLM server (a process group); a context manager that stops it on exit."""

    def __init__(
        self,
        proc: subprocess.Popen,
        host: str,
        port: int,
        role: str,
        log_path: str,
        *,
        side_channel_port: int,
        served_model_name: str,
        rack: str = "",
    ) -> None:
        super().__init__(proc, host, port, role, rack, log_path)
        self.side_channel_port = side_channel_port
        self.served_model_name = served_model_name

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        """The last `chars` characters of the log."""
        return self.log()[-chars:]

    def _kill_group(self) -> None:
        # the API server may be gone while its EngineCore/Worker still run: the group id outlives its leader
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        """SIGKILL every process of the engine (a crashed instance) without removing its log."""
        self._kill_group()
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the whole process group, wait up to `timeout`, then SIGKILL what is left; removes the log file."""
        stop_process(self.proc, grace_s=timeout, group=True, reap_s=timeout)
        self._kill_group()
        if os.path.exists(self.log_path):
            os.unlink(self.log_path)


def kv_transfer_config(role: str, extra_config: Mapping[str, object] | None = None) -> dict[str, object]:
    """vLLM's --kv-transfer-config for NIXL between CPU engines: the role's kv_role, host buffers."""
    if role not in KV_ROLE_BY_ROLE:
        raise ValueError(f"role must be one of {', '.join(KV_ROLE_BY_ROLE)}")
    config: dict[str, object] = {
        "kv_connector": "NixlConnector",
        "kv_role": KV_ROLE_BY_ROLE[role],
        "kv_buffer_device": "cpu",
    }
    if extra_config:
        config["kv_connector_extra_config"] = dict(extra_config)
    return config


def vllm_command(
    role: str,
    host: str,
    port: int,
    *,
    served_model_name: str = real_vllm.SERVED_MODEL_NAME,
    kv_extra_config: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `vllm serve <tiny model> ...` command line for one engine in `role` (prefill | decode | both)."""
    return [
        str(real_vllm.vllm_executable()),
        "serve",
        str(real_vllm.tiny_model_dir()),
        "--host",
        host,
        "--port",
        str(port),
        "--served-model-name",
        served_model_name,
        *real_vllm.CPU_ENGINE_ARGS,
        "--kv-transfer-config",
        json.dumps(kv_transfer_config(role, kv_extra_config)),
        *extra_args,
    ]


def vllm_env(host: str, side_channel_port: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: ours minus Python path overrides, the CPU settings, NIXL over TCP on loopback with
    the side channel on the engine's own address; `env` wins over all of it."""
    base = {k: v for k, v in os.environ.items() if k not in _DROPPED_ENV}
    return {
        **base,
        **real_vllm.CPU_ENGINE_ENV,
        "UCX_TLS": "tcp,self,sm",
        "UCX_NET_DEVICES": "lo",
        "VLLM_NIXL_SIDE_CHANNEL_HOST": host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
        **(env or {}),
    }


def launch_vllm(
    role: str = "both",
    *,
    host: str | None = None,
    port: int | None = None,
    served_model_name: str = real_vllm.SERVED_MODEL_NAME,
    kv_extra_config: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    taken_hosts: Sequence[str] = (),
) -> VllmProcess:
    """Start one engine and return at once (not yet healthy: see wait_healthy). Raises RuntimeError when vLLM is
    not installed."""
    if why := real_vllm.missing():
        raise RuntimeError(why)
    host = host or free_loopback_host(taken=taken_hosts)
    http_port, side_port = free_ports(2, host)
    port = port or http_port
    if side_port == port:
        side_port = free_ports(2, host)[1]
    cmd = vllm_command(
        role, host, port, served_model_name=served_model_name, kv_extra_config=kv_extra_config, extra_args=extra_args
    )
    fd, log_path = tempfile.mkstemp(prefix=f"pdfleet-vllm-{role}-{host}-{port}-", suffix=".log")
    with os.fdopen(fd, "wb") as log_file:
        proc = subprocess.Popen(
            cmd,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=vllm_env(host, side_port, env),
            cwd=tempfile.gettempdir(),
            start_new_session=True,
        )
    return VllmProcess(
        proc, host, port, role, log_path, side_channel_port=side_port, served_model_name=served_model_name
    )


def wait_healthy(engines: Sequence[VllmProcess], timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Wait until every engine answers GET /health 200; on a dead engine or the deadline, stop them all and raise
    RuntimeError with the failing engine's log tail."""
    deadline = time.monotonic() + timeout
    pending = list(engines)
    failed: VllmProcess | None = None
    while pending and time.monotonic() < deadline:
        for engine in list(pending):
            if not engine.alive():
                failed = engine
                break
            try:
                with urllib.request.urlopen(engine.url + "/health", timeout=2.0) as resp:
                    if resp.status == 200:
                        pending.remove(engine)
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
        if failed:
            break
        if pending:
            time.sleep(HEALTH_POLL_S)
    if not pending:
        return
    failed = failed or pending[0]
    why = f"exited with {failed.proc.returncode}" if not failed.alive() else f"not healthy after {timeout:g} s"
    tail = failed.log_tail()
    for engine in engines:
        engine.stop()
    raise RuntimeError(f"vLLM {failed.role} engine on {failed.host}:{failed.port} {why}; log tail:\n{tail}")


def start_vllm(
    role: str = "both",
    *,
    host: str | None = None,
    port: int | None = None,
    served_model_name: str = real_vllm.SERVED_MODEL_NAME,
    kv_extra_config: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> VllmProcess:
    """Start one real vLLM engine on a loopback address of its own and wait until /health answers 200; raises
    RuntimeError (with the log tail) otherwise. `role`: prefill (kv_producer), decode (kv_consumer) or both."""
    engine = launch_vllm(
        role,
        host=host,
        port=port,
        served_model_name=served_model_name,
        kv_extra_config=kv_extra_config,
        extra_args=extra_args,
        env=env,
    )
    wait_healthy([engine], startup_timeout)
    return engine


def start_vllm_pair(
    *,
    served_model_name: str = real_vllm.SERVED_MODEL_NAME,
    kv_extra_config: Mapping[str, object] | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    prefill_env: Mapping[str, str] | None = None,
    decode_env: Mapping[str, str] | None = None,
    startup_timeout: float = STARTUP_TIMEOUT_S,
) -> tuple[VllmProcess, VllmProcess]:
    """A prefill and a decode engine started together (start-up overlaps), each on its own address; both healthy."""
    prefill = launch_vllm(
        "prefill",
        served_model_name=served_model_name,
        kv_extra_config=kv_extra_config,
        extra_args=extra_args,
        env={**(env or {}), **(prefill_env or {})},
    )
    try:
        decode = launch_vllm(
            "decode",
            served_model_name=served_model_name,
            kv_extra_config=kv_extra_config,
            extra_args=extra_args,
            env={**(env or {}), **(decode_env or {})},
            taken_hosts=[prefill.host],
        )
    except BaseException:
        prefill.stop()
        raise
    wait_healthy([prefill, decode], startup_timeout)
    return prefill, decode
