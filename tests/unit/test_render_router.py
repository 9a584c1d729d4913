"""Router Deployment, fleet view and its ConfigMap."""

from __future__ import annotations

import json

import pytest

from pdfleet.api.model import parse_spec
from pdfleet.render.fleet_view import Endpoint, render_fleet_view
from pdfleet.render.meta import Owner
from pdfleet.render.router import render_router_configmap, render_router_deployment

OWNER = Owner(name="llama", namespace="inference", uid="u1")
SPEC = parse_spec(
    {"model": {"name": "m", "servedModelName": "llama-70b"}, "router": {"replicas": 2, "port": 9080, "adminPort": 9081}}
)
ENDPOINTS = [
    Endpoint("llama-prefill-rack-a-0", "prefill", "http://10.1.2.3:8000", "rack-a", "zone-1"),
    Endpoint("llama-decode-rack-a-0", "decode", "http://10.1.2.4:8000", "rack-a", "zone-1", draining=True),
]


def test_fleet_view_matches_the_documented_shape() -> None:
    view = render_fleet_view(SPEC, 7, ENDPOINTS)
    assert (view["version"], view["generation"], view["model"]) == (1, 7, "llama-70b")
    assert view["policy"] == {
        "locality": "preferred",
        "disaggregateMinPromptTokens": 256,
        "prefixAffinity": True,
        "prefixBlockTokens": 64,
        "maxPrefillRetries": 2,
        "maxDecodeRetries": 2,
        "prefillTimeoutSeconds": 60,
        "decodeTimeoutSeconds": 600,
    }
    assert view["endpoints"] == [
        {
            "name": "llama-decode-rack-a-0",
            "pool": "decode",
            "url": "http://10.1.2.4:8000",
            "rack": "rack-a",
            "zone": "zone-1",
            "draining": True,
        },
        {
            "name": "llama-prefill-rack-a-0",
            "pool": "prefill",
            "url": "http://10.1.2.3:8000",
            "rack": "rack-a",
            "zone": "zone-1",
            "draining": False,
        },
    ]


def test_configmap_is_byte_stable_whatever_the_endpoint_order() -> None:
    first = render_router_configmap(OWNER, render_fleet_view(SPEC, 7, ENDPOINTS))
    second = render_router_configmap(OWNER, render_fleet_view(SPEC, 7, list(reversed(ENDPOINTS))))
    assert first == second
    assert first["metadata"]["name"] == "llama-router" and first["kind"] == "ConfigMap"
    text = first["data"]["fleet.json"]
    assert json.loads(text) == render_fleet_view(SPEC, 7, ENDPOINTS)
    assert text == json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n"


def test_endpoint_from_pod_reads_the_label_contract() -> None:
    pod = {
        "metadata": {
            "name": "llama-decode-rack-b-1",
            "labels": {"pdfleet.dev/pool": "decode", "pdfleet.dev/rack": "rack-b", "pdfleet.dev/zone": "zone-2"},
        },
        "status": {"podIP": "fd00::5"},
    }
    assert Endpoint.from_pod(pod, 8000, draining=True) == Endpoint(
        "llama-decode-rack-b-1", "decode", "http://[fd00::5]:8000", "rack-b", "zone-2", True
    )


def test_router_deployment() -> None:
    deployment = render_router_deployment(OWNER, SPEC, "ghcr.io/pdfleet/pdfleet:1.0")
    assert deployment["metadata"]["name"] == "llama-router"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/pdfleet/pdfleet:1.0"
    assert container["command"] == [
        "pdfleet",
        "router",
        "--fleet-file",
        "/etc/pdfleet/fleet.json",
        "--port",
        "9080",
        "--admin-port",
        "9081",
        "--admin-token-file",
        "/var/run/pdfleet/admin/token",
    ]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin", "scheme": "HTTP"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["volumeMounts"] == [
        {"name": "fleet", "mountPath": "/etc/pdfleet", "readOnly": True},
        {"name": "admin-token", "mountPath": "/var/run/pdfleet/admin", "readOnly": True},
    ]
    assert pod["volumes"] == [
        {"name": "fleet", "configMap": {"name": "llama-router"}},
        {"name": "admin-token", "secret": {"secretName": "llama-router-admin"}},
    ]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "router"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9081"


def test_router_image_override() -> None:
    spec = parse_spec({"model": {"name": "m"}, "router": {"image": "my/router:2"}})
    deployment = render_router_deployment(OWNER, spec, "ignored:1")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "my/router:2"


def test_admin_token_secret_is_owned_and_holds_the_token() -> None:
    import base64

    from pdfleet.render.router_access import render_router_admin_secret

    secret = render_router_admin_secret(OWNER, "s3cret")
    assert secret["metadata"]["name"] == "llama-router-admin"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "u1"  # garbage-collected with the PDDeployment
    assert base64.b64decode(secret["data"]["token"]) == b"s3cret"


def test_network_policy_admits_the_admin_port_only_from_the_operator_and_prometheus() -> None:
    from pdfleet.render.router_access import AdminClients, render_router_network_policy

    clients = AdminClients.from_env(
        {
            "PDFLEET_OPERATOR_NAMESPACE": "pdfleet-system",
            "PDFLEET_OPERATOR_POD_LABELS": "app.kubernetes.io/name=pdfleet-operator, app.kubernetes.io/instance=x",
            "PDFLEET_ROUTER_METRICS_NAMESPACES": "monitoring,,obs",
        }
    )
    policy = render_router_network_policy(OWNER, SPEC, clients)
    assert policy["metadata"]["name"] == "llama-router"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "router"
    assert spec["policyTypes"] == ["Ingress"]
    data, admin = spec["ingress"]
    assert data == {"ports": [{"protocol": "TCP", "port": 9080}]}  # clients: from anywhere
    assert admin["ports"] == [{"protocol": "TCP", "port": 9081}]
    assert admin["from"] == [
        {
            "podSelector": {
                "matchLabels": {"app.kubernetes.io/name": "pdfleet-operator", "app.kubernetes.io/instance": "x"}
            },
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "pdfleet-system"}},
        },
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}},
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}}},
    ]
    # an operator outside the cluster (the local fleet): its labels in any namespace, no metrics namespaces
    (peer,) = render_router_network_policy(OWNER, SPEC, AdminClients.from_env({}))["spec"]["ingress"][1]["from"]
    assert peer["namespaceSelector"] == {} and peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
    with pytest.raises(ValueError):
        AdminClients.from_env({"PDFLEET_OPERATOR_POD_LABELS": "no-equals-sign"})


def test_operator_rbac_gets_and_creates_secrets_and_nothing_more() -> None:
    from pdfleet.chart.rbac import namespaced_rules

    verbs = {(r["apiGroups"][0], r["resources"][0]): r["verbs"] for r in namespaced_rules()}
    assert verbs[("", "secrets")] == ["create", "get"]  # a read of one named Secret is `get`, not `list`
    assert verbs[("networking.k8s.io", "networkpolicies")] == ["create", "delete", "list", "patch", "watch"]
