"""The chart and manifests/ on the real test control plane: server-side validation, `helm install`, and the operator
running with nothing but the chart's ServiceAccount (its RBAC is sufficient, not just plausible)."""

from __future__ import annotations

import base64
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from pdfleet import API_GROUP, API_VERSION, PLURAL
from pdfleet.chart import manifests as render
from pdfleet.localfleet.controlplane import LocalControlPlane, cache_bin_dir, wait_until
from pdfleet.localfleet.operator_process import OperatorProcess, install_crd
from pdfleet.testing.builders import pdd_body, pdd_spec

CHART = str(render.CHART)
HELM = render.find_helm()
pytestmark = pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")
EVERYTHING_ON = ("--set", "monitoring.enabled=true", "--set", "sample.enabled=true", "--set", "operator.replicas=2")
MONITORING_KINDS = (
    ("ServiceMonitor", "servicemonitors"),
    ("PodMonitor", "podmonitors"),
    ("PrometheusRule", "prometheusrules"),
)
DENIED = ("Forbidden", "forbidden", " 403", "Not enough permissions")


def monitoring_crd(kind: str, plural: str) -> dict[str, Any]:
    """A minimal stand-in of a Prometheus Operator CRD: the real group/version/kind, any spec."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.monitoring.coreos.com"},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                        }
                    },
                }
            ],
        },
    }


def kubectl(plane: LocalControlPlane, *args: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(cache_bin_dir() / "kubectl"), "--kubeconfig", str(plane.kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def established(ext: client.ApiextensionsV1Api, name: str) -> bool:
    conditions = ext.read_custom_resource_definition(name).status.conditions or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


@pytest.fixture(scope="module")
def release(control_plane: LocalControlPlane, kube: Any) -> Iterator[dict[str, str]]:
    """The chart installed with every feature on (monitoring, sample, two peering replicas) in a fresh namespace."""
    install_crd(kube)
    ext = client.ApiextensionsV1Api(kube)
    for kind, plural in MONITORING_KINDS:
        try:
            ext.create_custom_resource_definition(monitoring_crd(kind, plural))
        except ApiException as error:
            if error.status != 409:
                raise
        wait_until(lambda p=plural: established(ext, f"{p}.monitoring.coreos.com"), 30, f"{plural} CRD")
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"pdf-{suffix}", f"chart-install-{suffix}"
    control_plane.create_namespace(namespace)
    notes = render.run_helm(
        HELM,
        "install",
        name,
        CHART,
        "--namespace",
        namespace,
        "--kubeconfig",
        str(control_plane.kubeconfig),
        *EVERYTHING_ON,
    )
    try:
        yield {"name": name, "namespace": namespace, "notes": notes, "fullname": f"{name}-pdfleet"}
    finally:
        render.run_helm(
            HELM, "uninstall", name, "--namespace", namespace, "--kubeconfig", str(control_plane.kubeconfig)
        )
        control_plane.delete_namespace(namespace)
        for crd in [f"{p}.monitoring.coreos.com" for _, p in MONITORING_KINDS] + [
            "clusterkopfpeerings.kopf.dev",
            "kopfpeerings.kopf.dev",
        ]:
            try:
                ext.delete_custom_resource_definition(crd)
            except ApiException as error:
                if error.status != 404:
                    raise


def test_helm_install_creates_the_operator_objects(release: dict[str, str], kube: Any) -> None:
    ns, full = release["namespace"], release["fullname"]
    deployment = client.AppsV1Api(kube).read_namespaced_deployment(full, ns)
    assert deployment.spec.replicas == 2
    assert "--peering=pdfleet" in deployment.spec.template.spec.containers[0].command
    core, rbac_api = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    assert core.read_namespaced_service_account(full, ns)
    assert core.read_namespaced_service(f"{full}-metrics", ns).spec.ports[0].port == 9090
    assert rbac_api.read_cluster_role(full).rules
    assert rbac_api.read_cluster_role_binding(full).subjects[0].name == full
    assert established(client.ApiextensionsV1Api(kube), f"{PLURAL}.{API_GROUP}")
    dashboards = core.list_namespaced_config_map(ns, label_selector="grafana_dashboard=1").items
    assert len(dashboards) == 5
    custom = client.CustomObjectsApi(kube)
    assert custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", "pdfleet")  # a release object
    assert custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, "sample")
    for _, plural in MONITORING_KINDS:
        assert custom.list_namespaced_custom_object("monitoring.coreos.com", "v1", ns, plural)["items"]
    assert f"kubectl -n {ns} rollout status deployment/{full}" in release["notes"]


def test_helm_uninstall_removes_the_peering_object(control_plane: LocalControlPlane, kube: Any) -> None:
    suffix = uuid.uuid4().hex[:6]
    name, namespace, peering = f"pdp-{suffix}", f"chart-peering-{suffix}", f"peering-{suffix}"
    control_plane.create_namespace(namespace)
    kubeconfig_flag = ("--kubeconfig", str(control_plane.kubeconfig))
    values = ("--set", "operator.replicas=2", "--set", f"operator.peering.name={peering}")
    custom = client.CustomObjectsApi(kube)
    try:
        render.run_helm(HELM, "install", name, CHART, "--namespace", namespace, *kubeconfig_flag, *values)
        assert custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
        render.run_helm(HELM, "uninstall", name, "--namespace", namespace, *kubeconfig_flag)
        with pytest.raises(ApiException) as gone:
            custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", peering)
        assert gone.value.status == 404
    finally:
        control_plane.delete_namespace(namespace)


def test_every_rendered_object_passes_server_side_validation(
    release: dict[str, str], control_plane: LocalControlPlane
) -> None:
    rendered = render.run_helm(
        HELM,
        "template",
        "dryrun",
        CHART,
        "--namespace",
        release["namespace"],
        *EVERYTHING_ON,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "operator.watchNamespaces={default}",
    )
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    out = kubectl(control_plane, "apply", "--dry-run=server", "-f", "-", stdin=rendered)
    assert len(out.strip().splitlines()) == len(objects), out


def test_kubectl_apply_manifests_installs_what_the_chart_defaults_install(
    control_plane: LocalControlPlane, kube: Any
) -> None:
    install_crd(kube)
    manifests = render.MANIFESTS
    kubectl(control_plane, "apply", "-f", str(manifests))
    try:
        assert client.AppsV1Api(kube).read_namespaced_deployment(render.RELEASE, render.NAMESPACE)
        assert client.RbacAuthorizationV1Api(kube).read_cluster_role(render.RELEASE)
    finally:
        for name in ("30-dashboards.yaml", "20-operator.yaml", "10-rbac.yaml", "00-namespace.yaml"):
            kubectl(control_plane, "delete", "--wait=false", "--ignore-not-found", "-f", str(manifests / name))


def service_account_kubeconfig(plane: LocalControlPlane, kube: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (its token Secret, as 1.20 creates them)."""
    core = client.CoreV1Api(kube)
    secret_name = wait_until(
        lambda: (core.read_namespaced_service_account(account, namespace).secrets or [None])[0],
        30,
        f"token of {namespace}/{account}",
    ).name
    token = base64.b64decode(core.read_namespaced_secret(secret_name, namespace).data["token"]).decode()
    config = yaml.safe_load(plane.kubeconfig.read_text())
    config["users"] = [{"name": config["users"][0]["name"], "user": {"token": token}}]
    path.write_text(yaml.safe_dump(config))
    return path


