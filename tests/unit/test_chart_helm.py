"""`helm lint` and `helm template` with the real helm binary: what each values combination renders."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.chart import alerts, rbac
from pdfleet.chart import manifests as render

CHART = str(render.CHART)
HELM = render.find_helm()
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")
ALL_ON = ["--set", "monitoring.enabled=true", "--set", "sample.enabled=true", "--set", "operator.replicas=2"]
# monitoring.enabled needs a cluster serving the Prometheus Operator's API (helm template has none unless told)
PROMETHEUS_OPERATOR = ("--api-versions", "monitoring.coreos.com/v1")


def helm(*args: str) -> str:
    return render.run_helm(HELM, *args)


def template(*values: str) -> list[dict[str, Any]]:
    return [o for o in yaml.safe_load_all(helm("template", "rel", CHART, "--namespace", "ops", *values)) if o]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


@pytest.mark.parametrize(
    "values",
    [[], ALL_ON, ALL_ON + ["--set", "operator.watchNamespaces={a,b}"]],
    ids=["defaults", "everything-on", "namespaced"],
)
def test_helm_lint_strict_passes(values: list[str]) -> None:
    helm("lint", CHART, "--strict", *values)


def test_defaults_render_operator_rbac_metrics_service_and_dashboards_only() -> None:
    kinds = sorted(o["kind"] for o in template())
    assert kinds == ["ClusterRole", "ClusterRoleBinding", *["ConfigMap"] * 5, "Deployment", "Service", "ServiceAccount"]


def test_operator_deployment_runs_the_operator_cli_with_probe_and_ports() -> None:
    (deployment,) = by_kind(template(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # both listen on the pod IP: Prometheus scrapes metrics there and the kubelet probes health (docs/security.md)
    assert container["command"] == [
        "pdfleet",
        "operator",
        "--metrics-address=0.0.0.0",
        "--metrics-port=9090",
        "--health-address=0.0.0.0:8080",
    ]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9090, "health": 8080}
    assert pod["serviceAccountName"] == "rel-pdfleet"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one replica, no peering: never two at once


def test_two_replicas_turn_on_kopf_peering_with_its_peering_object() -> None:
    objects = template("--set", "operator.replicas=2")
    (deployment,) = by_kind(objects, "Deployment")
    assert "--peering=pdfleet" in deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "strategy" not in deployment["spec"]
    # the CRDs come from crds/ (installed before the templates), so the peering object is a plain release object,
    # which helm uninstall deletes (a hook would be left behind)
    assert not by_kind(objects, "CustomResourceDefinition")
    (peering,) = by_kind(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "pdfleet"
    assert "helm.sh/hook" not in peering["metadata"].get("annotations", {})
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == rbac.cluster_role_rules(namespaced=False, peering=True)
    assert {"kopf.dev"} == {
        g for r in role["rules"] for g in r["apiGroups"] if r["resources"] == ["clusterkopfpeerings"]
    }
    assert not [r for r in role["rules"] if r["resources"] == ["kopfpeerings"]]  # cluster-wide Kopf never uses them


def test_watched_namespaces_get_namespaced_peering_objects() -> None:
    objects = template("--set", "operator.replicas=2", "--set", "operator.watchNamespaces={a,b}")
    assert sorted(o["metadata"]["namespace"] for o in by_kind(objects, "KopfPeering")) == ["a", "b"]
    command = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--namespace=a", "--namespace=b"]


def test_cluster_role_is_exactly_the_rules_derived_from_the_code() -> None:
    (role,) = by_kind(template(), "ClusterRole")
    assert role["rules"] == rbac.cluster_role_rules(namespaced=False, peering=False)
    assert role["rules"] == rbac.operator_rules()
    assert not by_kind(template(), "Role") and not by_kind(template(), "RoleBinding")
    (binding,) = by_kind(template(), "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-pdfleet", "namespace": "ops"}]


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    maps = by_kind(template(), "ConfigMap")
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    uids = set()
    for config_map in maps:
        ((name, text),) = config_map["data"].items()
        uids.add(json.loads(text)["uid"])
        assert name.endswith(".json")
    assert uids == {"pdfleet-fleet", "pdfleet-sla", "pdfleet-autoscaler", "pdfleet-router", "pdfleet-kv-transfer"}


def test_monitoring_renders_monitors_and_the_generated_alert_rules_with_extra_labels() -> None:
    objects = template(
        *PROMETHEUS_OPERATOR,
        "--set",
        "monitoring.enabled=true",
        "--set",
        "monitoring.labels.release=prom",
        "--set",
        "monitoring.rules.additionalLabels.team=inference",
    )
    assert sorted(o["kind"] for o in objects if o["apiVersion"] == "monitoring.coreos.com/v1") == [
        "PodMonitor",
        "PodMonitor",
        "PrometheusRule",
        "ServiceMonitor",
    ]
    (rule,) = by_kind(objects, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "prom"
    expected = alerts.rule_groups()
    for group in expected:
        for r in group["rules"]:
            r["labels"] = {**r["labels"], "team": "inference"}
    assert rule["spec"]["groups"] == expected
    engines = next(o for o in by_kind(objects, "PodMonitor") if o["metadata"]["name"].endswith("engines"))
    relabel = {r["targetLabel"] for r in engines["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert relabel == {"pdd", "pool", "rack"}  # with Prometheus Operator's own namespace and pod labels


def test_sample_pddeployment_from_values() -> None:
    (sample,) = by_kind(template("--set", "sample.enabled=true"), "PDDeployment")
    assert sample["metadata"] == {"name": "sample", "namespace": "ops"}


def test_promtool_accepts_the_alert_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    result = subprocess.run(
        [promtool, "check", "rules", str(render.CHART / "files" / "alert-rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics for matchLabels and `In` matchExpressions."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(labels.get(e["key"]) in e["values"] for e in selector.get("matchExpressions", []))


def test_pod_monitors_select_the_pods_the_operator_renders_on_their_named_ports() -> None:
    from pdfleet.render.meta import ROUTER_COMPONENT, component_labels
    from pdfleet.render.services import ROUTER_ADMIN_PORT_NAME
    from pdfleet.render.statefulset import ENGINE_PORT_NAME

    monitors = {
        o["metadata"]["name"].rsplit("-", 1)[1]: o["spec"]
        for o in by_kind(template(*PROMETHEUS_OPERATOR, "--set", "monitoring.enabled=true"), "PodMonitor")
    }
    engines, routers = monitors["engines"], monitors["routers"]
    for pool in ("prefill", "decode"):
        assert _selects(engines["selector"], component_labels("fleet", pool))
        assert not _selects(routers["selector"], component_labels("fleet", pool))
    assert _selects(routers["selector"], component_labels("fleet", ROUTER_COMPONENT))
    assert not _selects(engines["selector"], component_labels("fleet", ROUTER_COMPONENT))
    assert engines["podMetricsEndpoints"][0]["port"] == ENGINE_PORT_NAME
    assert routers["podMetricsEndpoints"][0]["port"] == ROUTER_ADMIN_PORT_NAME


READ_VERBS = {"get", "list", "watch"}


@pytest.mark.parametrize("peering", [False, True], ids=["standalone", "peering"])
def test_watched_namespaces_get_roles_and_the_cluster_role_only_reads(peering: bool) -> None:
    values = ["--set", "operator.watchNamespaces={a,b}"] + (["--set", "operator.replicas=2"] if peering else [])
    objects = template(*values)
    (cluster_role,) = by_kind(objects, "ClusterRole")
    assert cluster_role["rules"] == rbac.cluster_role_rules(namespaced=True, peering=peering)
    cluster_wide = {
        (g, r): set(rule["verbs"])
        for rule in cluster_role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert all(verbs <= READ_VERBS for verbs in cluster_wide.values()), "no cluster-wide write verbs"
    assert set(cluster_wide) == {
        ("", "nodes"),  # placement reads Nodes
        ("", "namespaces"),  # Kopf follows the watched namespaces
        ("apiextensions.k8s.io", "customresourcedefinitions"),  # Kopf's resource observation
    }
    roles = {r["metadata"]["namespace"]: r for r in by_kind(objects, "Role")}
    bindings = {b["metadata"]["namespace"]: b for b in by_kind(objects, "RoleBinding")}
    assert sorted(roles) == sorted(bindings) == ["a", "b"]
    for namespace in ("a", "b"):
        role, binding = roles[namespace], bindings[namespace]
        assert role["rules"] == rbac.role_rules(peering=peering)
        granted = {
            (g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
        }
        assert granted[("apps", "statefulsets")] == {"create", "delete", "list", "patch", "watch"}
        assert granted[("pdfleet.dev", "pddeployments")] == {"list", "patch", "watch"}
        assert (("kopf.dev", "kopfpeerings") in granted) == peering
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rel-pdfleet", "namespace": "ops"}]
    # every rule of the cluster-wide mode is granted, each at its scope
    namespaced_mode = {(g, r) for g, r in cluster_wide} | {
        (g, r) for rule in roles["a"]["rules"] for g in rule["apiGroups"] for r in rule["resources"]
    }
    assert {(r["apiGroups"][0], r["resources"][0]) for r in rbac.operator_rules()} <= namespaced_mode


def test_rbac_rules_split_by_scope() -> None:
    cluster = {(r["apiGroups"][0], r["resources"][0]) for r in rbac.cluster_scoped_rules()}
    namespaced = {(r["apiGroups"][0], r["resources"][0]) for r in rbac.namespaced_rules()}
    assert cluster == {("", "nodes"), ("apiextensions.k8s.io", "customresourcedefinitions")}
    assert ("", "nodes") not in namespaced and ("pdfleet.dev", "pddeployments/status") in namespaced
    everything = {(r["apiGroups"][0], r["resources"][0]) for r in rbac.operator_rules()}
    assert everything == cluster | namespaced


def test_operator_listen_addresses_are_values() -> None:
    objects = template("--set", "operator.metricsAddress=127.0.0.1", "--set", "operator.healthAddress=10.0.0.1")
    command = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--metrics-address=127.0.0.1" in command and "--health-address=10.0.0.1:8080" in command
