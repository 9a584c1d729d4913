"""The chart's values are schema'd and documented from values.yaml; bad values fail with a clear error; the chart's
metadata, probes, monitoring prerequisite, peering object and NOTES say what is true."""

from __future__ import annotations

import json

import pytest
import yaml

from pdfleet.api.model import TopologySpec
from pdfleet.chart import manifests as render
from pdfleet.chart import values

HELM = render.find_helm()
needs_helm = pytest.mark.skipif(HELM is None, reason="helm not installed (bash .ci/install-control-plane.sh)")
VALUES_TEXT = (render.CHART / "values.yaml").read_text()


def helm_template(*args: str) -> str:
    return render.run_helm(HELM, "template", "rel", str(render.CHART), "--namespace", "ops", *args)


@needs_helm
@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("monitoring.enable=true", "additional properties 'enable' not allowed"),
        ("operator.replicas=two", "/operator/replicas"),
        ("operator.replicas=0", "/operator/replicas"),
        ("operator.metricsPort=70000", "/operator/metricsPort"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("opertor.replicas=2", "additional properties 'opertor' not allowed"),
    ],
)
def test_bad_values_fail_with_the_offending_key(setting: str, says: str) -> None:
    with pytest.raises(RuntimeError, match="values don't meet the specifications") as error:
        helm_template("--set", setting)
    assert says in str(error.value)


@needs_helm
def test_free_form_maps_take_any_key() -> None:
    rendered = helm_template(
        "--set", "operator.podLabels.team=ml", "--set", "sample.enabled=true", "--set", "sample.spec.decode.replicas=3"
    )
    assert "team: ml" in rendered


@needs_helm
def test_monitoring_without_the_prometheus_operator_fails_clearly() -> None:
    with pytest.raises(RuntimeError, match=r"needs the Prometheus Operator CRDs \(monitoring.coreos.com/v1\)"):
        helm_template("--set", "monitoring.enabled=true")
    assert "kind: ServiceMonitor" in helm_template(
        "--set", "monitoring.enabled=true", "--api-versions", "monitoring.coreos.com/v1"
    )


def test_schema_closes_every_configured_object_and_documents_each_value() -> None:
    schema = values.values_schema(VALUES_TEXT)
    assert schema["additionalProperties"] is False
    monitoring = schema["properties"]["monitoring"]
    assert monitoring["additionalProperties"] is False and "enabled" in monitoring["properties"]
    assert monitoring["properties"]["labels"] == {
        "description": monitoring["properties"]["labels"]["description"],
        "type": "object",
    }  # a free-form map
    assert schema["properties"]["operator"]["properties"]["replicas"]["type"] == "integer"
    documented = values.descriptions(VALUES_TEXT)
    rows = [line for line in values.readme_file(VALUES_TEXT).splitlines() if line.startswith("| `")]
    assert rows and all(line.split("|")[4].strip() for line in rows), "every value row has a description"
    assert "operator.peering.lifetimeSeconds" in documented


def test_committed_schema_and_readme_are_generated_from_values() -> None:
    assert (render.CHART / "values.schema.json").read_text() == values.schema_file(VALUES_TEXT)
    assert (render.CHART / "README.md").read_text() == values.readme_file(VALUES_TEXT)
    json.loads((render.CHART / "values.schema.json").read_text())


def test_chart_metadata_names_home_sources_and_maintainers() -> None:
    chart = yaml.safe_load((render.CHART / "Chart.yaml").read_text())
    assert chart["home"].startswith("https://") and chart["sources"] and chart["maintainers"][0]["name"]


def test_kopf_peering_crds_ship_in_crds_so_the_peering_object_is_a_release_object() -> None:
    crds = list(yaml.safe_load_all((render.CHART / "crds" / "kopf.dev_peerings.yaml").read_text()))
    assert sorted(c["metadata"]["name"] for c in crds) == ["clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"]
    assert "helm.sh/hook" not in (render.CHART / "templates" / "peering.yaml").read_text()


def test_notes_name_the_rack_label_the_operator_reads() -> None:
    notes = (render.CHART / "templates" / "NOTES.txt").read_text()
    rack_label = TopologySpec().rack_label
    assert f"kubectl label node <node> {rack_label}=<rack>" in notes
    assert f"{rack_label} by default" in notes
