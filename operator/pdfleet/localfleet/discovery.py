"""Prometheus target discovery from pod annotations -- test and demo infrastructure.

In a cluster Prometheus finds pods with kubernetes_sd. Debian's Prometheus is built without it, so this adapter plays
that part: it polls the apiserver's pods and rewrites the server's file_sd targets from the pods'
`prometheus.io/scrape|port|path` annotations, with the target labels of docs/autoscaling.md (namespace, pdd, pool,
rack, pod) for engines, and namespace, pdd, component=router, pod for routers. Static targets (the operator's own
metrics endpoint) ride along.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pdfleet.localfleet.prometheus import PrometheusServer, ScrapeTarget, pod_scrape_targets

log = logging.getLogger("pdfleet.discovery")

ROUTER_COMPONENT = "router"


def router_scrape_targets(pods: Sequence[Mapping[str, Any]]) -> list[ScrapeTarget]:
    """Targets for annotated, running router pods, labelled namespace/pdd/component/pod."""
    targets = []
    for pod in pods:
        meta = pod.get("metadata", {})
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        ip, port = (pod.get("status") or {}).get("podIP"), annotations.get("prometheus.io/port")
        if (
            annotations.get("prometheus.io/scrape") != "true"
            or not ip
            or not port
            or labels.get("app.kubernetes.io/component") != ROUTER_COMPONENT
            or meta.get("deletionTimestamp")
        ):
            continue
        target_labels = {
            "namespace": meta.get("namespace", ""),
            "pdd": labels.get("app.kubernetes.io/instance", ""),
            "component": ROUTER_COMPONENT,
            "pod": meta.get("name", ""),
        }
        if path := annotations.get("prometheus.io/path"):
            target_labels["__metrics_path__"] = path
        targets.append(ScrapeTarget(f"{ip}:{port}", target_labels))
    return targets


def annotated_pod_targets(pods: Sequence[Mapping[str, Any]]) -> list[ScrapeTarget]:
    """Every scrape target the annotated pods ask for (engines, then routers), in a stable order.

    Terminating pods are left out, as kubernetes_sd users usually drop them: their series would only go stale.
    """
    live = [pod for pod in pods if not pod.get("metadata", {}).get("deletionTimestamp")]
    engines = sorted(pod_scrape_targets(live), key=lambda t: t.address)
    return engines + sorted(router_scrape_targets(live), key=lambda t: t.address)


class PodTargetDiscovery:
    """Polls the apiserver's pods every `interval_s` and keeps `server`'s file_sd targets in step, until `stop()`.

    `static_targets` is called on every poll, so a target that moves (a restarted operator's port) follows.
    """

    def __init__(
        self,
        api_client: Any,
        server: PrometheusServer,
        interval_s: float = 1.0,
        static_targets: Callable[[], Sequence[ScrapeTarget]] = lambda: (),
    ) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.server = server
        self.interval_s = interval_s
        self.static_targets = static_targets
        self.targets: list[ScrapeTarget] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="prometheus-discovery", daemon=True)

    def start(self) -> PodTargetDiscovery:
        """Write the targets once, then keep them in sync from a background thread."""
        self.sync()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the sync thread."""
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> PodTargetDiscovery:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def sync(self) -> None:
        """One discovery round: list pods, compute targets, rewrite the file when they changed."""
        reply = self.core.list_pod_for_all_namespaces(_preload_content=False)
        targets = annotated_pod_targets(json.loads(reply.data)["items"]) + list(self.static_targets())
        if targets != self.targets:
            self.server.set_targets(targets)
            self.targets = targets

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception:
                log.exception("pod target discovery failed")
