"""A real, throwaway Kubernetes control plane on 127.0.0.1 -- test and demo infrastructure, never production code.

`LocalControlPlane` starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler (v1.20.2, built by
`.ci/install-control-plane.sh`) as local processes with freshly generated certificates, on free ports, in a temp dir
that `stop()` removes. There is no kubelet: fake Nodes registered with `register_node` carry rack/zone/GPU labels and
`nvidia.com/gpu` capacity so the real scheduler binds pods to them; the pods themselves never run unless a test plays
the kubelet. Loopback only: 1.20 has known CVEs, so nothing here listens beyond 127.0.0.1.

    with LocalControlPlane() as cp:
        cp.standard_fleet_nodes()
        core = kubernetes.client.CoreV1Api(cp.api_client())
"""

from __future__ import annotations

import base64
import ctypes
import datetime
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from pdfleet.localfleet.processes import free_ports, stop_processes

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
INSTALL_COMMAND = "bash .ci/install-control-plane.sh"
GPU_RESOURCE = "nvidia.com/gpu"
RACK_LABEL = "topology.pdfleet.dev/rack"
ZONE_LABEL = "topology.kubernetes.io/zone"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
_SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"
_POLL_SECONDS = 0.2
_WORKDIR_PREFIX = "pdfleet-cp-"
_OWNER_FILE = "owner.pid"
_LOG_TAIL_LINES = 40
T = TypeVar("T")


class ControlPlaneError(RuntimeError):
    """The local control plane could not be started or did not become ready."""


class MissingBinariesError(ControlPlaneError):
    """Some control-plane binaries are not installed; `install_command` installs them."""

    def __init__(self, missing: Sequence[str], searched: Sequence[Path]) -> None:
        self.missing = list(missing)
        self.install_command = INSTALL_COMMAND
        super().__init__(
            f"missing control-plane binaries: {', '.join(self.missing)} "
            f"(searched {', '.join(str(p) for p in searched)} and PATH); "
            f"install them with `{INSTALL_COMMAND}` from the repository root"
        )


def cache_dir() -> Path:
    """Where the install scripts cache what they build: $PDFLEET_CACHE, default ~/.cache/pdfleet."""
    return Path(os.environ.get("PDFLEET_CACHE", Path.home() / ".cache" / "pdfleet")).expanduser()


def cache_bin_dir() -> Path:
    """Folder .ci/install-control-plane.sh fills: the control plane, kubectl and helm."""
    return cache_dir() / "bin"


def find_binaries(names: Sequence[str] = CONTROL_PLANE_BINARIES) -> dict[str, Path]:
    """Locate each binary in the cache bin dir first, then on PATH; raise MissingBinariesError listing the absent."""
    bin_dir = cache_bin_dir()
    found: dict[str, Path] = {}
    for name in names:
        cached = bin_dir / name
        if cached.is_file() and os.access(cached, os.X_OK):
            found[name] = cached
        elif on_path := shutil.which(name):
            found[name] = Path(on_path)
    missing = [name for name in names if name not in found]
    if missing:
        raise MissingBinariesError(missing, [bin_dir])
    return found


def namespace_name_for(test_name: str, keep: int = 40) -> str:
    """A fresh, valid namespace name that says which test it belongs to."""
    readable = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:keep].rstrip("-")
    return f"{readable}-{uuid.uuid4().hex[:6]}"


