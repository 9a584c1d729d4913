"""Local pod runner -- test and demo infrastructure that plays the kubelet for the harness's fake Nodes.

In a real cluster the kubelet starts a pod's containers. Here nothing would, so this runner watches the pods bound to
the nodes it owns and, for each, starts the process the pod asks for on the pod's own loopback address (127.b.x.y, from
an address block b that no other runner on the machine holds; all of 127/8 routes to `lo`, so every pod can bind its
container port, as if it had its own network namespace):

- `vllm serve ...`   -> the engine emulator, `python -m pdfleet engine serve ...` with the same args, or, in a
                       runner started with `engine="vllm"`, real vLLM: the `vllm` of the venv `.ci/install-vllm.sh`
                       builds, with the same args and env (localfleet.real_vllm);
- `pdfleet ...`      -> `python -m pdfleet ...` (the router);
- anything else      -> the pod is reported as failing to start (no container runtime here).

It reports the pod's IP, phase, readiness (probing the pod's real readinessProbe httpGet path), container restarts,
materialises configMap and secret volumes as files (refreshed when the object changes, like the kubelet does) with
their mount paths rewritten in the arguments, restarts exited processes with backoff, and on deletion stops the
process (SIGTERM, SIGKILL after the pod's grace period) and removes the pod object. The same manifests that run on a
real cluster run here unchanged. Engine processes learn the GPU they "run on" from their node's `nvidia.com/gpu.product`
label (`PDFLEET_EMULATOR_GPU`), as a real engine would find the node's GPU.
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdfleet.localfleet import real_vllm
from pdfleet.localfleet.controlplane import GPU_PRODUCT_LABEL
from pdfleet.localfleet.processes import signal_process, stop_processes
from pdfleet.render.fleet_view import pod_url

log = logging.getLogger("pdfleet.podrunner")

POLL_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 10.0
MAX_GRACE_SECONDS = 30.0
PROBE_TIMEOUT_SECONDS = 1.0
FIRST_POD_IP = ipaddress.IPv4Address("127.1.0.1")
# Each runner owns one 127.<1+block>.0.0/16 of pod addresses, claimed by binding a socket on the block's last address,
# so fleets run side by side on one machine (a demo beside a test run) never share an address.
ADDRESS_BLOCKS = 200
BLOCK_CLAIM_PORT = 29998
EMULATOR_GPU_ENV = "PDFLEET_EMULATOR_GPU"
ENGINES = ("emulator", "vllm")
# Real vLLM's NIXL thread spins a core even when idle: run real engines below the control plane and the router.
REAL_ENGINE_NICENESS = 10


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_ip(index: int, block: int = 0) -> str:
    """The `index`-th pod address (0-based) of address block `block`: 127.<1+block>.0.1 upwards (all of 127/8 is
    loopback on Linux)."""
    return str(FIRST_POD_IP + (block << 16) + index)


def claim_address_block() -> tuple[int, socket.socket]:
    """The first free address block and the socket that holds it (close it to free the block)."""
    for block in range(ADDRESS_BLOCKS):
        claim = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            claim.bind((pod_ip(0xFFFD, block), BLOCK_CLAIM_PORT))
        except OSError:
            claim.close()
            continue
        return block, claim
    raise RuntimeError(f"all {ADDRESS_BLOCKS} pod address blocks are in use by other local fleets")


def local_argv(argv: Sequence[str], pod_ip: str, vllm: Path | None = None) -> list[str] | None:
    """The local command that stands in for a container's command+args, bound to the pod IP (as a pod's own network
    namespace would bind it); `vllm` runs engine containers as real vLLM instead of the emulator. None if
    unsupported."""
    if not argv:
        return None
    program, rest = Path(argv[0]).name, list(argv[1:])
    if program == "vllm":
        if vllm is not None:
            return [str(vllm), *rest, "--host", pod_ip]
        return [sys.executable, "-m", "pdfleet", "engine", *rest, "--host", pod_ip]
    if program == "pdfleet":
        return [sys.executable, "-m", "pdfleet", *rest, "--host", pod_ip]
    return None


def resolve_env(container: Mapping[str, Any], pod: Mapping[str, Any], pod_ip: str) -> dict[str, str]:
    """Container env with the downward-API fields the kubelet would fill in."""
    fields = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "status.podIP": pod_ip,
        "spec.nodeName": pod["spec"].get("nodeName", ""),
    }
    env = {}
    for var in container.get("env") or []:
        if "value" in var:
            env[var["name"]] = str(var["value"])
        elif (ref := (var.get("valueFrom") or {}).get("fieldRef")) and ref.get("fieldPath") in fields:
            env[var["name"]] = fields[ref["fieldPath"]]
    return env


def node_env(node_labels: Mapping[str, str]) -> dict[str, str]:
    """What a process learns from its node: the emulator's GPU preset from the GPU product label."""
    product = node_labels.get(GPU_PRODUCT_LABEL)
    return {EMULATOR_GPU_ENV: product} if product else {}


