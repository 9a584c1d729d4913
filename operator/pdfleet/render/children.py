"""Every child object of a PDDeployment except the router's fleet-view ConfigMap (which follows pod readiness)."""

from __future__ import annotations

from typing import Any

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentSpec
from pdfleet.render.meta import Owner
from pdfleet.render.pdb import render_pool_pdb, render_router_pdb
from pdfleet.render.router import render_router_deployment
from pdfleet.render.router_access import AdminClients, render_router_network_policy
from pdfleet.render.services import render_cell_service, render_pool_service, render_router_service
from pdfleet.render.statefulset import render_cell_statefulset
from pdfleet.topology.placement import Placement


def render_fleet(
    owner: Owner,
    spec: PDDeploymentSpec,
    placement: Placement,
    *,
    pdb_api_version: str,
    operator_image: str,
    admin_clients: AdminClients = AdminClients(),
) -> list[dict[str, Any]]:
    """Pool Services and PDBs, per-cell headless Services and StatefulSets, router Service, Deployment, PDB and
    NetworkPolicy, in a fixed order. Both pools always get their Service and PDB, so the object set changes only with
    the cells."""
    objects: list[dict[str, Any]] = []
    for pool in POOLS:
        objects += [render_pool_service(owner, spec, pool), render_pool_pdb(owner, pool, pdb_api_version)]
        for cell in placement.pool_cells(pool):
            objects += [render_cell_service(owner, spec, cell), render_cell_statefulset(owner, spec, cell)]
    objects += [render_router_service(owner, spec), render_router_deployment(owner, spec, operator_image)]
    objects += [render_router_pdb(owner, pdb_api_version), render_router_network_policy(owner, spec, admin_clients)]
    return objects