def wait_until(check: Callable[[], T], timeout: float, what: str, interval: float = _POLL_SECONDS) -> T:
    """Poll `check` until it returns something truthy and return that; TimeoutError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(interval)


def _openssl(*args: str | Path, cwd: Path) -> None:
    result = subprocess.run(["openssl", *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(map(str, args))} failed: {result.stderr.strip()}")


def _issue_certificate(pki: Path, name: str, subject: str, extensions: str) -> None:
    """Write <name>.key/<name>.crt signed by pki/ca; P-256 keys, because they are generated instantly."""
    (pki / f"{name}.ext").write_text(extensions)
    _openssl(
        "req",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-subj",
        subject,
        cwd=pki,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.crt",
        cwd=pki,
    )


def generate_pki(pki: Path) -> None:
    """CA, apiserver serving cert, client certs (admin in system:masters, controller-manager, scheduler), SA keys."""
    pki.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-subj",
        "/CN=pdfleet-test-ca",
        "-days",
        "30",
        cwd=pki,
    )
    client_ext = "keyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    _issue_certificate(
        pki,
        "apiserver",
        "/CN=kube-apiserver",
        "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc\n",
    )
    _issue_certificate(pki, "admin", "/O=system:masters/CN=admin", client_ext)
    _issue_certificate(pki, "controller-manager", "/CN=system:kube-controller-manager", client_ext)
    _issue_certificate(pki, "scheduler", "/CN=system:kube-scheduler", client_ext)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key", cwd=pki)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)


def write_kubeconfig(path: Path, server: str, pki: Path, user: str) -> None:
    """A kubeconfig with embedded certs for `user` (its pki/<user>.crt/.key); works with kubectl, kubernetes, kopf."""

    def embed(file: str) -> str:
        return base64.b64encode((pki / file).read_bytes()).decode()

    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "pdfleet-local", "cluster": {"server": server, "certificate-authority-data": embed("ca.crt")}}
        ],
        "users": [
            {
                "name": user,
                "user": {"client-certificate-data": embed(f"{user}.crt"), "client-key-data": embed(f"{user}.key")},
            }
        ],
        "contexts": [{"name": "pdfleet-local", "context": {"cluster": "pdfleet-local", "user": user}}],
        "current-context": "pdfleet-local",
        "preferences": {},
    }
    path.write_text(yaml.safe_dump(document))
    path.chmod(0o600)


def remove_abandoned_workdirs(parent: Path) -> None:
    """Remove work dirs left by test processes that were killed before `stop()` (etcd alone leaves ~60 MB)."""
    for workdir in parent.glob(f"{_WORKDIR_PREFIX}*"):
        try:
            owner = int((workdir / _OWNER_FILE).read_text())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(workdir, ignore_errors=True)
        except (OSError, ValueError):
            continue  # not ours to judge: unreadable, or its owner is alive but another user's


def die_with_parent_hook() -> Callable[[], None] | None:
    """A preexec hook that makes the child get SIGTERM when the test process dies without cleaning up, or None.

    PR_SET_PDEATHSIG fires when the forking *thread* exits, so children are tied only to the main thread; prctl is
    looked up here, before the fork, so the child only makes the call.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass(frozen=True)
class Ports:
    """The loopback ports one control plane listens on."""

    etcd_client: int
    etcd_peer: int
    etcd_metrics: int
    apiserver: int
    controller_manager: int
    scheduler: int

    @property
    def etcd_url(self) -> str:
        """etcd's client URL on 127.0.0.1."""
        return f"http://127.0.0.1:{self.etcd_client}"


def etcd_command(binary: Path, work: Path, ports: Ports) -> list[str]:
    """etcd: one member, data in work/etcd, client/peer/metrics on loopback."""
    peer_url = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(binary),
        "--name=default",
        f"--data-dir={work / 'etcd'}",
        f"--listen-client-urls={ports.etcd_url}",
        f"--advertise-client-urls={ports.etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=default={peer_url}",
        f"--listen-metrics-urls=http://127.0.0.1:{ports.etcd_metrics}",
        "--log-level=warn",
    ]


def apiserver_command(binary: Path, work: Path, ports: Ports) -> list[str]:
    """kube-apiserver: TLS only on 127.0.0.1, client-cert auth against the test CA, Node+RBAC authorization."""
    pki = work / "pki"
    return [
        str(binary),
        f"--etcd-servers={ports.etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={ports.apiserver}",
        "--insecure-port=0",
        f"--cert-dir={work / 'apiserver-certs'}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-account-issuer={_SERVICE_ACCOUNT_ISSUER}",
        f"--api-audiences={_SERVICE_ACCOUNT_ISSUER}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--authorization-mode=Node,RBAC",
        # No kubelet or kube-proxy: the apiserver must not try to publish its own endpoints.
        "--endpoint-reconciler-type=none",
        "--allow-privileged=true",
        "--profiling=false",
    ]


def controller_manager_command(binary: Path, work: Path, ports: Ports) -> list[str]:
    """kube-controller-manager: every controller but nodelifecycle, one ServiceAccount per controller."""
    pki = work / "pki"
    return [
        str(binary),
        f"--kubeconfig={work / 'controller-manager.kubeconfig'}",
        "--bind-address=127.0.0.1",
        "--port=0",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={work / 'controller-manager-certs'}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        # Fake nodes send no heartbeats: without this controller they would be tainted unreachable after 40 s.
        "--controllers=*,-nodelifecycle",
        "--profiling=false",
        # Each controller gets its own ServiceAccount client at start; the default 20 QPS makes that take ~4 s.
        "--kube-api-qps=200",
        "--kube-api-burst=400",
    ]


