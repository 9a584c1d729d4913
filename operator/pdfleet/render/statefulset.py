"""The StatefulSet of one (pool, rack) cell: engine pods pinned to the cell's rack."""

from __future__ import annotations

import copy
from typing import Any

from pdfleet.api.model import GPU_RESOURCE, PDDeploymentSpec, PoolSpec
from pdfleet.render.engine_args import render_engine_command, render_kv_transfer_env, render_kv_transfer_ports
from pdfleet.render.meta import (
    LABEL_CELL,
    LABEL_RACK,
    LABEL_ZONE,
    POD_SECCOMP,
    RESTRICTED_CONTAINER,
    Owner,
    component_labels,
    field_env,
    http_probe,
    object_meta,
    prometheus_annotations,
    selector_labels,
)
from pdfleet.topology.placement import Cell

ENGINE_CONTAINER = "engine"
ENGINE_PORT_NAME = "http"
# Model loading can take many minutes: the startup probe allows 30 min before liveness takes over.
STARTUP_PROBE = {"period": 10, "timeout": 5, "failures": 180}
READINESS_PROBE = {"period": 5, "timeout": 2, "failures": 3}
LIVENESS_PROBE = {"period": 10, "timeout": 5, "failures": 6}


def cell_selector(owner: Owner, cell: Cell) -> dict[str, str]:
    """Immutable StatefulSet selector (and headless Service selector) of a cell."""
    return {**selector_labels(owner.name, cell.pool), LABEL_CELL: cell.name}


def cell_labels(owner: Owner, cell: Cell) -> dict[str, str]:
    """Labels of a cell's StatefulSet, pods and headless Service."""
    cell_keys = {LABEL_RACK: cell.rack, LABEL_ZONE: cell.zone, LABEL_CELL: cell.name}
    return {**component_labels(owner.name, cell.pool), **cell_keys}


def _env(spec: PDDeploymentSpec, cell: Cell) -> list[dict[str, Any]]:
    env = [
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
        {"name": "PDFLEET_POOL", "value": cell.pool},
        {"name": "PDFLEET_RACK", "value": cell.rack},
        {"name": "PDFLEET_ZONE", "value": cell.zone},
        *render_kv_transfer_env(spec, cell.pool),
    ]
    user = [var.model_dump(by_alias=True, exclude_none=True) for var in spec.engine.env]
    # env is keyed by name for server-side apply: a user variable replaces pdfleet's of the same name.
    overridden = {var["name"] for var in user}
    return [var for var in env if var["name"] not in overridden] + user


def _resources(pool: PoolSpec) -> dict[str, Any]:
    amounts = dict(sorted(pool.resources.items()))
    if pool.gpus_per_replica:
        amounts[GPU_RESOURCE] = str(pool.gpus_per_replica)
    # requests == limits: GPU pods get Guaranteed QoS (exclusive CPUs, no memory overcommit).
    return {"limits": amounts, "requests": dict(amounts)} if amounts else {}


def _security_context(spec: PDDeploymentSpec) -> dict[str, Any]:
    """The engine container's SecurityContext: pdfleet's restrictions, then spec.engine.securityContext key by key.

    Not runAsNonRoot by default: vLLM's image runs as root. Not readOnlyRootFilesystem: the engine downloads the model
    and writes compile caches under $HOME and /tmp, and the spec mounts no volume for them (docs/security.md).
    """
    return {**copy.deepcopy(RESTRICTED_CONTAINER), **copy.deepcopy(spec.engine.security_context or {})}


def _affinity(spec: PDDeploymentSpec, cell: Cell) -> dict[str, Any] | None:
    pool = spec.pool(cell.pool)
    expressions = []
    if spec.topology.placement != "Unconstrained":
        expressions.append({"key": spec.topology.rack_label, "operator": "In", "values": [cell.rack]})
    if pool.gpu_product:
        expressions.append({"key": spec.topology.gpu_product_label, "operator": "In", "values": [pool.gpu_product]})
    if not expressions:
        return None
    terms = [{"matchExpressions": expressions}]
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _pod_spec(spec: PDDeploymentSpec, cell: Cell) -> dict[str, Any]:
    pool = spec.pool(cell.pool)
    command, args = render_engine_command(spec, cell.pool)
    container = {
        "name": ENGINE_CONTAINER,
        "image": spec.engine.image,
        "command": command,
        "args": args,
        "ports": [
            {"name": ENGINE_PORT_NAME, "containerPort": spec.engine.port, "protocol": "TCP"},
            *render_kv_transfer_ports(spec, cell.pool),
        ],
        "env": _env(spec, cell),
        "resources": _resources(pool),
        "startupProbe": http_probe("/health", ENGINE_PORT_NAME, **STARTUP_PROBE),
        "readinessProbe": http_probe("/health", ENGINE_PORT_NAME, **READINESS_PROBE),
        "livenessProbe": http_probe("/health", ENGINE_PORT_NAME, **LIVENESS_PROBE),
        # Tensor-parallel workers share tensors through /dev/shm; the container default (64 MiB) is too small.
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        "securityContext": _security_context(spec),
    }
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never call the Kubernetes API
        "securityContext": copy.deepcopy(POD_SECCOMP),
        "containers": [container],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    affinity = _affinity(spec, cell)
    if affinity:
        pod["affinity"] = affinity
    if pool.node_selector:
        pod["nodeSelector"] = dict(sorted(pool.node_selector.items()))
    if pool.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in pool.tolerations]
    return pod


def render_cell_statefulset(owner: Owner, spec: PDDeploymentSpec, cell: Cell) -> dict[str, Any]:
    """The StatefulSet of `cell` (prefill or decode alike), ready for server-side apply."""
    labels = cell_labels(owner, cell)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": object_meta(owner, cell.name, labels),
        "spec": {
            "replicas": cell.replicas,
            "serviceName": cell.name,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "RollingUpdate"},
            "selector": {"matchLabels": cell_selector(owner, cell)},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": prometheus_annotations(spec.engine.port)},
                "spec": _pod_spec(spec, cell),
            },
        },
    }