@dataclass(frozen=True)
class Probe:
    """A readinessProbe reduced to what the runner needs."""

    url: str
    period_s: float = 10.0
    failure_threshold: int = 3


def readiness_probe(container: Mapping[str, Any], pod_ip: str) -> Probe | None:
    """The container's readinessProbe httpGet (named ports resolved), or None when it has none (always ready)."""
    spec = container.get("readinessProbe") or {}
    http = spec.get("httpGet")
    if not http:
        return None
    port = http.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next(p["containerPort"] for p in container.get("ports") or [] if p.get("name") == port)
    return Probe(
        url=pod_url(pod_ip, port) + http.get("path", "/"),
        period_s=float(spec.get("periodSeconds", 10)),
        failure_threshold=int(spec.get("failureThreshold", 3)),
    )


def rewrite_mount_paths(argv: list[str], mounts: Mapping[str, Path]) -> list[str]:
    """Point arguments that name a file under a volume's mountPath at the runner's local copy."""
    out = []
    for arg in argv:
        for mount_path, local in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
            if arg == mount_path or arg.startswith(mount_path.rstrip("/") + "/"):
                arg = str(local) + arg[len(mount_path.rstrip("/")) :]
                break
        out.append(arg)
    return out


def restart_backoff(restarts: int) -> float:
    """Seconds to wait before the `restarts`-th restart: 1, 2, 4, 8, then capped (the kubelet's doubling, shortened)."""
    return min(MAX_BACKOFF_SECONDS, 2.0 ** min(max(restarts, 1) - 1, 8))


def grace_seconds(pod: Mapping[str, Any]) -> float:
    """How long a deleted pod's process may take to stop after SIGTERM (the pod's grace period, capped)."""
    meta, spec = pod["metadata"], pod["spec"]
    grace = meta.get("deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", MAX_GRACE_SECONDS))
    return min(float(grace if grace is not None else MAX_GRACE_SECONDS), MAX_GRACE_SECONDS)


@dataclass(frozen=True)
class ContainerView:
    """What the kubelet knows about the pod's one container, the input of `pod_status`."""

    ip: str
    name: str
    image: str
    supported: bool
    running: bool
    ready: bool
    restarts: int
    started_at: str
    last_exit_code: int | None = None


def pod_status(view: ContainerView, now: str) -> dict[str, Any]:
    """The pod status a kubelet would report for `view` (phase, IPs, conditions, containerStatuses)."""
    ready = "True" if view.ready else "False"
    if view.running:
        state: dict[str, Any] = {"running": {"startedAt": view.started_at}}
    elif not view.supported:
        state = {"waiting": {"reason": "RunContainerError", "message": "no local stand-in for this command"}}
    else:
        state = {"waiting": {"reason": "CrashLoopBackOff" if view.restarts else "ContainerCreating"}}
    container: dict[str, Any] = {
        "name": view.name,
        "image": view.image,
        "imageID": "",
        "ready": view.ready,
        "started": view.running,
        "restartCount": view.restarts,
        "state": state,
    }
    if view.last_exit_code is not None:
        container["lastState"] = {"terminated": {"exitCode": view.last_exit_code, "reason": "Error"}}
    return {
        "phase": "Running" if view.running or view.restarts else "Pending",
        "podIP": view.ip,
        "podIPs": [{"ip": view.ip}],
        "hostIP": "127.0.0.1",
        "startTime": view.started_at,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now},
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
        ],
        "containerStatuses": [container],
    }


