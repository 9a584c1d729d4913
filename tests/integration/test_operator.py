"""The operator against a real kube-apiserver, controller-manager and scheduler.

The test plays the kubelet where it must (marking bound pods Running/Ready with an IP), since no containers run here.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any, Callable

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pdfleet import API_GROUP, API_VERSION, PLURAL, POOLS
from pdfleet.cluster.kube import KubeClient
from pdfleet.localfleet.controlplane import RACK_LABEL, LocalControlPlane, cache_bin_dir, wait_until
from pdfleet.localfleet.operator_process import install_crd
from pdfleet.testing import builders


def fleet_spec(prefill: int = 2, decode: int = 2, **overrides: Any) -> dict[str, Any]:
    return builders.fleet_spec(
        prefill,
        decode,
        served_name="llama-8b",
        gpu_product=builders.H100,
        kvTransfer={"connector": "nixl"},
        **overrides,
    )


class Fleet:
    """Handles on one PDDeployment and its children in one namespace."""

    def __init__(self, kube: Any, namespace: str, name: str):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.custom = client.CustomObjectsApi(kube)
        self.apps = client.AppsV1Api(kube)
        self.core = client.CoreV1Api(kube)
        self.generic = KubeClient(kube)  # PDBs: the 1.20 test cluster serves policy/v1beta1 only
        self.generic.discover_versions()

    def create(self, spec: dict[str, Any]) -> None:
        body = builders.pdd_body(self.name, spec)
        self.custom.create_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace, PLURAL, body)

    def get(self) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(API_GROUP, API_VERSION, self.namespace, PLURAL, self.name)

    def patch_spec(self, spec_patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, self.namespace, PLURAL, self.name, {"spec": spec_patch}
        )

    def condition(self, type_: str) -> dict[str, Any] | None:
        conditions = (self.get().get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == type_), None)

    def selector(self, **labels: str) -> str:
        return ",".join([f"app.kubernetes.io/instance={self.name}", *(f"{k}={v}" for k, v in labels.items())])

    def statefulsets(self, pool: str | None = None) -> list[Any]:
        extra = {"pdfleet.dev/pool": pool} if pool else {}
        return self.apps.list_namespaced_stateful_set(self.namespace, label_selector=self.selector(**extra)).items

    def pods(self, **labels: str) -> list[Any]:
        return self.core.list_namespaced_pod(self.namespace, label_selector=self.selector(**labels)).items

    def play_kubelet(self) -> int:
        """Mark every bound, not-yet-ready pod of this fleet Running and Ready with a loopback IP; returns how many."""
        marked = 0
        for index, pod in enumerate(sorted(self.pods(), key=lambda p: p.metadata.name)):
            ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
            if not pod.spec.node_name or ready:
                continue
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.core.patch_namespaced_pod_status(
                pod.metadata.name,
                self.namespace,
                {
                    "status": {
                        "phase": "Running",
                        "podIP": f"127.0.1.{index + 1}",
                        "hostIP": "127.0.0.1",
                        "conditions": [
                            {"type": t, "status": "True", "lastTransitionTime": now}
                            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
                        ],
                    }
                },
            )
            marked += 1
        return marked

    def fleet_view(self) -> dict[str, Any]:
        cms = self.core.list_namespaced_config_map(self.namespace, label_selector=self.selector()).items
        return json.loads(next(cm for cm in cms if "fleet.json" in (cm.data or {})).data["fleet.json"])


def eventually(check: Callable[[], Any], what: str, timeout: float = 45.0) -> Any:
    return wait_until(check, timeout, what)


def kubectl(control_plane: LocalControlPlane, *args: str) -> subprocess.CompletedProcess:
    """Run the kubectl binary against the test control plane."""
    command = [str(cache_bin_dir() / "kubectl"), "--kubeconfig", str(control_plane.kubeconfig), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


@pytest.fixture
def fleet(pdfleet_operator: Any, kube: Any, namespace: str) -> Fleet:
    return Fleet(kube, namespace, "llama")


def test_apply_renders_rack_cells_that_the_scheduler_places_on_their_racks(
    fleet: Fleet, control_plane: LocalControlPlane
):
    fleet.create(fleet_spec())
    eventually(lambda: len(fleet.statefulsets()) == 4, "a StatefulSet per (pool, rack) cell")
    cells = {
        (s.metadata.labels["pdfleet.dev/pool"], s.metadata.labels["pdfleet.dev/rack"]): s.spec.replicas
        for s in fleet.statefulsets()
    }
    assert cells == {
        ("prefill", "rack-a"): 1,
        ("prefill", "rack-b"): 1,
        ("decode", "rack-a"): 1,
        ("decode", "rack-b"): 1,
    }

    def pdb_components() -> list[str]:
        pdbs = fleet.generic.list("PodDisruptionBudget", fleet.namespace, fleet.selector())
        return sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pdbs)

    # the router's PDB is applied last in a reconcile, after the cells
    eventually(
        lambda: pdb_components() == ["decode", "prefill", "router"], "PodDisruptionBudgets of both pools and the router"
    )
    eventually(
        lambda: fleet.apps.list_namespaced_deployment(fleet.namespace, label_selector=fleet.selector()).items,
        "the router Deployment",
    )
    services = eventually(
        lambda: fleet.core.list_namespaced_service(fleet.namespace, label_selector=fleet.selector()).items, "Services"
    )
    assert any(s.spec.cluster_ip == "None" for s in services), "headless Services for stable pod names"

    # Real scheduling: every engine pod on a node of its cell's rack, with its GPU limit.
    def placed() -> list[Any]:
        pods = [p for p in fleet.pods() if p.metadata.labels.get("pdfleet.dev/pool") in POOLS]
        return pods if len(pods) == 4 and all(p.spec.node_name for p in pods) else []

    for pod in eventually(placed, "4 engine pods bound to nodes"):
        node = fleet.core.read_node(pod.spec.node_name)
        assert node.metadata.labels[RACK_LABEL] == pod.metadata.labels["pdfleet.dev/rack"]
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
        args = " ".join(pod.spec.containers[0].command + pod.spec.containers[0].args)
        role = "kv_producer" if pod.metadata.labels["pdfleet.dev/pool"] == "prefill" else "kv_consumer"
        assert role in args

    # Ready pods become router endpoints with their rack; status and printer columns follow.
    def all_ready() -> bool:
        fleet.play_kubelet()
        return (fleet.condition("Ready") or {}).get("status") == "True"

    eventually(all_ready, "Ready condition True")
    view = fleet.fleet_view()
    assert sorted((e["pool"], e["rack"]) for e in view["endpoints"]) == [
        ("decode", "rack-a"),
        ("decode", "rack-b"),
        ("prefill", "rack-a"),
        ("prefill", "rack-b"),
    ]
    status = fleet.get()["status"]
    assert status["prefill"]["summary"] == "2/2" and status["decode"]["summary"] == "2/2"
    assert status["observedGeneration"] == fleet.get()["metadata"]["generation"]
    table = kubectl(control_plane, "get", "pdd", "-n", fleet.namespace)
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PREFILL", "DECODE", "READY", "REASON", "SLA"], table.stdout
    assert row.split()[:6] == ["llama", "2/2", "2/2", "True", "FleetReady", "NotMeasured"], table.stdout
    wide = kubectl(control_plane, "get", "pdd", "-n", fleet.namespace, "-o", "wide")
    header, row = wide.stdout.splitlines()[:2]
    assert header.split()[-2:] == ["MODEL", "ROUTER"], wide.stdout
    assert row.split()[-2:] == ["llama-8b", f"http://llama-router.{fleet.namespace}.svc:8080"], wide.stdout
    explained = kubectl(control_plane, "explain", "pdd.status.decode")
    assert explained.returncode == 0 and "selector" in explained.stdout and "readyReplicas" in explained.stdout, (
        explained.stdout + explained.stderr
    )


def _steady(fleet: Fleet, prefill: int = 2, decode: int = 2) -> None:
    fleet.create(fleet_spec(prefill, decode))

    def ready() -> bool:
        fleet.play_kubelet()
        return (fleet.condition("Ready") or {}).get("status") == "True"

    eventually(ready, "fleet Ready")


def test_scaling_prefill_changes_only_prefill_cells(fleet: Fleet):
    _steady(fleet)
    decode_versions = {s.metadata.name: s.metadata.resource_version for s in fleet.statefulsets("decode")}
    fleet.patch_spec({"prefill": {"replicas": 4}})
    eventually(lambda: sum(s.spec.replicas for s in fleet.statefulsets("prefill")) == 4, "prefill scaled to 4")
    time.sleep(2)  # give a wrong write to decode the chance to happen
    assert {s.metadata.name: s.metadata.resource_version for s in fleet.statefulsets("decode")} == decode_versions


def test_noop_reconcile_makes_zero_api_writes(fleet: Fleet, pdfleet_operator: Any):
    _steady(fleet)
    time.sleep(3)  # let the status settle
    # Other tests' fleets may still be autoscaled or torn down: count this fleet's reconcile writes only.
    mine = f'pdfleet_operator_reconcile_writes_total{{namespace="{fleet.namespace}",pdd="{fleet.name}"}}'
    writes = pdfleet_operator.metric_sum(mine)
    reconciles = pdfleet_operator.metric_sum("pdfleet_operator_reconciles_total")
    # Touch a managed pod: an event that wakes the reconcile without changing anything it renders.
    pod = fleet.pods(**{"pdfleet.dev/pool": "decode"})[0]
    fleet.core.patch_namespaced_pod(pod.metadata.name, fleet.namespace, {"metadata": {"labels": {"touched": "yes"}}})
    eventually(lambda: pdfleet_operator.metric_sum("pdfleet_operator_reconciles_total") > reconciles, "a reconcile")
    time.sleep(1)
    assert pdfleet_operator.metric_sum(mine) == writes


def test_invalid_update_is_reported_and_changes_nothing(fleet: Fleet):
    _steady(fleet)
    versions = {s.metadata.name: s.metadata.resource_version for s in fleet.statefulsets()}
    # The CRD schema rejects what it can express ...
    with pytest.raises(ApiException) as rejected:
        fleet.patch_spec({"engine": {"kind": "tgi"}})
    assert rejected.value.status == 422 and "kind" in rejected.value.body
    # ... and the operator rejects cross-field mistakes the schema cannot express, in status and an Event.
    fleet.patch_spec({"prefill": {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2}}})
    invalid = eventually(
        lambda: (c := fleet.condition("InvalidSpec")) and c["status"] == "True" and c, "InvalidSpec condition"
    )
    assert "minReplicas" in invalid["message"] and "maxReplicas" in invalid["message"]
    eventually(
        lambda: [
            e
            for e in fleet.core.list_namespaced_event(fleet.namespace).items
            if e.involved_object.kind == "PDDeployment" and e.type == "Warning" and "minReplicas" in e.message
        ],
        "a Warning event on the PDDeployment naming the field",
    )
    time.sleep(2)
    assert {s.metadata.name: s.metadata.resource_version for s in fleet.statefulsets()} == versions
    assert fleet.condition("Ready")["status"] == "True", "the running fleet stays up"


def test_unknown_gpu_product_is_reported_and_creates_nothing(fleet: Fleet):
    spec = fleet_spec()
    spec["prefill"]["gpuProduct"] = "NVIDIA-B200"
    fleet.create(spec)
    degraded = eventually(
        lambda: (c := fleet.condition("Degraded")) and c["status"] == "True" and c, "Degraded condition"
    )
    assert degraded["reason"] == "NoMatchingNodes" and "NVIDIA-B200" in degraded["message"]
    assert fleet.statefulsets() == []


def test_pods_that_cannot_schedule_are_explained(fleet: Fleet, control_plane: LocalControlPlane):
    # A rack whose only GPUs are taken by someone else: placement sees the capacity, the scheduler cannot bind.
    labels = builders.node_labels("rack-busy", zone="zone-3", product="NVIDIA-A30")
    control_plane.register_node("rack-busy-node-0", labels, gpus=2)
    blocker = {
        "metadata": {"name": "gpu-hog"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "rack-busy-node-0"},
            "containers": [{"name": "hog", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
        },
    }
    fleet.core.create_namespaced_pod(fleet.namespace, blocker)
    eventually(lambda: fleet.core.read_namespaced_pod("gpu-hog", fleet.namespace).spec.node_name, "blocker bound")
    spec = fleet_spec(1, 1)
    for pool in POOLS:
        spec[pool]["gpuProduct"] = "NVIDIA-A30"
    fleet.create(spec)
    ready = eventually(
        lambda: (c := fleet.condition("Ready")) and c["reason"] == "Unschedulable" and c, "Ready=False Unschedulable"
    )
    assert "nvidia.com/gpu" in ready["message"]
    progressing = eventually(
        lambda: (c := fleet.condition("Progressing")) and c["reason"] == "Unschedulable" and c,
        "Progressing=False Unschedulable",
    )
    assert progressing["status"] == "False"
    status = fleet.get()["status"]
    assert status["prefill"]["summary"] == "0/1" and status["decode"]["summary"] == "0/1", status


def test_new_fleet_with_an_invalid_spec_says_nothing_was_created(fleet: Fleet):
    spec = fleet_spec(1, 1)
    spec["prefill"]["autoscaling"] = {"enabled": True, "minReplicas": 5, "maxReplicas": 2}
    fleet.create(spec)
    degraded = eventually(
        lambda: (c := fleet.condition("Degraded")) and c["reason"] == "SpecRejected" and c, "Degraded SpecRejected"
    )
    assert "nothing was created" in degraded["message"] and "last valid spec" not in degraded["message"]
    assert fleet.condition("Ready")["reason"] == "InvalidSpec"
    assert fleet.get()["status"]["prefill"]["summary"] == "0/1"
    assert fleet.statefulsets() == []


def test_kubectl_scale_drives_the_decode_pool(fleet: Fleet, control_plane: LocalControlPlane):
    _steady(fleet, 1, 1)
    scaled = kubectl(control_plane, "scale", "pdd", fleet.name, "-n", fleet.namespace, "--replicas=3")
    assert scaled.returncode == 0, scaled.stderr
    assert fleet.get()["spec"]["decode"]["replicas"] == 3
    eventually(lambda: sum(s.spec.replicas for s in fleet.statefulsets("decode")) == 3, "decode scaled to 3")
    assert sum(s.spec.replicas for s in fleet.statefulsets("prefill")) == 1
    # What an HPA reads: the scale subresource's replicas and the decode pods' selector.
    scale = fleet.custom.get_namespaced_custom_object_scale(API_GROUP, API_VERSION, fleet.namespace, PLURAL, fleet.name)
    assert scale["spec"]["replicas"] == 3
    selector = eventually(lambda: scale_selector(fleet), "the scale subresource's selector")
    decode_pods = {p.metadata.name for p in fleet.pods(**{"pdfleet.dev/pool": "decode"})}
    assert {
        p.metadata.name for p in fleet.core.list_namespaced_pod(fleet.namespace, label_selector=selector).items
    } == (decode_pods)


def scale_selector(fleet: Fleet) -> str:
    scale = fleet.custom.get_namespaced_custom_object_scale(API_GROUP, API_VERSION, fleet.namespace, PLURAL, fleet.name)
    return (scale.get("status") or {}).get("selector", "")


def test_delete_cascades_to_every_child(fleet: Fleet):
    _steady(fleet, 1, 1)
    fleet.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, fleet.namespace, PLURAL, fleet.name)
    eventually(
        lambda: (
            not fleet.statefulsets()
            and not fleet.apps.list_namespaced_deployment(fleet.namespace, label_selector=fleet.selector()).items
        ),
        "children garbage-collected",
        timeout=60,
    )


def test_deleting_the_crd_with_fleets_finishes_and_the_operator_serves_it_again(
    fleet: Fleet, kube: Any, pdfleet_operator: Any
):
    # What `kubectl delete -f manifests/` does: the CRD goes while fleets exist. No finalizer holds them.
    fleet.create(fleet_spec(1, 1))
    eventually(lambda: len(fleet.statefulsets()) == 2, "cells")
    assert not fleet.get()["metadata"].get("finalizers")
    extensions = client.ApiextensionsV1Api(kube)
    crd_name = f"{PLURAL}.{API_GROUP}"
    started = time.monotonic()
    extensions.delete_custom_resource_definition(crd_name)
    try:
        eventually(
            lambda: crd_name not in {c.metadata.name for c in extensions.list_custom_resource_definition().items},
            "the CRD removed",
            timeout=60,
        )
        print(f"CRD with a fleet deleted in {time.monotonic() - started:.1f} s")
    finally:
        install_crd(kube)
    # The operator picks the reinstalled CRD up again (later tests share it).
    after = Fleet(kube, fleet.namespace, "after")
    after.create(fleet_spec(1, 1))
    eventually(lambda: len(after.statefulsets()) == 2, "cells of a fleet created after the reinstall", timeout=90)
