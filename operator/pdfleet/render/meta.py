"""Owner, labels and metadata shared by every object a PDDeployment renders (the label contract of the architecture
doc lives here)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdfleet import API_GROUP, API_VERSION, KIND

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_POOL = "pdfleet.dev/pool"
LABEL_RACK = "pdfleet.dev/rack"
LABEL_ZONE = "pdfleet.dev/zone"
LABEL_CELL = "pdfleet.dev/cell"
APP_NAME = "pdfleet"
MANAGED_BY = "pdfleet-operator"
ROUTER_COMPONENT = "router"


@dataclass(frozen=True)
class Owner:
    """The PDDeployment that owns the rendered objects."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> Owner:
        """The Owner of a PDDeployment object given as Kubernetes API JSON."""
        metadata = obj["metadata"]
        return cls(name=metadata["name"], namespace=metadata["namespace"], uid=metadata["uid"])

    def owner_reference(self) -> dict[str, Any]:
        """ownerReferences entry making the PDDeployment the controller of a child (garbage-collected with it)."""
        return {
            "apiVersion": f"{API_GROUP}/{API_VERSION}",
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def selector_labels(instance: str, component: str) -> dict[str, str]:
    """Labels that select every pod of one component (prefill, decode or router) of one PDDeployment."""
    labels = {LABEL_NAME: APP_NAME, LABEL_INSTANCE: instance}
    if component == ROUTER_COMPONENT:
        labels[LABEL_COMPONENT] = ROUTER_COMPONENT
    else:
        labels[LABEL_POOL] = component
    return labels


def component_labels(instance: str, component: str) -> dict[str, str]:
    """The full label set of the doc's table for objects of one component (without the per-cell labels)."""
    labels = {LABEL_NAME: APP_NAME, LABEL_INSTANCE: instance, LABEL_COMPONENT: component, LABEL_MANAGED_BY: MANAGED_BY}
    if component != ROUTER_COMPONENT:
        labels[LABEL_POOL] = component
    return labels


def object_meta(
    owner: Owner, name: str, labels: Mapping[str, str], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """metadata for a child object: name, owner's namespace, labels, controller ownerReference."""
    metadata: dict[str, Any] = {"name": name, "namespace": owner.namespace, "labels": dict(labels)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    metadata["ownerReferences"] = [owner.owner_reference()]
    return metadata


# Pod hardening every pdfleet pod gets (docs/security.md): the container runtime's default seccomp filter, no
# privilege escalation (setuid binaries, no_new_privs), no Linux capabilities.
POD_SECCOMP = {"seccompProfile": {"type": "RuntimeDefault"}}
RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def prometheus_annotations(port: int) -> dict[str, str]:
    """Pod annotations asking Prometheus to scrape /metrics on `port`."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}


def http_probe(path: str, port: str, *, period: int, timeout: int, failures: int) -> dict[str, Any]:
    """An HTTP GET probe on a named container port."""
    return {
        "httpGet": {"path": path, "port": port, "scheme": "HTTP"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def field_env(name: str, field_path: str) -> dict[str, Any]:
    """An env var from the downward API (apiVersion spelled out, as the apiserver would default it)."""
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": field_path}}}
