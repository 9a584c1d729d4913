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
    assert container["command"] == ["pdfleet", "operator", "--metrics-port=9090", "--health-address=0.0.0.0:8080"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9090, "health": 8080}
    assert pod["serviceAccountName"] == "rel-pdfleet"
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}  # one replica, no peering: never two at once


def test_two_replicas_turn_on_kopf_peering_with_its_crds_and_peering_object() -> None:
    objects = template("--set", "operator.replicas=2")
    (deployment,) = by_kind(objects, "Deployment")
    assert "--peering=pdfleet" in deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "strategy" not in deployment["spec"]
    crds = {o["metadata"]["name"] for o in by_kind(objects, "CustomResourceDefinition")}
    assert crds == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    (peering,) = by_kind(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == "pdfleet"
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]  # after its CRD exists
    (role,) = by_kind(objects, "ClusterRole")
    assert role["rules"] == rbac.operator_rules() + rbac.peering_rules()


def test_watched_namespaces_get_namespaced_peering_objects() -> None:
    objects = template("--set", "operator.replicas=2", "--set", "operator.watchNamespaces={a,b}")
    assert sorted(o["metadata"]["namespace"] for o in by_kind(objects, "KopfPeering")) == ["a", "b"]
    command = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[-2:] == ["--namespace=a", "--namespace=b"]


def test_cluster_role_is_exactly_the_rules_derived_from_the_code() -> None:
    (role,) = by_kind(template(), "ClusterRole")
    assert role["rules"] == rbac.operator_rules()
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
        for o in by_kind(template("--set", "monitoring.enabled=true"), "PodMonitor")
    }
    engines, routers = monitors["engines"], monitors["routers"]
    for pool in ("prefill", "decode"):
        assert _selects(engines["selector"], component_labels("fleet", pool))
        assert not _selects(routers["selector"], component_labels("fleet", pool))
    assert _selects(routers["selector"], component_labels("fleet", ROUTER_COMPONENT))
    assert not _selects(engines["selector"], component_labels("fleet", ROUTER_COMPONENT))
    assert engines["podMetricsEndpoints"][0]["port"] == ENGINE_PORT_NAME
    assert routers["podMetricsEndpoints"][0]["port"] == ROUTER_ADMIN_PORT_NAME
