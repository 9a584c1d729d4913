"""What pdfleet creates is valid against current Kubernetes schemas (strict: no unknown fields), not only against the
1.20 control plane the integration tests run: every object `pdfleet render` produces for the samples and every
document of the chart's `helm template` output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet import OPERATOR_IMAGE
from pdfleet.chart import manifests as chart
from pdfleet.reconcile.cli import load_documents, render_pddeployment

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[test]'")

KUBERNETES = kubernetes_validate.latest_version()  # the newest schemas the pinned package carries
SAMPLES = sorted((chart.REPO / "manifests" / "samples").glob("*.yaml"))
# Custom resources: no upstream schema (PDDeployment is checked by its own CRD and parse_spec elsewhere)
CUSTOM_KINDS = {"PDDeployment", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ClusterKopfPeering", "KopfPeering"}
HELM = chart.find_helm()
CHART_VALUES = {
    "defaults": [],
    "everything-on": [
        "--set",
        "monitoring.enabled=true",
        "--set",
        "sample.enabled=true",
        "--set",
        "operator.replicas=2",
    ],
    "namespaced": ["--set", "operator.replicas=2", "--set", "operator.watchNamespaces={a,b}"],
}


def test_the_schemas_are_current() -> None:
    assert tuple(int(x) for x in KUBERNETES.split(".")) >= (1, 32)


def assert_valid(obj: dict[str, Any]) -> None:
    where = f"{obj['kind']} {obj['metadata'].get('name')}"
    try:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)
    except kubernetes_validate.ValidationError as error:
        path = ".".join(str(p) for p in error.path)
        pytest.fail(f"{where}: {path}: {error.message} (Kubernetes {KUBERNETES} schema)")


@pytest.mark.parametrize("path", SAMPLES, ids=[p.stem for p in SAMPLES])
def test_rendered_fleet_objects_are_valid(path: Path) -> None:
    (pdd,) = load_documents(path)
    objects, _ = render_pddeployment(pdd, None, operator_image=OPERATOR_IMAGE, pdb_api_version="policy/v1")
    assert objects
    for obj in objects:
        assert_valid(obj)


@pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")
@pytest.mark.parametrize("values", CHART_VALUES.values(), ids=CHART_VALUES.keys())
def test_chart_documents_are_valid(values: list[str]) -> None:
    capabilities = ["--api-versions", "monitoring.coreos.com/v1"]  # what monitoring.enabled requires
    rendered = chart.run_helm(
        HELM, "template", "rel", str(chart.CHART), "--namespace", "ops", "--include-crds", *capabilities, *values
    )
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    checked = [o for o in objects if o["kind"] not in CUSTOM_KINDS]
    assert {"Deployment", "CustomResourceDefinition", "ClusterRole"} <= {o["kind"] for o in checked}
    for obj in checked:
        assert_valid(obj)