def scheduler_command(binary: Path, work: Path, ports: Ports) -> list[str]:
    """kube-scheduler: default profile, no leader election."""
    return [
        str(binary),
        f"--kubeconfig={work / 'scheduler.kubeconfig'}",
        "--bind-address=127.0.0.1",
        "--port=0",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={work / 'scheduler-certs'}",
        "--leader-elect=false",
        "--profiling=false",
    ]


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def exited(self) -> bool:
        return self.popen.poll() is not None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready_condition(ready: bool) -> dict[str, str]:
    now = _now()
    return {
        "type": "Ready",
        "status": "True" if ready else "False",
        "reason": "KubeletReady" if ready else "KubeletNotReady",
        "message": "pdfleet fake node" + (" is ready" if ready else " marked not ready"),
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }


def node_taints(user_taints: Sequence[Mapping[str, str]], ready: bool) -> list[dict[str, str]]:
    """Taints a node should carry: the caller's plus not-ready:NoSchedule when not Ready.

    The node lifecycle controller normally keeps that taint in step with the Ready condition; it is disabled here
    (fake nodes send no heartbeats), and the scheduler filters on taints, not on conditions.
    """
    taints = [dict(t) for t in user_taints if t.get("key") != NOT_READY_TAINT]
    if not ready:
        taints.append({"key": NOT_READY_TAINT, "effect": "NoSchedule"})
    return taints


