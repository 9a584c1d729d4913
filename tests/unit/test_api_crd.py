"""CRD generation: the committed file is current, the schema is structural and 1.20-compatible."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import yaml

from pdfleet.api.cli import main as gen_crd_main
from pdfleet.api.cli import render_crd_yaml
from pdfleet.api.crd import generate_crd

COMMITTED = Path(__file__).resolve().parents[2] / "crds" / "pdfleet.dev_pddeployments.yaml"
FORBIDDEN_KEYS = {"$ref", "$defs", "anyOf", "oneOf", "allOf", "title", "const", "x-kubernetes-validations"}


def schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{path}{{}}")


def root_schema() -> dict[str, Any]:
    return generate_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_committed_crd_matches_the_model() -> None:
    assert yaml.safe_load(COMMITTED.read_text()) == generate_crd(), "run `pdfleet gen-crd` and commit crds/"
    assert COMMITTED.read_text() == render_crd_yaml()


def test_names_scope_and_subresources() -> None:
    crd = generate_crd()
    assert crd["metadata"]["name"] == "pddeployments.pdfleet.dev"
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == ("pdfleet.dev", "Namespaced")
    assert spec["names"]["shortNames"] == ["pdd"] and spec["names"]["categories"] == ["pdfleet"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.decode.replicas",
            "statusReplicasPath": ".status.decode.currentReplicas",
            "labelSelectorPath": ".status.decode.selector",
        },
    }


def test_printer_columns() -> None:
    columns = {c["name"]: c for c in generate_crd()["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert columns["Prefill"]["jsonPath"] == ".status.prefill.summary"
    assert columns["Decode"]["jsonPath"] == ".status.decode.summary"
    assert columns["Ready"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].status'
    assert columns["Reason"]["jsonPath"] == '.status.conditions[?(@.type=="Ready")].reason'
    assert columns["SLA"]["jsonPath"] == '.status.conditions[?(@.type=="SLAMet")].reason'
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    wide = {name: c["jsonPath"] for name, c in columns.items() if c.get("priority") == 1}
    assert wide == {"Model": ".status.model", "Router": ".status.routerUrl"}


def test_schema_is_structural() -> None:
    for path, node in schema_nodes(root_schema()):
        assert not FORBIDDEN_KEYS & node.keys(), (path, FORBIDDEN_KEYS & node.keys())
        assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"
        if "properties" in node:
            assert node["type"] == "object", path
        assert node.get("additionalProperties", {}) is not False, path
        assert not ("properties" in node and "additionalProperties" in node), path
        assert not ("enum" in node and node.get("nullable")), f"{path}: OpenAPI enums reject null"
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be a boolean in OpenAPI v3.0"


def test_schema_level_validations() -> None:
    spec = root_schema()["properties"]["spec"]["properties"]
    assert spec["engine"]["properties"]["kind"]["enum"] == ["vllm", "sglang"]
    assert spec["topology"]["properties"]["placement"]["enum"] == ["RackPaired", "Spread", "Unconstrained"]
    assert spec["router"]["properties"]["port"]["maximum"] == 65535
    assert spec["prefill"]["properties"]["replicas"] == {
        "description": spec["prefill"]["properties"]["replicas"]["description"],
        "type": "integer",
        "default": 1,
        "minimum": 0,
        "maximum": 1000,
    }
    percentile = spec["sla"]["properties"]["percentile"]
    assert (percentile["maximum"], percentile["exclusiveMaximum"]) == (100, True)
    assert "pattern" in spec["topology"]["properties"]["rackLabel"]
    assert spec["model"]["required"] == ["name"]
    assert spec["prefill"]["properties"]["gpuProduct"]["nullable"] is True
    assert spec["prefill"]["properties"]["resources"]["additionalProperties"] == {"x-kubernetes-int-or-string": True}
    assert spec["engine"]["properties"]["env"]["items"]["properties"]["valueFrom"][
        "x-kubernetes-preserve-unknown-fields"
    ]
    assert spec["model"]["description"] == "The model to serve."
    assert spec["engine"]["properties"]["image"]["default"] == "vllm/vllm-openai:v0.32.0"
    kv = spec["kvTransfer"]["properties"]
    # optional transport settings: no default in the schema (unset means vLLM's / UCX's own default)
    assert kv["bufferDevice"]["enum"] == ["cuda", "cpu"] and "default" not in kv["bufferDevice"]
    for port in ("sideChannelPort", "bootstrapPort"):
        assert (kv[port]["type"], kv[port]["minimum"], kv[port]["maximum"]) == ("integer", 1, 65535)
        assert "default" not in kv[port]
    assert kv["mooncakeProtocol"]["enum"] == ["rdma", "tcp"]
    for field in ("ucxTransports", "ucxNetDevices"):
        assert kv[field]["type"] == "array" and kv[field]["minItems"] == 1 and "pattern" in kv[field]["items"]


def test_status_schema_is_explainable_and_closed() -> None:
    # A 1.20 apiserver publishes a nullable or preserve-unknown-fields object without its properties (kubectl explain
    # shows nothing), and status is the operator's alone: every field it writes is listed.
    status = root_schema()["properties"]["status"]
    for path, node in schema_nodes(status):
        assert not {"nullable", "x-kubernetes-preserve-unknown-fields", "default"} & node.keys(), path
    assert status["properties"]["prefill"]["properties"]["summary"]["type"] == "string"
    assert status["properties"]["decode"]["properties"]["selector"]["type"] == "string"
    assert set(status["properties"]["drain"]["properties"]) == {
        "pool",
        "targetReplicas",
        "endpoints",
        "startedAt",
        "cause",
    }


def test_cli_writes_and_checks(tmp_path: Path) -> None:
    target = tmp_path / "crds" / "crd.yaml"
    assert gen_crd_main(["--check", "--output", str(target)]) == 1
    assert gen_crd_main(["--output", str(target)]) == 0
    assert gen_crd_main(["--check", "--output", str(target)]) == 0
    target.write_text(target.read_text().replace("pdd", "pdx"))
    assert gen_crd_main(["--check", "--output", str(target)]) == 1