def _child_setup(niceness: int) -> Callable[[], None]:
    """preexec hook: the child gets SIGTERM when the forking thread (the runner's loop) dies without cleaning up, and
    runs at `niceness` (what a kubelet's CPU limit does, roughly: a busy engine cannot starve the control plane)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def setup() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)
        os.nice(niceness)

    return setup


@dataclass
class RunningPod:
    """One admitted pod: its address, command, and the state of its process."""

    uid: str
    namespace: str
    name: str
    ip: str
    container: str
    image: str
    workdir: Path
    argv: list[str] | None
    env: dict[str, str]
    probe: Probe | None
    config_volumes: dict[str, tuple[str, str, Path]]  # volume name -> ("configMap" | "secret", object name, local dir)
    niceness: int = 0
    process: subprocess.Popen | None = None
    restarts: int = 0
    last_exit_code: int | None = None
    next_start: float = 0.0
    next_probe: float = 0.0
    probe_failures: int = 0
    ready: bool = False
    started_at: str = field(default_factory=_now)
    reported: ContainerView | None = None
    kill_deadline: float | None = None  # set once the pod is being deleted
    config_synced_at: float | None = None  # monotonic time its configMap volumes were last refreshed

    @property
    def log_path(self) -> Path:
        """Where the container's stdout and stderr go."""
        return self.workdir / "container.log"


