"""`LocalFleet`: the whole pdfleet loop on one machine -- test and demo infrastructure, never production code.

One context manager starts, in order: a real control plane (`LocalControlPlane`), GPU Nodes on N racks labelled as the
operator expects, the PDDeployment CRD, the operator process, Prometheus with pod-annotation discovery, and the local
pod runner that plays the kubelet (engine pods become emulator processes, or real vLLM with `engine="vllm"`, the router
pod a router process, each on its own loopback address, from a block no other local fleet holds). Leaving the block --
normally, on an exception or on Ctrl-C -- stops every process it started.

The nodes carry `nvidia.com/gpu.product=NVIDIA-L4` by default, and the pod runner hands each engine its node's GPU, so
emulated engines run the L4 timing model: Llama-3.1-8B prefills ~300 ms per 1K-token prompt and decodes ~73 ms per
token, slow enough that a few requests per second queue for real while the token stream stays cheap on 2 CPU cores.

    with LocalFleet(racks=("rack-a", "rack-b")) as fleet:
        fleet.apply(pdd)
        fleet.wait_serving("default", "demo")
        url = fleet.router_url("default", "demo")
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.localfleet.controlplane import RACK_LABEL, LocalControlPlane, wait_until
from pdfleet.localfleet.discovery import PodTargetDiscovery
from pdfleet.localfleet.operator_process import OperatorProcess, install_crd
from pdfleet.localfleet.podrunner import LocalPodRunner
from pdfleet.localfleet.processes import interrupts_deferred
from pdfleet.localfleet.prometheus import PrometheusServer, ScrapeTarget, start_prometheus
from pdfleet.render.fleet_view import pod_url
from pdfleet.render.router_access import ADMIN_TOKEN_KEY, admin_headers, admin_secret_name

log = logging.getLogger("pdfleet.fleet")
T = TypeVar("T")

DEFAULT_GPU_PRODUCT = "NVIDIA-L4"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
POOL_LABEL = "pdfleet.dev/pool"
CELL_RACK_LABEL = "pdfleet.dev/rack"
OPERATOR_ENV = {"PDFLEET_RESYNC_SECONDS": "5"}


def is_ready(pod: Mapping[str, Any]) -> bool:
    """A pod is Ready (condition True) and not being deleted."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def ready_by_rack(pods: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Ready engine pods counted per pool and rack: {"prefill": {"rack-a": 2}, "decode": {...}}."""
    counts: dict[str, dict[str, int]] = {"prefill": {}, "decode": {}}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        pool = labels.get(POOL_LABEL)
        if pool in counts and is_ready(pod):
            rack = labels.get(CELL_RACK_LABEL, "")
            counts[pool][rack] = counts[pool].get(rack, 0) + 1
    return counts


# A kubelet refreshes mounted ConfigMaps on its sync period plus a cache TTL: up to about a minute. The local fleet
# does the same, so routers see fleet changes as soon as on a real cluster: by the operator's push, not the file.
KUBELET_CONFIG_SYNC_S = 60.0


