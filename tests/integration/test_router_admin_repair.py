"""The router admin API on the real control plane: the operator's per-PDDeployment token Secret mounted into a router
the local pod runner runs, the admin port off the client Service, the NetworkPolicy, and the operator noticing,
repairing and reporting a fleet view it did not write."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.localfleet.controlplane import LocalControlPlane, wait_until
from pdfleet.localfleet.operator_process import OperatorProcess
from pdfleet.localfleet.podrunner import LocalPodRunner
from pdfleet.testing import builders

NAME = "guarded"
ADMIN_PORT = 8081


@pytest.fixture
def runner(control_plane: LocalControlPlane, pdfleet_operator: OperatorProcess) -> Iterator[LocalPodRunner]:
    """A kubelet for every node while the test runs (the router lands on any of them)."""
    api = control_plane.api_client()
    with LocalPodRunner(api) as pod_runner:
        yield pod_runner
    api.close()


def test_operator_guards_and_repairs_the_router_admin_api(
    kube: Any, namespace: str, runner: LocalPodRunner, pdfleet_operator: OperatorProcess
) -> None:
    core, custom, networking = client.CoreV1Api(kube), client.CustomObjectsApi(kube), client.NetworkingV1Api(kube)
    spec = builders.fleet_spec(1, 1, served_name="m", gpu_product=builders.H100, kvTransfer={"connector": "nixl"})
    created = custom.create_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, PLURAL, builders.pdd_body(NAME, spec)
    )

    def pdd() -> dict[str, Any]:
        return custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, NAME)

    def router_ip() -> str | None:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=router"
        ).items
        ready = [
            p
            for p in pods
            if p.status.pod_ip and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
        ]
        return ready[0].status.pod_ip if ready else None

    ip = wait_until(router_ip, 120, "a Ready router pod")
    admin = f"http://{ip}:{ADMIN_PORT}"

    # the token: one Secret, owned by the PDDeployment, mounted into the router
    secret = core.read_namespaced_secret(f"{NAME}-router-admin", namespace)
    assert secret.metadata.owner_references[0].uid == created["metadata"]["uid"]
    token = base64.b64decode(secret.data["token"]).decode()
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.get(admin + "/admin/fleet", trust_env=False).status_code == 401
    assert httpx.get(admin + "/admin/fleet", headers={"Authorization": "Bearer x"}, trust_env=False).status_code == 401

    def settled_view() -> dict[str, Any] | None:
        """The router's view once it lists both pools' pods and runs the operator's revision of it (a pod that turns
        Ready later raises the revision: a view read before would differ from the repaired one)."""
        running = httpx.get(admin + "/admin/fleet", headers=auth, trust_env=False).json()
        pools = {e["pool"] for e in running["endpoints"]}
        return running if pools == {"prefill", "decode"} and running["revision"] == operator_revision() else None

    def operator_revision() -> int | None:
        return ((pdd().get("status") or {}).get("fleetView") or {}).get("revision")

    view = wait_until(settled_view, 60, "the router runs the operator's view of both pools")
    # clients' Service: the data port only; the NetworkPolicy admits the admin port from the operator only
    service = core.read_namespaced_service(f"{NAME}-router", namespace)
    assert [p.name for p in service.spec.ports] == ["http"]
    policy = networking.read_namespaced_network_policy(f"{NAME}-router", namespace)
    admin_rule = next(r for r in policy.spec.ingress if r.ports[0].port == ADMIN_PORT)
    assert admin_rule._from[0].pod_selector.match_labels["app.kubernetes.io/component"] == "operator"

    # a token holder that is not the operator points the router at its own "decode"
    hijack = {**view, "generation": 999, "endpoints": [{**e, "url": "http://127.0.0.1:9"} for e in view["endpoints"]]}
    assert httpx.put(admin + "/admin/fleet", json=hijack, headers=auth, trust_env=False).status_code == 200

    def degraded_reason() -> str:
        conditions = (pdd().get("status") or {}).get("conditions") or []
        return next(c["reason"] for c in conditions if c["type"] == "Degraded")

    wait_until(lambda: degraded_reason() == "RouterViewTampered", 30, "Degraded: RouterViewTampered")
    repaired = httpx.get(admin + "/admin/fleet", headers=auth, trust_env=False).json()
    assert repaired["generation"] != 999 and repaired["revision"] == operator_revision()
    assert repaired == view and all(e["url"] != "http://127.0.0.1:9" for e in repaired["endpoints"])
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={NAME}").items
    assert any(e.type == "Warning" and e.reason == "RouterViewTampered" for e in events)
    repairs = pdfleet_operator.metric_sum("pdfleet_operator_router_view_repairs_total")
    assert repairs >= 1
    # cleared once every router runs the operator's view again
    wait_until(lambda: degraded_reason() != "RouterViewTampered", 30, "Degraded cleared")
    assert token not in pdfleet_operator.log_path.read_text(errors="replace")
    assert all(token not in (e.message or "") for e in events)
    assert token not in str(pdd().get("status"))
