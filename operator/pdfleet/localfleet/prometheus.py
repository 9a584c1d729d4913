"""A real Prometheus server for tests and the demo: the `prometheus` binary run directly on 127.0.0.1.

Targets come from a file_sd JSON file the caller rewrites (`set_targets`; `pod_scrape_targets` turns engine pod
objects into targets by the label convention of docs/autoscaling.md), or from kubernetes_sd against a given apiserver.
Debian's `prometheus` package is built without kubernetes_sd: with it, poll the apiserver's pods and call
`set_targets(pod_scrape_targets(pods))`; kubernetes_sd needs an upstream binary (PDFLEET_PROMETHEUS_BIN).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import httpx
import yaml

from pdfleet.localfleet.controlplane import die_with_parent_hook
from pdfleet.localfleet.processes import free_port, stop_process

DEFAULT_BINARY = "/usr/bin/prometheus"
ENGINE_JOB = "pdfleet-engines"


@dataclass(frozen=True)
class ScrapeTarget:
    """One /metrics endpoint and the target labels Prometheus gives its series (pdd, pool, pod, rack, namespace)."""

    address: str  # host:port
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class KubernetesSD:
    """Discover engine pods from a Kubernetes apiserver (role: pod) and relabel them by the pdfleet convention."""

    api_server: str
    namespaces: tuple[str, ...] = ()
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = True


def prometheus_binary() -> str | None:
    """Path of the prometheus binary (env PDFLEET_PROMETHEUS_BIN, /usr/bin/prometheus, PATH), or None."""
    candidates = [os.environ.get("PDFLEET_PROMETHEUS_BIN"), DEFAULT_BINARY, shutil.which("prometheus")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def engine_pod_relabel_configs() -> list[dict]:
    """relabel_configs that keep annotated pdfleet engine pods and map pod labels to pdd/pool/rack/namespace/pod."""
    meta = "__meta_kubernetes_pod_"
    return [
        {"source_labels": [meta + "annotation_prometheus_io_scrape"], "regex": "true", "action": "keep"},
        {"source_labels": [meta + "label_pdfleet_dev_pool"], "regex": "prefill|decode", "action": "keep"},
        {
            "source_labels": ["__address__", meta + "annotation_prometheus_io_port"],
            "regex": r"([^:]+)(?::\d+)?;(\d+)",
            "replacement": "$1:$2",
            "target_label": "__address__",
        },
        {
            "source_labels": [meta + "annotation_prometheus_io_path"],
            "regex": "(.+)",
            "target_label": "__metrics_path__",
        },
        {"source_labels": [meta + "label_app_kubernetes_io_instance"], "target_label": "pdd"},
        {"source_labels": [meta + "label_pdfleet_dev_pool"], "target_label": "pool"},
        {"source_labels": [meta + "label_pdfleet_dev_rack"], "target_label": "rack"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": [meta + "name"], "target_label": "pod"},
    ]


def pod_scrape_targets(pods: Sequence[Mapping[str, Any]]) -> list[ScrapeTarget]:
    """file_sd targets for engine pods (Kubernetes Pod JSON): what the kubernetes_sd relabelling would produce.

    Keeps pods annotated prometheus.io/scrape=true with a pdfleet.dev/pool of prefill/decode and a pod IP.
    """
    targets: list[ScrapeTarget] = []
    for pod in pods:
        meta = pod.get("metadata", {})
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        ip = (pod.get("status") or {}).get("podIP")
        port = annotations.get("prometheus.io/port")
        pool = labels.get("pdfleet.dev/pool")
        if annotations.get("prometheus.io/scrape") != "true" or pool not in ("prefill", "decode") or not ip or not port:
            continue
        target_labels = {
            "pdd": labels.get("app.kubernetes.io/instance", ""),
            "pool": pool,
            "rack": labels.get("pdfleet.dev/rack", ""),
            "namespace": meta.get("namespace", ""),
            "pod": meta.get("name", ""),
        }
        path = annotations.get("prometheus.io/path")
        if path:
            target_labels["__metrics_path__"] = path
        targets.append(ScrapeTarget(f"{ip}:{port}", target_labels))
    return targets


def render_config(scrape_interval: float, file_sd_path: Path, kubernetes_sd: KubernetesSD | None) -> dict:
    """prometheus.yml as a dict: an engine job fed by file_sd, plus one fed by kubernetes_sd when given."""
    interval = f"{max(scrape_interval, 0.1):g}s"
    jobs: list[dict] = [
        {
            "job_name": ENGINE_JOB,
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "file_sd_configs": [{"files": [str(file_sd_path)], "refresh_interval": "1s"}],
        }
    ]
    if kubernetes_sd is not None:
        sd: dict = {"role": "pod", "api_server": kubernetes_sd.api_server}
        if kubernetes_sd.namespaces:
            sd["namespaces"] = {"names": list(kubernetes_sd.namespaces)}
        tls: dict = {"insecure_skip_verify": kubernetes_sd.insecure_skip_verify}
        if kubernetes_sd.ca_file:
            tls["ca_file"] = kubernetes_sd.ca_file
        sd["tls_config"] = tls
        if kubernetes_sd.bearer_token_file:
            sd["authorization"] = {"credentials_file": kubernetes_sd.bearer_token_file}
        jobs.append(
            {
                "job_name": ENGINE_JOB + "-kubernetes",
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "kubernetes_sd_configs": [sd],
                "relabel_configs": engine_pod_relabel_configs(),
            }
        )
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval}, "scrape_configs": jobs}


def write_file_sd(path: Path, targets: Sequence[ScrapeTarget]) -> None:
    """Write a file_sd target file, renamed into place so Prometheus never reads it half-written."""
    groups = [{"targets": [t.address], "labels": dict(t.labels)} for t in targets]
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(groups, indent=1))
    os.replace(tmp, path)


class PrometheusServer:
    """A running Prometheus; `url` is its base URL. Create with `start_prometheus`."""

    def __init__(self, process: subprocess.Popen, port: int, workdir: Path, file_sd_path: Path, log_path: Path):
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.workdir = workdir
        self.file_sd_path = file_sd_path
        self.log_path = log_path

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Replace the file_sd targets; Prometheus picks the change up within about a second."""
        write_file_sd(self.file_sd_path, targets)

    def active_targets(self) -> list[dict]:
        """The /api/v1/targets active targets (labels, health, lastError)."""
        response = httpx.get(f"{self.url}/api/v1/targets", params={"state": "active"}, timeout=5.0)
        response.raise_for_status()
        return response.json()["data"]["activeTargets"]

    def wait_for_healthy_targets(self, count: int, timeout: float = 20.0) -> list[dict]:
        """Wait until exactly `count` active targets have been scraped successfully; raise TimeoutError if not."""
        deadline = time.monotonic() + timeout
        targets: list[dict] = []
        while time.monotonic() < deadline:
            targets = self.active_targets()
            if len(targets) == count and all(t.get("health") == "up" for t in targets):
                return targets
            time.sleep(0.2)
        raise TimeoutError(f"expected {count} healthy targets within {timeout:g}s, have {targets}")

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's log, for failure messages."""
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-chars:]
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `timeout`)."""
        stop_process(self.process, grace_s=timeout, reap_s=timeout)


def _wait_ready(server: PrometheusServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {server.process.returncode}:\n{server.log_tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{server.url}/-/ready", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"prometheus not ready within {timeout:g}s:\n{server.log_tail()}")


@contextlib.contextmanager
def start_prometheus(
    targets: Sequence[ScrapeTarget] = (),
    scrape_interval: float = 1.0,
    kubernetes_sd: KubernetesSD | None = None,
    binary: str | None = None,
    ready_timeout: float = 30.0,
) -> Iterator[PrometheusServer]:
    """Run Prometheus on 127.0.0.1 (free port, temporary data dir) until the block ends; yields the server."""
    path = binary or prometheus_binary()
    if path is None:
        raise FileNotFoundError(
            "prometheus binary not found: apt-get install prometheus, or set PDFLEET_PROMETHEUS_BIN"
        )
    workdir = Path(tempfile.mkdtemp(prefix="pdfleet-prometheus-"))
    file_sd_path = workdir / "targets.json"
    config_path = workdir / "prometheus.yml"
    log_path = workdir / "prometheus.log"
    config_path.write_text(yaml.safe_dump(render_config(scrape_interval, file_sd_path, kubernetes_sd)))
    write_file_sd(file_sd_path, targets)
    port = free_port()
    command = [
        path,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    server: PrometheusServer | None = None
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent_hook(),
            )
        server = PrometheusServer(process, port, workdir, file_sd_path, log_path)
        _wait_ready(server, ready_timeout)
        yield server
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
