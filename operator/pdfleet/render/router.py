"""The router: its Deployment, and the fleet view (fleet.json) the operator hands it through a ConfigMap."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import (
    LABEL_POOL,
    LABEL_RACK,
    LABEL_ZONE,
    ROUTER_COMPONENT,
    Owner,
    component_labels,
    field_env,
    http_probe,
    object_meta,
    prometheus_annotations,
    selector_labels,
)
from pdfleet.render.services import ROUTER_ADMIN_PORT_NAME, ROUTER_PORT_NAME
from pdfleet.topology.names import router_name

FLEET_VIEW_VERSION = 1
FLEET_FILE_KEY = "fleet.json"
FLEET_DIR = "/etc/pdfleet"
FLEET_FILE = f"{FLEET_DIR}/{FLEET_FILE_KEY}"
ROUTER_CONTAINER = "router"
ROUTER_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}}


def url_host(ip: str) -> str:
    """A pod IP as the host part of a URL (IPv6 in brackets)."""
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


@dataclass(frozen=True)
class Endpoint:
    """One Ready engine pod as the router sees it."""

    name: str
    pool: str
    url: str
    rack: str
    zone: str
    draining: bool = False

    @classmethod
    def from_pod(cls, pod: Mapping[str, Any], port: int, *, draining: bool = False) -> Endpoint:
        """The Endpoint of an engine pod (Kubernetes API JSON) serving on `port`; pool/rack/zone from its labels."""
        labels = pod["metadata"].get("labels") or {}
        return cls(
            name=pod["metadata"]["name"],
            pool=labels[LABEL_POOL],
            url=f"http://{url_host(pod['status']['podIP'])}:{port}",
            rack=labels.get(LABEL_RACK, ""),
            zone=labels.get(LABEL_ZONE, ""),
            draining=draining,
        )


def render_fleet_view(spec: PDDeploymentSpec, generation: int, endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """The fleet.json document: model, routing policy and endpoints (sorted by pool, then name)."""
    return {
        "version": FLEET_VIEW_VERSION,
        "generation": generation,
        "model": spec.model.served_name,
        "policy": spec.router.policy.model_dump(by_alias=True, mode="json"),
        "endpoints": [asdict(ep) for ep in sorted(endpoints, key=lambda ep: (ep.pool, ep.name))],
    }


def fleet_view_revision(fleet_view: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """status.fleetView for a view rendered without its revision: {"revision", "hash"}, the revision raised by one
    when the content differs from the previous record's. Routers take views by revision, so one pushed to them
    is not replaced by the older ConfigMap file the kubelet syncs later."""
    digest = hashlib.sha256(fleet_view_json(fleet_view).encode()).hexdigest()[:16]
    revision = int((previous or {}).get("revision") or 0)
    if (previous or {}).get("hash") != digest:
        revision += 1
    return {"revision": revision, "hash": digest}


def fleet_view_json(fleet_view: Mapping[str, Any]) -> str:
    """fleet.json text: sorted keys and fixed formatting, so an unchanged view is byte-identical."""
    return json.dumps(fleet_view, sort_keys=True, indent=2) + "\n"


def render_router_configmap(owner: Owner, fleet_view: Mapping[str, Any]) -> dict[str, Any]:
    """ConfigMap `<pdd>-router` with key fleet.json, mounted into the router at /etc/pdfleet."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": object_meta(owner, router_name(owner.name), component_labels(owner.name, ROUTER_COMPONENT)),
        "data": {FLEET_FILE_KEY: fleet_view_json(fleet_view)},
    }


def render_router_deployment(owner: Owner, spec: PDDeploymentSpec, operator_image: str) -> dict[str, Any]:
    """The router Deployment; its image defaults to the operator's own."""
    router = spec.router
    labels = component_labels(owner.name, ROUTER_COMPONENT)
    command = [
        "pdfleet", "router",
        "--fleet-file", FLEET_FILE,
        "--port", str(router.port),
        "--admin-port", str(router.admin_port),
    ]  # fmt: skip
    container = {
        "name": ROUTER_CONTAINER,
        "image": router.image or operator_image,
        "command": command,
        "ports": [
            {"name": ROUTER_PORT_NAME, "containerPort": router.port, "protocol": "TCP"},
            {"name": ROUTER_ADMIN_PORT_NAME, "containerPort": router.admin_port, "protocol": "TCP"},
        ],
        "env": [field_env("POD_NAME", "metadata.name"), field_env("POD_NAMESPACE", "metadata.namespace")],
        "resources": ROUTER_RESOURCES,
        "readinessProbe": http_probe("/ready", ROUTER_ADMIN_PORT_NAME, period=2, timeout=2, failures=3),
        "livenessProbe": http_probe("/health", ROUTER_ADMIN_PORT_NAME, period=10, timeout=5, failures=3),
        "volumeMounts": [{"name": "fleet", "mountPath": FLEET_DIR, "readOnly": True}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(owner, router_name(owner.name), labels),
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, ROUTER_COMPONENT)},
            # Never drop below the desired router count during a rollout: the router is the fleet's front door.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": prometheus_annotations(router.admin_port)},
                "spec": {
                    "automountServiceAccountToken": False,  # the router reads a mounted file, never the API
                    "containers": [container],
                    "volumes": [{"name": "fleet", "configMap": {"name": router_name(owner.name)}}],
                },
            },
        },
    }
