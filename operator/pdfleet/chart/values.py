"""The chart's values.schema.json and README.md, both generated from values.yaml (its defaults and `# --` comments), so
the documented, the validated and the default values are one list.

The schema closes every object (`additionalProperties: false`: `--set monitoring.enable=true` is an error, not a
silent no-op) except the free-form ones: maps whose default is `{}` (labels, annotations, selectors) and the
Kubernetes structures passed through as they are (FREE_FORM). Types come from the defaults; CONSTRAINTS adds ranges
and enums where a type alone lets nonsense through (`operator.replicas=two` fails as "not an integer").
"""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

DESCRIPTION_MARK = "# -- "
# Kubernetes structures the templates pass through unchanged: any keys (the API server validates them).
FREE_FORM = {
    "operator.resources",
    "operator.livenessProbe",
    "operator.readinessProbe",
    "operator.podSecurityContext",
    "operator.securityContext",
    "sample.spec",
}
# Item schemas of lists whose default is empty.
LIST_ITEMS: dict[str, dict[str, Any]] = {
    "imagePullSecrets": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    "operator.watchNamespaces": {"type": "string", "minLength": 1},
    "operator.extraEnv": {"type": "object", "required": ["name"]},
    "operator.tolerations": {"type": "object"},
    "monitoring.namespaces": {"type": "string", "minLength": 1},
}
PORT = {"minimum": 1, "maximum": 65535}
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "image.pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "operator.replicas": {"minimum": 1},
    "operator.peering.lifetimeSeconds": {"minimum": 1},
    "operator.metricsPort": PORT,
    "operator.healthPort": PORT,
    "operator.resyncSeconds": {"minimum": 1},
    "service.type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
    "monitoring.interval": {"pattern": "^([0-9]+(ms|s|m|h))+$"},
    "sample.name": {"pattern": "^[a-z]([-a-z0-9]*[a-z0-9])?$", "maxLength": 44},
}


def descriptions(values_text: str) -> dict[str, str]:
    """Key path (`operator.peering.name`) -> its `# --` comment, continuation lines joined, from values.yaml's text."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the enclosing mappings
    pending: list[str] | None = None
    for line in values_text.splitlines():
        stripped = line.strip()
        if stripped.startswith(DESCRIPTION_MARK):
            pending = [stripped.removeprefix(DESCRIPTION_MARK)]
        elif stripped.startswith("#"):
            if pending is not None:
                pending.append(stripped.lstrip("#").strip())
        elif match := re.match(r"^( *)([A-Za-z0-9_]+):", line):
            indent, key = len(match.group(1)), match.group(2)
            stack = [(i, k) for i, k in stack if i < indent]
            stack.append((indent, key))
            if pending is not None:
                found[".".join(k for _, k in stack)] = " ".join(pending)
            pending = None
        elif not stripped:
            pending = None
    return found


def _schema(value: Any, path: str, docs: dict[str, str]) -> dict[str, Any]:
    node: dict[str, Any]
    if path in FREE_FORM or (isinstance(value, dict) and not value):
        node = {"type": "object"}
    elif isinstance(value, dict):
        node = {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: _schema(v, f"{path}.{k}".lstrip("."), docs) for k, v in value.items()},
        }
    elif isinstance(value, list):
        node = {"type": "array", "items": LIST_ITEMS.get(path) or (_schema(value[0], path, {}) if value else {})}
    elif isinstance(value, bool):
        node = {"type": "boolean"}
    elif isinstance(value, int):
        node = {"type": "integer"}
    elif isinstance(value, float):
        node = {"type": "number"}
    else:
        node = {"type": "string"}
    if path in docs:
        node = {"description": docs[path], **node}
    return {**node, **CONSTRAINTS.get(path, {})}


def values_schema(values_text: str) -> dict[str, Any]:
    """The JSON schema of the chart's values (draft 7, what helm validates with)."""
    root = _schema(yaml.safe_load(values_text), "", descriptions(values_text))
    return {"$schema": "http://json-schema.org/draft-07/schema#", "title": "pdfleet chart values", **root}


def schema_file(values_text: str) -> str:
    """values.schema.json's exact text."""
    return json.dumps(values_schema(values_text), indent=2) + "\n"


def _rows(value: Any, path: str, docs: dict[str, str]) -> list[tuple[str, str, str, str]]:
    if isinstance(value, dict) and value and path not in FREE_FORM:
        return [row for k, v in value.items() for row in _rows(v, f"{path}.{k}".lstrip("."), docs)]
    kind = _schema(value, path, {})["type"]
    default = json.dumps(value, separators=(", ", ": ")) if not isinstance(value, str) else json.dumps(value)
    return [(path, kind, default, docs.get(path, ""))]


README_HEAD = """# pdfleet Helm chart

<!-- Generated by scripts/render_manifests.py from values.yaml (pdfleet.chart.values). Do not edit by hand. -->

The pdfleet operator for prefill/decode-disaggregated LLM inference fleets: the `PDDeployment` CRD, the operator
Deployment, its RBAC, optional Prometheus Operator monitors and SLA alerts, and Grafana dashboards.

```sh
helm install pdfleet charts/pdfleet --namespace pdfleet-system --create-namespace
helm uninstall pdfleet --namespace pdfleet-system
```

Values are checked against `values.schema.json` (generated from the table below): an unknown key or a wrong type fails
the install instead of rendering nothing. Building the image and everything else about installing: `docs/install.md`.

## Values

| Key | Type | Default | Description |
|---|---|---|---|
"""


def readme_file(values_text: str) -> str:
    """The chart's README.md: how to install, and one row per value (key, type, default, its `# --` comment)."""
    docs = descriptions(values_text)
    rows = _rows(yaml.safe_load(values_text), "", docs)
    return README_HEAD + "".join(f"| `{k}` | {t} | `{_cell(d)}` | {_cell(text)} |\n" for k, t, d, text in rows)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")  # a table cell ends at an unescaped pipe