def test_operator_reconciles_with_only_the_chart_rbac(
    release: dict[str, str], control_plane: LocalControlPlane, kube: Any, gpu_racks: list[str], tmp_path: Path
) -> None:
    ns = release["namespace"]
    kubeconfig = service_account_kubeconfig(control_plane, kube, ns, release["fullname"], tmp_path / "sa.kubeconfig")
    custom, apps = client.CustomObjectsApi(kube), client.AppsV1Api(kube)
    body = pdd_body("rbac-check", pdd_spec(prefill={"replicas": 1}, decode={"replicas": 1}))
    with OperatorProcess(kubeconfig, extra_env={"PDFLEET_RESYNC_SECONDS": "2"}) as operator:
        reconcile_lifecycle_without_denials(operator, custom, apps, ns, body)


def allowed(kube: Any, account: str, namespace: str | None, verb: str, group: str, resource: str) -> bool:
    """Whether ServiceAccount `account` ("<ns>:<name>") may `verb` the resource in `namespace` (None: cluster-wide)."""
    account_ns = account.split(":")[0]
    review = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=f"system:serviceaccount:{account}",
            groups=["system:serviceaccounts", f"system:serviceaccounts:{account_ns}", "system:authenticated"],
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb=verb, group=group, resource=resource
            ),
        )
    )
    return client.AuthorizationV1Api(kube).create_subject_access_review(review).status.allowed


