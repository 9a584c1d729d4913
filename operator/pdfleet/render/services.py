"""Services: a headless Service per cell (stable pod DNS), a ClusterIP Service per pool, the router Service (data
port only: the operator reaches the admin port on the router pods' IPs)."""

from __future__ import annotations

from typing import Any

from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import ROUTER_COMPONENT, Owner, component_labels, object_meta, selector_labels
from pdfleet.render.statefulset import ENGINE_PORT_NAME, cell_labels, cell_selector
from pdfleet.topology.names import pool_name, router_name
from pdfleet.topology.placement import Cell

ROUTER_PORT_NAME = "http"
ROUTER_ADMIN_PORT_NAME = "admin"


def _port(name: str, port: int) -> dict[str, Any]:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def _service(
    owner: Owner,
    name: str,
    labels: dict[str, str],
    selector: dict[str, str],
    ports: list[dict[str, Any]],
    *,
    headless: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector, "ports": ports}
    if headless:
        spec["clusterIP"] = "None"
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": object_meta(owner, name, labels), "spec": spec}


def render_cell_service(owner: Owner, spec: PDDeploymentSpec, cell: Cell) -> dict[str, Any]:
    """Headless Service named like the cell's StatefulSet (its serviceName)."""
    ports = [_port(ENGINE_PORT_NAME, spec.engine.port)]
    return _service(owner, cell.name, cell_labels(owner, cell), cell_selector(owner, cell), ports, headless=True)


def render_pool_service(owner: Owner, spec: PDDeploymentSpec, pool: str) -> dict[str, Any]:
    """ClusterIP Service over every pod of `pool` (observability, ad-hoc requests)."""
    ports = [_port(ENGINE_PORT_NAME, spec.engine.port)]
    labels = component_labels(owner.name, pool)
    return _service(owner, pool_name(owner.name, pool), labels, selector_labels(owner.name, pool), ports)


def render_router_service(owner: Owner, spec: PDDeploymentSpec) -> dict[str, Any]:
    """ClusterIP Service of the router for clients: the data port only."""
    ports = [_port(ROUTER_PORT_NAME, spec.router.port)]
    labels = component_labels(owner.name, ROUTER_COMPONENT)
    return _service(owner, router_name(owner.name), labels, selector_labels(owner.name, ROUTER_COMPONENT), ports)
