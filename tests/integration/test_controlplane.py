"""The local control plane is genuine: real controllers, a real scheduler, real garbage collection and CRDs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pdfleet.localfleet.controlplane import GPU_RESOURCE, RACK_LABEL, LocalControlPlane, wait_until

pytestmark = pytest.mark.controlplane

WAIT_SECONDS = 20


@pytest.fixture(scope="module")
def api(control_plane: LocalControlPlane) -> Iterator[client.ApiClient]:
    """An admin ApiClient for this module."""
    api_client = control_plane.api_client()
    yield api_client
    api_client.close()


@pytest.fixture(scope="module")
def fleet_nodes(control_plane: LocalControlPlane) -> Iterator[dict[str, str]]:
    """Two racks of two 8-GPU nodes, as node name -> rack; own rack names and removal after the module keep them
    apart from other modules' nodes on the shared control plane."""
    names = control_plane.standard_fleet_nodes(racks=("cp-rack-a", "cp-rack-b"), nodes_per_rack=2, gpus=8)
    yield {name: name.rsplit("-node-", 1)[0] for name in names}
    for name in names:
        control_plane.delete_node(name)


def gpu_pod(name: str, gpus: int, rack: str) -> dict[str, Any]:
    """A pod asking for `gpus` nvidia.com/gpu, required to land in `rack`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": RACK_LABEL, "operator": "In", "values": [rack]}]}
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "engine",
                    "image": "registry.invalid/engine:0",
                    "resources": {"limits": {GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


def test_statefulset_becomes_pods(api: client.ApiClient, namespace: str, fleet_nodes: dict[str, str]) -> None:
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    labels = {"app": "cell"}
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": "cell"},
            "spec": {
                "serviceName": "cell",
                "replicas": 2,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        # other modules' nodes share the control plane: stay on this module's racks
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {
                                            "matchExpressions": [
                                                {
                                                    "key": RACK_LABEL,
                                                    "operator": "In",
                                                    "values": sorted(set(fleet_nodes.values())),
                                                }
                                            ]
                                        }
                                    ]
                                }
                            }
                        },
                        "containers": [{"name": "engine", "image": "registry.invalid/engine:0"}],
                    },
                },
            },
        },
    )

    def bound_pods() -> list[client.V1Pod]:
        pods = core.list_namespaced_pod(namespace, label_selector="app=cell").items
        return pods if len(pods) == 2 and all(p.spec.node_name for p in pods) else []

    pods = wait_until(bound_pods, WAIT_SECONDS, "2 StatefulSet pods bound to nodes")
    assert sorted(p.metadata.name for p in pods) == ["cell-0", "cell-1"]
    assert all(p.metadata.owner_references[0].kind == "StatefulSet" for p in pods)
    assert all(p.spec.node_name in fleet_nodes for p in pods)


def test_scheduler_binds_gpu_pod_within_required_rack(
    api: client.ApiClient, namespace: str, fleet_nodes: dict[str, str]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("prefill", gpus=1, rack="cp-rack-b"))

    node = wait_until(
        lambda: core.read_namespaced_pod("prefill", namespace).spec.node_name, WAIT_SECONDS, "the GPU pod to be bound"
    )
    assert fleet_nodes[node] == "cp-rack-b"


def test_pod_asking_more_gpus_than_any_node_stays_pending(
    api: client.ApiClient, namespace: str, fleet_nodes: dict[str, str]
) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", gpus=9, rack="cp-rack-a"))

    def unschedulable_condition() -> client.V1PodCondition | None:
        conditions = core.read_namespaced_pod("too-big", namespace).status.conditions or []
        return next((c for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

    condition = wait_until(unschedulable_condition, WAIT_SECONDS, "PodScheduled=False")
    assert condition.reason == "Unschedulable"
    assert f"Insufficient {GPU_RESOURCE}" in condition.message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending" and not pod.spec.node_name
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=too-big").items
    assert any(e.reason == "FailedScheduling" for e in events)


def test_owner_reference_garbage_collection_deletes_children(api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    parent = core.create_namespaced_config_map(namespace, {"metadata": {"name": "parent"}})
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "parent", "uid": parent.metadata.uid}
    for child in ("child-1", "child-2"):
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": child, "labels": {"role": "child"}, "ownerReferences": [owner]}}
        )

    core.delete_namespaced_config_map("parent", namespace)

    wait_until(
        lambda: not core.list_namespaced_config_map(namespace, label_selector="role=child").items,
        WAIT_SECONDS,
        "the garbage collector to delete the children",
    )


def test_custom_resource_definition_becomes_established_and_validates(api: client.ApiClient, namespace: str) -> None:
    extensions, custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)
    group, plural = "cptest.pdfleet.dev", "gadgets"
    schema = {
        "type": "object",
        "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer", "minimum": 1}}}},
    }
    extensions.create_custom_resource_definition(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": "gadget", "kind": "Gadget"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}],
            },
        }
    )
    try:

        def established() -> bool:
            conditions = extensions.read_custom_resource_definition(f"{plural}.{group}").status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_until(established, WAIT_SECONDS, "the CRD to be Established")

        def create_gadget(name: str, size: int) -> Any:
            body = {"apiVersion": f"{group}/v1", "kind": "Gadget", "metadata": {"name": name}, "spec": {"size": size}}
            return custom.create_namespaced_custom_object(group, "v1", namespace, plural, body)

        # Serving a new resource can lag Established by a moment; a 404 then is not the answer.
        created = wait_until(
            lambda: _unless_not_found(lambda: create_gadget("ok", 3)), WAIT_SECONDS, "the custom resource to be served"
        )
        assert created["spec"]["size"] == 3
        with pytest.raises(ApiException) as rejected:
            create_gadget("bad", 0)
        assert rejected.value.status == 422
    finally:
        extensions.delete_custom_resource_definition(f"{plural}.{group}")


def test_fake_nodes_stay_ready_and_follow_set_node_ready(
    control_plane: LocalControlPlane, api: client.ApiClient, fleet_nodes: dict[str, str]
) -> None:
    core = client.CoreV1Api(api)

    def ready_and_taints(name: str) -> tuple[str, list[str]]:
        node = core.read_node(name)
        ready = next(c.status for c in node.status.conditions if c.type == "Ready")
        return ready, [t.key for t in node.spec.taints or []]

    # No heartbeats ever arrive; with nodelifecycle off nothing marks the nodes unreachable.
    assert all(ready_and_taints(name) == ("True", []) for name in fleet_nodes)
    name = next(iter(fleet_nodes))
    control_plane.set_node_ready(name, False)
    assert ready_and_taints(name) == ("False", ["node.kubernetes.io/not-ready"])
    control_plane.set_node_ready(name, True)
    assert ready_and_taints(name) == ("True", [])


def _unless_not_found(call: Any) -> Any:
    try:
        return call()
    except ApiException as error:
        if error.status == 404:
            return None
        raise