def node_status(name: str, gpus: int, cpu: str, memory: str, ready: bool) -> dict[str, Any]:
    """Status a kubelet would report: capacity = allocatable (cpu, memory, pods, nvidia.com/gpu), Ready, 127.0.0.1."""
    resources = {"cpu": cpu, "memory": memory, "pods": "110", GPU_RESOURCE: str(gpus)}
    return {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [_ready_condition(ready)],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "nodeInfo": {
            "machineID": name,
            "systemUUID": name,
            "bootID": name,
            "kernelVersion": "fake",
            "osImage": "pdfleet fake node",
            "containerRuntimeVersion": "fake://0",
            "kubeletVersion": "v1.20.2",
            "kubeProxyVersion": "v1.20.2",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
    }


def _merge_patch(call: Callable[..., Any], *args: Any) -> Any:
    # The generated client defaults PATCH to json-patch; these bodies are merge patches.
    return call(*args, _content_type="application/merge-patch+json")


class LocalControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on 127.0.0.1 for tests and demos.

    Attributes after `start()`: `server` (https URL), `kubeconfig` (admin kubeconfig path, system:masters),
    `workdir` (certs, logs, etcd data), `startup_seconds`.
    """

    def __init__(self, startup_timeout: float = 90.0, binaries: Mapping[str, Path] | None = None) -> None:
        """Nothing starts here; `binaries` overrides `find_binaries()` (name -> path)."""
        self.startup_timeout = startup_timeout
        self._binaries = dict(binaries) if binaries is not None else None
        self._processes: list[_Process] = []
        self._client: client.ApiClient | None = None
        self.workdir: Path | None = None
        self.server = ""
        self.kubeconfig = Path()
        self.startup_seconds = 0.0

    # lifecycle ---------------------------------------------------------------------------------------------------

    def __enter__(self) -> LocalControlPlane:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> LocalControlPlane:
        """Start all four processes and wait until the API serves and controllers work; cleans up on failure."""
        binaries = self._binaries if self._binaries is not None else find_binaries()
        if self._processes:
            raise ControlPlaneError("control plane already started")
        began = time.monotonic()
        try:
            self._start(binaries, deadline=began + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        return self

    def _start(self, binaries: Mapping[str, Path], deadline: float) -> None:
        # tmpfs when available: etcd fsyncs on every write, which is slow on a shared disk.
        shm = Path("/dev/shm")
        parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        remove_abandoned_workdirs(parent)
        self.workdir = work = Path(tempfile.mkdtemp(prefix=_WORKDIR_PREFIX, dir=parent))
        (work / _OWNER_FILE).write_text(str(os.getpid()))
        pki = work / "pki"
        generate_pki(pki)
        ports = Ports(*free_ports(6))
        self.server = f"https://127.0.0.1:{ports.apiserver}"
        self.kubeconfig = work / "admin.kubeconfig"
        for user in ("admin", "controller-manager", "scheduler"):
            write_kubeconfig(work / f"{user}.kubeconfig", self.server, pki, user)
        admin_tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        admin_tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        # The components serve self-signed certs from --cert-dir; /healthz is always open to anonymous callers.
        component_tls = ssl.create_default_context()
        component_tls.check_hostname = False
        component_tls.verify_mode = ssl.CERT_NONE

        etcd = self._spawn("etcd", etcd_command(binaries["etcd"], work, ports))
        apiserver = self._spawn("kube-apiserver", apiserver_command(binaries["kube-apiserver"], work, ports))
        self._wait(etcd, "etcd /health", deadline, lambda: _http_ok(f"{ports.etcd_url}/health", None))
        # Controllers started before the RBAC bootstrap roles exist would only log denials, so wait for /readyz.
        self._wait(apiserver, "kube-apiserver /readyz", deadline, lambda: _http_ok(f"{self.server}/readyz", admin_tls))
        controller_manager = self._spawn(
            "kube-controller-manager", controller_manager_command(binaries["kube-controller-manager"], work, ports)
        )
        scheduler = self._spawn("kube-scheduler", scheduler_command(binaries["kube-scheduler"], work, ports))
        self._wait(
            scheduler,
            "kube-scheduler /healthz",
            deadline,
            lambda: _http_ok(f"https://127.0.0.1:{ports.scheduler}/healthz", component_tls),
        )
        self._wait(
            controller_manager,
            "kube-controller-manager /healthz",
            deadline,
            lambda: _http_ok(f"https://127.0.0.1:{ports.controller_manager}/healthz", component_tls),
        )
        self._wait(
            apiserver,
            "namespace default",
            deadline,
            lambda: _http_ok(f"{self.server}/api/v1/namespaces/default", admin_tls),
        )
        self._wait(
            controller_manager,
            "ServiceAccount default/default with its token",
            deadline,
            lambda: self._service_account_ready("default"),
        )

    def stop(self) -> None:
        """Terminate every started process (SIGTERM, then SIGKILL after 10 s) and remove the temp dir; idempotent."""
        if self._client is not None:
            self._client.close()
            self._client = None
        stop_processes([process.popen for process in reversed(self._processes)], grace_s=10, reap_s=10)
        self._processes.clear()
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _spawn(self, name: str, argv: Sequence[str]) -> _Process:
        assert self.workdir is not None
        log_path = self.workdir / f"{name}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                start_new_session=True,
                preexec_fn=die_with_parent_hook(),
            )
        process = _Process(name, popen, log_path)
        self._processes.append(process)
        return process

    def _wait(self, owner: _Process, what: str, deadline: float, check: Callable[[], bool]) -> None:
        """Poll `check` until true; fail fast if any process exits, else time out with `owner`'s log tail."""

        def all_alive_and_check() -> bool:
            for process in self._processes:
                if process.exited():
                    raise ControlPlaneError(
                        f"{process.name} exited with code {process.popen.returncode} while waiting for {what}; "
                        f"last lines of {process.log_path.name}:\n{process.log_tail()}"
                    )
            return check()

        try:
            wait_until(all_alive_and_check, deadline - time.monotonic(), what)
        except TimeoutError as error:
            raise ControlPlaneError(f"{error}; last lines of {owner.log_path.name}:\n{owner.log_tail()}") from None

    # Kubernetes helpers --------------------------------------------------------------------------------------------

    def api_client(self) -> client.ApiClient:
        """A new kubernetes.client.ApiClient authenticated as admin (system:masters); the caller closes it."""
        if not self._processes:
            raise ControlPlaneError("control plane not started")
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        configuration.proxy = None  # loopback only: a proxy from the environment must never carry this traffic
        return client.ApiClient(configuration)

    def _core(self) -> client.CoreV1Api:
        if self._client is None:
            self._client = self.api_client()
        return client.CoreV1Api(self._client)

    def _service_account_ready(self, namespace: str) -> bool:
        # 1.20's ServiceAccount admission rejects pods until the token controller has linked a token secret.
        try:
            account = self._core().read_namespaced_service_account("default", namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        return bool(account.secrets)

    def create_namespace(self, name: str, timeout: float = 30.0) -> None:
        """Create a namespace and wait until pods can be created in it (its default ServiceAccount has a token)."""
        self._core().create_namespace(client.V1Namespace.from_dict({"metadata": {"name": name}}))
        deadline = time.monotonic() + timeout
        controller_manager = next(p for p in self._processes if p.name == "kube-controller-manager")
        self._wait(
            controller_manager,
            f"ServiceAccount {name}/default with its token",
            deadline,
            lambda: self._service_account_ready(name),
        )

    def delete_namespace(self, name: str) -> None:
        """Delete a namespace without waiting, then its pods with grace 0, as no kubelet would confirm them.

        In that order: a terminating namespace admits no new pod, so no controller can replace one that would then
        wait forever for a kubelet, holding its node's GPUs from every later test.
        """
        core = self._core()
        try:
            core.delete_namespace(name)
            core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise

    def register_node(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        gpus: int = 0,
        cpu: str = "64",
        memory: str = "512Gi",
        ready: bool = True,
        taints: Sequence[Mapping[str, str]] | None = None,
    ) -> None:
        """Create (or update) a fake Node with `gpus` nvidia.com/gpu and a kubelet-like status for the scheduler.

        `taints` are Kubernetes taint dicts ({"key", "value", "effect"}); a not-ready node also gets
        node.kubernetes.io/not-ready:NoSchedule, as the node lifecycle controller would add.
        """
        core = self._core()
        node_labels = {
            HOSTNAME_LABEL: name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        try:
            core.create_node(client.V1Node.from_dict({"metadata": {"name": name, "labels": node_labels}}))
        except ApiException as error:
            if error.status != 409:
                raise
            _merge_patch(core.patch_node, name, {"metadata": {"labels": node_labels}})
        _merge_patch(core.patch_node_status, name, {"status": node_status(name, gpus, cpu, memory, ready)})
        # Admission (TaintNodesByCondition) taints every new node not-ready; set the taints the status implies.
        _merge_patch(core.patch_node, name, {"spec": {"taints": node_taints(taints or [], ready)}})

    def set_node_ready(self, name: str, ready: bool) -> None:
        """Flip a node's Ready condition and its not-ready NoSchedule taint together."""
        core = self._core()
        _merge_patch(core.patch_node_status, name, {"status": {"conditions": [_ready_condition(ready)]}})
        existing = core.api_client.sanitize_for_serialization(core.read_node(name).spec.taints or [])
        _merge_patch(core.patch_node, name, {"spec": {"taints": node_taints(existing, ready)}})

    def delete_node(self, name: str) -> None:
        """Delete a node; absent nodes are fine. Pods bound to it are left to the pod garbage collector."""
        try:
            self._core().delete_node(name)
        except ApiException as error:
            if error.status != 404:
                raise

    def standard_fleet_nodes(
        self,
        racks: Sequence[str] = ("rack-a", "rack-b"),
        nodes_per_rack: int = 2,
        gpus: int = 8,
        product: str = "NVIDIA-H100-80GB-HBM3",
        zone_of_rack: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Register `nodes_per_rack` GPU nodes per rack, named `<rack>-node-<i>`; return their names.

        Labels: rack, zone (from `zone_of_rack`, default `zone-1` for every rack), GPU product, hostname.
        """
        names = []
        for rack in racks:
            zone = (zone_of_rack or {}).get(rack, "zone-1")
            for index in range(nodes_per_rack):
                name = f"{rack}-node-{index}"
                self.register_node(name, {RACK_LABEL: rack, ZONE_LABEL: zone, GPU_PRODUCT_LABEL: product}, gpus=gpus)
                names.append(name)
        return names

    def resident_memory(self) -> dict[str, int]:
        """Resident set size in bytes of each running control-plane process, by name (Linux /proc)."""
        sizes = {}
        for process in self._processes:
            try:
                status = Path(f"/proc/{process.popen.pid}/status").read_text()
            except OSError:
                continue
            rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            sizes[process.name] = rss_kib * 1024
        return sizes


def _http_ok(url: str, tls: ssl.SSLContext | None) -> bool:
    # No proxy handler: a proxy from the environment must never see loopback health checks.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls))
    try:
        with opener.open(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
