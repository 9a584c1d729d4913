"""The router: its Deployment, and the ConfigMap that carries its fleet view (fleet.json, built by
`pdfleet.render.fleet_view`). Its admin token Secret and NetworkPolicy: `pdfleet.render.router_access`."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.fleet_view import fleet_view_json
from pdfleet.render.meta import (
    POD_SECCOMP,
    RESTRICTED_CONTAINER,
    ROUTER_COMPONENT,
    Owner,
    component_labels,
    field_env,
    http_probe,
    object_meta,
    prometheus_annotations,
    selector_labels,
)
from pdfleet.render.router_access import ADMIN_TOKEN_DIR, ADMIN_TOKEN_FILE, admin_secret_name
from pdfleet.render.services import ROUTER_ADMIN_PORT_NAME, ROUTER_PORT_NAME
from pdfleet.topology.names import router_name

FLEET_FILE_KEY = "fleet.json"
FLEET_DIR = "/etc/pdfleet"
FLEET_FILE = f"{FLEET_DIR}/{FLEET_FILE_KEY}"
ROUTER_CONTAINER = "router"
# One asyncio process: it never uses much more than a core, so the CPU limit only caps a runaway; memory holds the
# in-flight streams.
ROUTER_RESOURCES = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
# The router is pdfleet's own image (the operator's by default), built to run as this non-root user; it writes no
# file, so its root filesystem is read-only (docs/security.md).
ROUTER_UID = 65532
ROUTER_POD_SECURITY = {"runAsNonRoot": True, "runAsUser": ROUTER_UID, "runAsGroup": ROUTER_UID, **POD_SECCOMP}
ROUTER_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": RESTRICTED_CONTAINER["capabilities"],
}


def render_router_configmap(owner: Owner, fleet_view: Mapping[str, Any]) -> dict[str, Any]:
    """ConfigMap `<pdd>-router` with key fleet.json (the view as `fleet_view_json` writes it), mounted into the
    router at /etc/pdfleet."""
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
        "--admin-token-file", ADMIN_TOKEN_FILE,
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
        "resources": copy.deepcopy(ROUTER_RESOURCES),
        "readinessProbe": http_probe("/ready", ROUTER_ADMIN_PORT_NAME, period=2, timeout=2, failures=3),
        "livenessProbe": http_probe("/health", ROUTER_ADMIN_PORT_NAME, period=10, timeout=5, failures=3),
        "volumeMounts": [
            {"name": "fleet", "mountPath": FLEET_DIR, "readOnly": True},
            {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
        ],
        "securityContext": copy.deepcopy(ROUTER_CONTAINER_SECURITY),
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
                    "securityContext": copy.deepcopy(ROUTER_POD_SECURITY),
                    "containers": [container],
                    "volumes": [
                        {"name": "fleet", "configMap": {"name": router_name(owner.name)}},
                        # default mode 0644: root owns the file, so the non-root router user needs the read bit
                        {"name": "admin-token", "secret": {"secretName": admin_secret_name(owner.name)}},
                    ],
                },
            },
        },
    }