class LocalFleet:
    """Control plane, GPU nodes, CRD, operator, Prometheus (+ discovery) and pod runner, started by `start()`.

    After `start()`: `control_plane`, `api` (admin ApiClient), `core`, `custom`, `operator`, `prometheus`, `runner`.
    """

    def __init__(
        self,
        racks: Sequence[str] = ("rack-a", "rack-b"),
        nodes_per_rack: int = 2,
        gpus_per_node: int = 4,
        gpu_product: str = DEFAULT_GPU_PRODUCT,
        scrape_interval_s: float = 1.0,
        operator_env: Mapping[str, str] | None = None,
        runner_env: Mapping[str, str] | None = None,
        config_sync_s: float = KUBELET_CONFIG_SYNC_S,
        engine: str = "emulator",
    ) -> None:
        """Nothing starts here. `operator_env` and `runner_env` add to the operator's and every pod's environment;
        `config_sync_s` is how late a ConfigMap change reaches a running pod's files; `engine` runs engine pods as
        the emulator or as real vLLM (LocalPodRunner)."""
        self.racks = tuple(racks)
        self.nodes_per_rack = nodes_per_rack
        self.gpus_per_node = gpus_per_node
        self.gpu_product = gpu_product
        self.scrape_interval_s = scrape_interval_s
        self.operator_env = {**OPERATOR_ENV, **(operator_env or {})}
        self.runner_env = dict(runner_env or {})
        self.config_sync_s = config_sync_s
        self.engine = engine
        self.control_plane = LocalControlPlane()
        self.node_names: list[str] = []
        self.api: Any = None
        self.core: Any = None
        self.custom: Any = None
        self.operator: OperatorProcess | None = None
        self.prometheus: PrometheusServer | None = None
        self.discovery: PodTargetDiscovery | None = None
        self.runner: LocalPodRunner | None = None
        self._stack = contextlib.ExitStack()
        self._namespaces: set[str] = set()

    # lifecycle ---------------------------------------------------------------------------------------------------

    def __enter__(self) -> LocalFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> LocalFleet:
        """Start everything in order; on any failure (or Ctrl-C) stop what already runs and re-raise."""
        from kubernetes import client

        try:
            began = time.monotonic()
            self._stack.enter_context(self.control_plane)
            self.api = self.control_plane.api_client()
            self._stack.callback(self.api.close)
            self.core, self.custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
            for rack in self.racks:
                self.register_rack(rack)
            install_crd(self.api)
            self._stack.callback(self._stop_operator)
            self.operator = OperatorProcess(self.control_plane.kubeconfig, extra_env=self.operator_env).start()
            self.prometheus = self._stack.enter_context(start_prometheus(scrape_interval=self.scrape_interval_s))
            self.discovery = self._stack.enter_context(
                PodTargetDiscovery(
                    self.api, self.prometheus, interval_s=self.scrape_interval_s, static_targets=self._operator_target
                )
            )
            self.runner = self._stack.enter_context(
                LocalPodRunner(
                    self.api, extra_env=self.runner_env, config_sync_s=self.config_sync_s, engine=self.engine
                )
            )
            log.info("local fleet up in %.1f s (Prometheus %s)", time.monotonic() - began, self.prometheus.url)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process this fleet started (pods, discovery, Prometheus, operator, control plane); idempotent."""
        with interrupts_deferred():
            self._stack.close()

    def _operator_target(self) -> list[ScrapeTarget]:
        operator = self.operator
        if operator is None or operator.popen is None:
            return []
        return [ScrapeTarget(f"127.0.0.1:{operator.metrics_port}", {"component": "operator"})]

    def _stop_operator(self) -> None:
        if self.operator is not None:
            self.operator.stop()

    def restart_operator(self) -> None:
        """Stop the operator process and start a fresh one (new ports; Prometheus discovery follows)."""
        self._stop_operator()
        self.operator = OperatorProcess(self.control_plane.kubeconfig, extra_env=self.operator_env).start()

    # PDDeployments -------------------------------------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        """Create `namespace` (ready for pods) unless it exists."""
        from kubernetes.client.exceptions import ApiException

        if namespace in self._namespaces:
            return
        try:
            self.core.read_namespace(namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            self.control_plane.create_namespace(namespace)
        self._namespaces.add(namespace)

    def apply(self, pdd: Mapping[str, Any]) -> dict[str, Any]:
        """Create the PDDeployment, or merge its spec into the existing one; returns the stored object."""
        from kubernetes.client.exceptions import ApiException

        namespace, name = pdd["metadata"].get("namespace", "default"), pdd["metadata"]["name"]
        self.ensure_namespace(namespace)
        body = {**pdd, "apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "PDDeployment"}
        try:
            return self.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)
        except ApiException as error:
            if error.status != 409:
                raise
        return self.patch(namespace, name, {"spec": pdd["spec"]})

    def patch(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch a PDDeployment (e.g. {"spec": {"prefill": {"replicas": 3}}})."""
        return self.custom.patch_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name, patch)

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The PDDeployment as stored (spec and status)."""
        return self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)

    def delete(self, namespace: str, name: str) -> None:
        """Delete a PDDeployment (its children follow by owner reference); absent is fine."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
        except ApiException as error:
            if error.status != 404:
                raise

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Events about the PDDeployment, oldest first."""
        selector = f"involvedObject.name={name},involvedObject.kind=PDDeployment"
        items = self.api.sanitize_for_serialization(
            self.core.list_namespaced_event(namespace, field_selector=selector).items
        )
        return sorted(items, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")

    # pods and endpoints --------------------------------------------------------------------------------------------

    def pods(self, namespace: str, name: str, component: str | None = None) -> list[dict[str, Any]]:
        """The fleet's pods (API JSON), optionally of one component (prefill, decode, router), sorted by name."""
        selector = f"{INSTANCE_LABEL}={name}" + (f",{COMPONENT_LABEL}={component}" if component else "")
        items = self.api.sanitize_for_serialization(
            self.core.list_namespaced_pod(namespace, label_selector=selector).items
        )
        return sorted(items, key=lambda p: p["metadata"]["name"])

    def ready_by_rack(self, namespace: str, name: str) -> dict[str, dict[str, int]]:
        """Ready engine pods per pool and rack."""
        return ready_by_rack(self.pods(namespace, name))

    def _router_pod(self, namespace: str, name: str) -> dict[str, Any]:
        ready = [p for p in self.pods(namespace, name, "router") if is_ready(p)]
        if not ready:
            raise LookupError(f"no Ready router pod for {namespace}/{name}")
        return ready[0]

    def router_url(self, namespace: str, name: str) -> str:
        """Data-port URL of a Ready router pod of the PDDeployment (its pod IP and spec.router.port)."""
        port = self.get(namespace, name)["spec"].get("router", {}).get("port", 8080)
        return pod_url(self._router_pod(namespace, name)["status"]["podIP"], port)

    def router_admin_url(self, namespace: str, name: str) -> str:
        """Admin-port URL of a Ready router pod (spec.router.adminPort)."""
        port = self.get(namespace, name)["spec"].get("router", {}).get("adminPort", 8081)
        return pod_url(self._router_pod(namespace, name)["status"]["podIP"], port)

    def router_admin_headers(self, namespace: str, name: str) -> dict[str, str]:
        """The Authorization header of the router admin API: the token from the operator's Secret."""
        secret = self.core.read_namespaced_secret(admin_secret_name(name), namespace)
        return admin_headers(base64.b64decode(secret.data[ADMIN_TOKEN_KEY]).decode())

    def router_endpoints(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The router's view of its engines (`GET /admin/endpoints`)."""
        url = self.router_admin_url(namespace, name) + "/admin/endpoints"
        reply = httpx.get(url, headers=self.router_admin_headers(namespace, name), timeout=5.0, trust_env=False)
        reply.raise_for_status()
        return reply.json()["endpoints"]

    def kill_pod_process(self, namespace: str, pod: str) -> bool:
        """Crash the pod's process (SIGKILL); the runner restarts it, as the kubelet would. False if none runs."""
        assert self.runner is not None
        return self.runner.kill_pod_process(namespace, pod)

    def kill_pod(self, namespace: str, pod: str) -> None:
        """A pod dies with its node: its process is SIGKILLed, the object force-deleted; its controller recreates it."""
        from kubernetes.client.exceptions import ApiException

        self.kill_pod_process(namespace, pod)
        try:
            self.core.delete_namespaced_pod(pod, namespace, grace_period_seconds=0)
        except ApiException as error:
            if error.status != 404:
                raise

    def delete_node(self, node: str) -> None:
        """Drain a node (delete its pods gracefully, as `kubectl drain`) and delete it, so its pods go elsewhere."""
        from kubernetes.client.exceptions import ApiException

        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        self.control_plane.delete_node(node)
        for pod in pods:
            with contextlib.suppress(ApiException):  # already gone
                self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        self.node_names = [n for n in self.node_names if n != node]

    def register_rack(self, rack: str) -> list[str]:
        """Register (or re-register) the GPU nodes of `rack`, `<rack>-node-<i>`, zone `zone-<n>` by rack order."""
        zone = f"zone-{self.racks.index(rack) + 1}" if rack in self.racks else "zone-1"
        names = self.control_plane.standard_fleet_nodes(
            racks=[rack],
            nodes_per_rack=self.nodes_per_rack,
            gpus=self.gpus_per_node,
            product=self.gpu_product,
            zone_of_rack={rack: zone},
        )
        self.node_names += [n for n in names if n not in self.node_names]
        return names

    def nodes_of_rack(self, rack: str) -> list[str]:
        """Names of the registered nodes of `rack`."""
        return [n.metadata.name for n in self.core.list_node(label_selector=f"{RACK_LABEL}={rack}").items]

    # Prometheus and waiting ----------------------------------------------------------------------------------------

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant PromQL query against the fleet's Prometheus; the result vector (empty when no data)."""
        assert self.prometheus is not None
        reply = httpx.get(
            f"{self.prometheus.url}/api/v1/query", params={"query": promql}, timeout=10.0, trust_env=False
        )
        reply.raise_for_status()
        return reply.json()["data"]["result"]

    @staticmethod
    def wait_for(check: Callable[[], T], timeout: float, what: str, interval: float = 0.5) -> T:
        """Poll `check` until truthy and return its value; TimeoutError naming `what` after `timeout` s.

        Exceptions from `check` (an API object not there yet) count as "not yet".
        """

        def attempt() -> T | None:
            try:
                return check()
            except (LookupError, OSError, httpx.HTTPError) as error:
                log.debug("waiting for %s: %s", what, error)
                return None

        return wait_until(attempt, timeout, what, interval=interval)

    def serving(self, namespace: str, name: str) -> bool:
        """Every replica the spec asks for is Ready and listed healthy (not draining) by the router."""
        spec = self.get(namespace, name)["spec"]
        wanted = {pool: spec[pool]["replicas"] for pool in ("prefill", "decode")}
        endpoints = self.router_endpoints(namespace, name)
        healthy = {
            pool: sum(1 for e in endpoints if e["pool"] == pool and e["healthy"] and not e["draining"])
            for pool in wanted
        }
        counts = self.ready_by_rack(namespace, name)
        ready = {pool: sum(counts[pool].values()) for pool in wanted}
        return healthy == wanted and ready == wanted

    def wait_serving(self, namespace: str, name: str, timeout: float = 90.0) -> None:
        """Wait until `serving`; the TimeoutError carries the pods' state and the operator log tail."""
        try:
            self.wait_for(lambda: self.serving(namespace, name), timeout, f"{namespace}/{name} serving")
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.describe(namespace, name)}") from None

    def describe(self, namespace: str, name: str) -> str:
        """A few lines for failure messages: pod phases and readiness, status summary, operator log tail."""
        lines = []
        with contextlib.suppress(Exception):
            status = self.get(namespace, name).get("status", {})
            lines.append(f"status: prefill {status.get('prefill')} decode {status.get('decode')}")
            lines.append(f"conditions: {status.get('conditions')}")
        with contextlib.suppress(Exception):
            for pod in self.pods(namespace, name):
                st = pod.get("status") or {}
                lines.append(
                    f"pod {pod['metadata']['name']} node={pod['spec'].get('nodeName')} "
                    f"phase={st.get('phase')} ip={st.get('podIP')} ready={is_ready(pod)}"
                )
        if self.operator is not None:
            lines.append("operator log tail:\n" + self.operator.log_tail(20))
        return "\n".join(lines)