def test_namespaced_install_grants_writes_per_watched_namespace_and_the_operator_reconciles_there(
    control_plane: LocalControlPlane, kube: Any, gpu_racks: list[str], tmp_path: Path
) -> None:
    install_crd(kube)
    suffix = uuid.uuid4().hex[:6]
    name, home, watched, other = f"pdn-{suffix}", f"chart-ns-{suffix}", f"watched-{suffix}", f"other-{suffix}"
    for namespace in (home, watched, other):
        control_plane.create_namespace(namespace)
    kubeconfig_flag = ("--kubeconfig", str(control_plane.kubeconfig))
    values = ("--set", f"operator.watchNamespaces={{{watched}}}", "--set", "dashboards.enabled=false")
    render.run_helm(HELM, "install", name, CHART, "--namespace", home, *kubeconfig_flag, *values)
    try:
        full = f"{name}-pdfleet"
        account = f"{home}:{full}"
        rbac_api = client.RbacAuthorizationV1Api(kube)
        assert rbac_api.read_namespaced_role(full, watched).rules
        assert rbac_api.read_namespaced_role_binding(full, watched).subjects[0].namespace == home
        cluster_verbs = {verb for rule in rbac_api.read_cluster_role(full).rules for verb in rule.verbs}
        assert cluster_verbs <= {"get", "list", "watch"}, cluster_verbs
        # what the apiserver's authorizer concludes from the installed objects
        assert allowed(kube, account, watched, "create", "apps", "statefulsets")
        assert allowed(kube, account, watched, "patch", API_GROUP, f"{PLURAL}/status")
        assert allowed(kube, account, None, "list", "", "nodes")
        for namespace in (other, home, None):
            assert not allowed(kube, account, namespace, "create", "apps", "statefulsets"), namespace
            assert not allowed(kube, account, namespace, "patch", API_GROUP, PLURAL), namespace
        assert not allowed(kube, account, None, "list", API_GROUP, PLURAL)  # no cluster-wide list of fleets

        kubeconfig = service_account_kubeconfig(control_plane, kube, home, full, tmp_path / "sa.kubeconfig")
        custom, apps = client.CustomObjectsApi(kube), client.AppsV1Api(kube)
        body = pdd_body("rbac-ns", pdd_spec(prefill={"replicas": 1}, decode={"replicas": 1}))
        operator = OperatorProcess(kubeconfig, {"PDFLEET_RESYNC_SECONDS": "2"}, args=[f"--namespace={watched}"])
        with operator:
            reconcile_lifecycle_without_denials(operator, custom, apps, watched, body)
    finally:
        render.run_helm(HELM, "uninstall", name, "--namespace", home, *kubeconfig_flag)
        for namespace in (home, watched, other):
            control_plane.delete_namespace(namespace)


def reconcile_lifecycle_without_denials(operator: Any, custom: Any, apps: Any, namespace: str, body: dict) -> None:
    """Create `body`, see its cells and status, a second reconcile, then delete it and see the finalizer go: no
    reconcile error and no denied API call in the operator's log."""
    name = body["metadata"]["name"]
    custom.create_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, body)
    selector = f"app.kubernetes.io/instance={name}"
    wait_until(
        lambda: len(apps.list_namespaced_stateful_set(namespace, label_selector=selector).items) >= 2,
        30,
        f"cell StatefulSets (log: {operator.log_path})",
    )
    wait_until(
        lambda: (
            custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name).get("status") or {}
        ).get("observedGeneration"),
        30,
        "status written",
    )
    wait_until(
        lambda: operator.metric_sum('pdfleet_operator_reconciles_total{result="ok"}') >= 2, 30, "a second reconcile"
    )
    custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    wait_until(
        lambda: (
            not custom.list_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, PLURAL, field_selector=f"metadata.name={name}"
            )["items"]
        ),
        30,
        "finalizer removed by the operator",
    )
    assert operator.metric_sum('pdfleet_operator_reconciles_total{result="error"}') == 0, operator.log_tail()
    log = operator.log_path.read_text(errors="replace")
    denied = [line for line in log.splitlines() if any(word in line for word in DENIED)]
    assert not denied, "\n".join(denied)