class LocalPodRunner:
    """Runs the pods bound to `node_names` (all nodes when None) as local processes until `stop()`.

    `extra_env` is added to every process's environment (under the container's own env). `config_sync_s` is how
    often a running pod's configMap volumes are refreshed (0: every poll); a real kubelet takes up to about a minute,
    which is what the operator's fleet-view push to the routers is for. `engine` is what runs engine containers:
    "emulator", or "vllm" (real vLLM from .ci/install-vllm.sh; RuntimeError when it is not installed).
    """

    def __init__(
        self,
        api_client: Any,
        node_names: Sequence[str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        config_sync_s: float = 0.0,
        engine: str = "emulator",
    ):
        from kubernetes import client

        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
        if engine == "vllm" and (why := real_vllm.missing()):
            raise RuntimeError(why)
        self.vllm = real_vllm.vllm_executable() if engine == "vllm" else None
        self.core = client.CoreV1Api(api_client)
        self.node_names = set(node_names) if node_names is not None else None
        self.extra_env = dict(extra_env or {})
        self.config_sync_s = config_sync_s
        self.workdir = Path(tempfile.mkdtemp(prefix="pdfleet-pods-"))
        self.pods: dict[str, RunningPod] = {}
        self._lock = threading.Lock()
        self._ips_used = 0
        self.address_block, self._block_claim = claim_address_block()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)

    def start(self) -> LocalPodRunner:
        """Start the runner's sync thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop, then every process (SIGTERM, SIGKILL after 10 s), and remove the runner's files."""
        self._stop.set()
        self._thread.join(timeout=30)
        with self._lock:
            pods = list(self.pods.values())
            self.pods.clear()
        _stop_processes(pods, timeout=10.0)
        self._block_claim.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalPodRunner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def find(self, namespace: str, name: str) -> RunningPod | None:
        """The running pod of that name, if the runner has admitted it."""
        with self._lock:
            return next((p for p in self.pods.values() if (p.namespace, p.name) == (namespace, name)), None)

    def kill_pod_process(self, namespace: str, name: str) -> bool:
        """Crash a pod's container (SIGKILL to its whole process group, as the OOM killer takes a container), the
        runner restarts it. False if none runs."""
        pod = self.find(namespace, name)
        if pod is None or pod.process is None or pod.process.poll() is not None:
            return False
        _signal_group(pod, signal.SIGKILL)
        return True

    def pod_log(self, namespace: str, name: str) -> str:
        """The pod's container log so far ('' when unknown)."""
        pod = self.find(namespace, name)
        try:
            return pod.log_path.read_text(errors="replace") if pod else ""
        except OSError:
            return ""

    # --- the loop ---------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception:
                log.exception("pod runner sync failed")
            self._stop.wait(POLL_SECONDS)

    def _mine(self, pod: Mapping[str, Any]) -> bool:
        node = pod["spec"].get("nodeName")
        return bool(node) and (self.node_names is None or node in self.node_names)

    def _list_bound_pods(self) -> list[dict[str, Any]]:
        # Raw JSON: deserialising into client models and back costs more CPU than the rest of the loop.
        reply = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False)
        return json.loads(reply.data)["items"]

    def _sync(self) -> None:
        seen = set()
        config_maps: dict[tuple[str, str, str], dict[str, str] | None] = {}
        for pod in self._list_bound_pods():
            if not self._mine(pod):
                continue
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            running = self.pods.get(uid)
            if pod["metadata"].get("deletionTimestamp"):
                self._terminate(running, pod)
                continue
            if running is None:
                running = self._admit(pod)
            if self._refresh_config(running, config_maps):
                self._supervise(running)
            self._report(running)
        for uid in set(self.pods) - seen:  # deleted outright (grace 0, or the pod garbage collector)
            with self._lock:
                gone = self.pods.pop(uid)
            _stop_processes([gone], timeout=5.0)

    def _admit(self, pod: Mapping[str, Any]) -> RunningPod:
        meta, spec = pod["metadata"], pod["spec"]
        ip = pod_ip(self._ips_used, self.address_block)
        self._ips_used += 1
        workdir = self.workdir / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        workdir.mkdir(parents=True)
        container = spec["containers"][0]
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        config_volumes, mounts = {}, {}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(mount["name"], {})
            local = workdir / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
            if "configMap" in volume:
                config_volumes[mount["name"]] = ("configMap", volume["configMap"]["name"], local)
            elif "secret" in volume:
                config_volumes[mount["name"]] = ("secret", volume["secret"]["secretName"], local)
        argv = local_argv(list(container.get("command") or []) + list(container.get("args") or []), ip, self.vllm)
        running = RunningPod(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            ip=ip,
            container=container["name"],
            image=container.get("image", ""),
            workdir=workdir,
            argv=rewrite_mount_paths(argv, mounts) if argv else None,
            env={**os.environ, **self._node_env(spec["nodeName"]), **self.extra_env, **resolve_env(container, pod, ip)},
            probe=readiness_probe(container, ip),
            config_volumes=config_volumes,
            niceness=REAL_ENGINE_NICENESS if self.vllm is not None and argv and argv[0] == str(self.vllm) else 0,
        )
        with self._lock:
            self.pods[running.uid] = running
        log.info("admitted pod %s/%s at %s", running.namespace, running.name, ip)
        return running

    def _node_env(self, node_name: str) -> dict[str, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            return node_env(self.core.read_node(node_name).metadata.labels or {})
        except ApiException:
            return {}

    def _refresh_config(self, pod: RunningPod, cache: dict[tuple[str, str, str], dict[str, str] | None]) -> bool:
        """Write the pod's configMap and secret volumes; False while one is missing (the kubelet would not start the
        pod)."""
        from kubernetes.client.exceptions import ApiException

        now = time.monotonic()
        if pod.config_synced_at is not None and now - pod.config_synced_at < self.config_sync_s:
            return True  # written before, not due yet
        complete = True
        for source, object_name, local in pod.config_volumes.values():
            key = (pod.namespace, source, object_name)
            if key not in cache:
                try:
                    if source == "secret":
                        encoded = self.core.read_namespaced_secret(object_name, pod.namespace).data or {}
                        cache[key] = {k: base64.b64decode(v).decode() for k, v in encoded.items()}
                    else:
                        cache[key] = self.core.read_namespaced_config_map(object_name, pod.namespace).data or {}
                except ApiException:
                    cache[key] = None
            data = cache[key]
            if data is None:
                complete = False
                continue
            for name, value in data.items():
                path = local / name
                if not path.exists() or path.read_text() != value:
                    tmp = path.with_name(f".{name}.tmp")
                    tmp.write_text(value)
                    tmp.replace(path)  # atomic, as the kubelet's symlink swap is
        if complete:
            pod.config_synced_at = now
        return complete

    def _supervise(self, pod: RunningPod) -> None:
        if pod.argv is None:
            return
        if pod.process is not None and pod.process.poll() is not None:
            log.warning("pod %s/%s exited with %s", pod.namespace, pod.name, pod.process.returncode)
            pod.last_exit_code = pod.process.returncode
            pod.process = None
            pod.restarts += 1
            pod.ready = False
            pod.probe_failures = 0
            pod.next_start = time.monotonic() + restart_backoff(pod.restarts)
        if pod.process is None and time.monotonic() >= pod.next_start:
            with open(pod.log_path, "ab") as out:
                pod.process = subprocess.Popen(
                    pod.argv,
                    env=pod.env,
                    cwd=pod.workdir,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_child_setup(pod.niceness),
                )
            pod.started_at = _now()
            pod.next_probe = 0.0
        if pod.process is not None:
            self._probe(pod)

    @staticmethod
    def _probe(pod: RunningPod) -> None:
        """Readiness as the kubelet judges it: every poll until ready, then every period; N failures to unready."""
        if pod.probe is None:
            pod.ready = True
            return
        now = time.monotonic()
        if pod.ready and now < pod.next_probe:
            return
        pod.next_probe = now + min(pod.probe.period_s, 2.0)
        if _http_ok(pod.probe.url):
            pod.ready, pod.probe_failures = True, 0
            return
        pod.probe_failures += 1
        if not pod.ready or pod.probe_failures >= pod.probe.failure_threshold:
            pod.ready = False

    def _report(self, pod: RunningPod) -> None:
        """Patch the pod status when what a kubelet would report changed."""
        running = pod.process is not None and pod.process.poll() is None
        view = ContainerView(
            ip=pod.ip,
            name=pod.container,
            image=pod.image,
            supported=pod.argv is not None,
            running=running,
            ready=pod.ready and running,
            restarts=pod.restarts,
            started_at=pod.started_at,
            last_exit_code=pod.last_exit_code,
        )
        if pod.reported == view:
            return
        self.core.patch_namespaced_pod_status(pod.name, pod.namespace, {"status": pod_status(view, _now())})
        pod.reported = view

    def _terminate(self, pod: RunningPod | None, body: Mapping[str, Any]) -> None:
        """Graceful stop of a deleted pod: SIGTERM once, then SIGKILL at the deadline; finally remove the object."""
        from kubernetes.client.exceptions import ApiException

        if pod is not None:
            if pod.kill_deadline is None:
                pod.kill_deadline = time.monotonic() + grace_seconds(body)
                pod.ready = False
                _signal_group(pod, signal.SIGTERM)
                self._report(pod)
            alive = pod.process is not None and pod.process.poll() is None
            if alive and time.monotonic() < pod.kill_deadline:
                return
            _signal_group(pod, signal.SIGKILL)
            with self._lock:
                self.pods.pop(pod.uid, None)
        try:  # the kubelet's last word: the containers are gone, remove the object
            self.core.delete_namespaced_pod(
                body["metadata"]["name"], body["metadata"]["namespace"], grace_period_seconds=0
            )
        except ApiException as error:
            if error.status != 404:
                raise


def _http_ok(url: str) -> bool:
    # No proxy handler: a proxy from the environment must never see loopback probes.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=PROBE_TIMEOUT_SECONDS) as reply:
            return 200 <= reply.status < 400
    except OSError:
        return False


def _signal_group(pod: RunningPod, sig: signal.Signals) -> None:
    if pod.process is not None:
        signal_process(pod.process, sig, group=True)


def _stop_processes(pods: Sequence[RunningPod], timeout: float) -> None:
    """SIGTERM every pod's process group at once, wait up to `timeout` s in all, then SIGKILL what is left."""
    stop_processes([pod.process for pod in pods if pod.process is not None], grace_s=timeout, group=True, reap_s=5)
    for pod in pods:
        pod.process = None
