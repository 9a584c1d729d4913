"""Generate the PDDeployment CustomResourceDefinition from the pydantic models.

The schema is made *structural* (what apiextensions.k8s.io/v1 requires): every `$ref` is inlined, `anyOf [X, null]`
becomes `X` with `nullable: true`, JSON-Schema-2020 numeric exclusive bounds become OpenAPI v3.0 booleans, titles are
dropped. Only features a Kubernetes 1.20 apiserver accepts are used (no CEL / x-kubernetes-validations).
"""

from __future__ import annotations

from typing import Any

from pdfleet import API_GROUP, API_VERSION, KIND, PLURAL
from pdfleet.api.model import PDDeploymentSpec, PDDeploymentStatus

SHORT_NAMES = ["pdd"]
CATEGORIES = ["pdfleet"]
CRD_FILE_NAME = f"{API_GROUP}_{PLURAL}.yaml"

# JSON-Schema keys that have no place in a Kubernetes structural schema.
_DROPPED_KEYS = {"title", "$defs"}
# Readable key order in the generated file: what a field is first, its children last.
_KEY_ORDER = {
    key: rank for rank, key in enumerate(["description", "type", "nullable", "default", "enum", "format", "pattern"])
} | {"properties": 90, "required": 91, "items": 92, "additionalProperties": 93}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a `$ref` (or single-element allOf); keys next to the reference (e.g. description) win."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        siblings = {key: value for key, value in node.items() if key != "$ref"}
        return _resolve({**target, **siblings}, defs)
    if "allOf" in node and len(node["allOf"]) == 1:
        siblings = {key: value for key, value in node.items() if key != "allOf"}
        return _resolve({**node["allOf"][0], **siblings}, defs)
    return node


def _strip_null(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """`anyOf [X, {type: null}]` -> X with `nullable: true`."""
    if "anyOf" not in node:
        return node
    members = [member for member in node["anyOf"] if member != {"type": "null"}]
    if len(members) != 1:
        raise ValueError(f"cannot express union {node['anyOf']} in a structural schema")
    siblings = {key: value for key, value in node.items() if key != "anyOf"}
    merged = {**_resolve(members[0], defs), **siblings}
    # OpenAPI 3.0 enums reject null even when nullable; without `nullable` the apiserver prunes nulls instead.
    if len(members) < len(node["anyOf"]) and "enum" not in merged:
        merged["nullable"] = True
    return merged


def structural(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema node as a Kubernetes structural OpenAPI v3 schema node."""
    node = _strip_null(_resolve(node, defs), defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: structural(child, defs) for name, child in value.items()}
        elif key == "items":
            out[key] = structural(value, defs)
        elif key == "additionalProperties":
            # `false` is pydantic's extra="forbid"; the apiserver prunes unknown fields instead.
            if isinstance(value, dict):
                out[key] = structural(value, defs)
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "default":
            # Object defaults stay in pydantic (the apiserver would have to materialize whole sub-objects).
            if value is not None and "properties" not in node:
                out[key] = value
        else:
            out[key] = value
    return dict(sorted(out.items(), key=lambda item: (_KEY_ORDER.get(item[0], len(_KEY_ORDER)), item[0])))


def _observed(node: dict[str, Any]) -> None:
    """Make a status schema node describe, not default: nothing is defaulted, and nothing is `nullable`.

    The operator writes status with merge patches, where null deletes a key, so no null is ever stored; and a 1.20
    apiserver publishes a nullable (or x-kubernetes-preserve-unknown-fields) object without its properties, which
    leaves `kubectl explain pdd.status` empty.
    """
    node.pop("default", None)
    node.pop("nullable", None)
    for child in node.get("properties", {}).values():
        _observed(child)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            _observed(node[key])


def _schema_of(model: type[Any]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True)
    return structural(schema, schema.get("$defs", {}))


def _condition_column(name: str, condition: str, field: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": "string",
        "description": description,
        "jsonPath": f'.status.conditions[?(@.type=="{condition}")].{field}',
    }


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {
            "name": "Prefill",
            "type": "string",
            "description": "Ready/desired prefill replicas",
            "jsonPath": ".status.prefill.summary",
        },
        {
            "name": "Decode",
            "type": "string",
            "description": "Ready/desired decode replicas",
            "jsonPath": ".status.decode.summary",
        },
        _condition_column("Ready", "Ready", "status", "Ready condition"),
        _condition_column("Reason", "Ready", "reason", "Why the fleet is (not) ready"),
        _condition_column("SLA", "SLAMet", "reason", "Latency SLA: Met, Violated or NotMeasured"),
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        {
            "name": "Model",
            "type": "string",
            "priority": 1,
            "description": "Model name clients send",
            "jsonPath": ".status.model",
        },
        {
            "name": "Router",
            "type": "string",
            "priority": 1,
            "description": "In-cluster URL of the router",
            "jsonPath": ".status.routerUrl",
        },
    ]


# `kubectl scale pdd` and an HPA/KEDA scale the decode pool: one CRD has one scale subresource (docs/install.md).
SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.decode.replicas",
    "statusReplicasPath": ".status.decode.currentReplicas",
    "labelSelectorPath": ".status.decode.selector",
}


def generate_crd() -> dict[str, Any]:
    """The apiextensions.k8s.io/v1 CustomResourceDefinition of PDDeployment, as a plain dict."""
    status = _schema_of(PDDeploymentStatus)
    _observed(status)
    root = {
        "type": "object",
        "description": "PDDeployment: a prefill/decode-disaggregated LLM inference fleet.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _schema_of(PDDeploymentSpec),
            "status": status,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{API_GROUP}"},
        "spec": {
            "group": API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": CATEGORIES,
            },
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": SCALE_SUBRESOURCE},
                    "additionalPrinterColumns": _printer_columns(),
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
