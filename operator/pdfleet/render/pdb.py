"""PodDisruptionBudgets: voluntary disruptions (drains, upgrades) take at most one engine per pool, and one router, at
a time."""

from __future__ import annotations

from typing import Any

from pdfleet.render.meta import ROUTER_COMPONENT, Owner, component_labels, object_meta, selector_labels
from pdfleet.topology.names import pool_name, router_name

PDB_API_VERSIONS = ("policy/v1", "policy/v1beta1")


def _pdb(owner: Owner, name: str, component: str, api_version: str) -> dict[str, Any]:
    if api_version not in PDB_API_VERSIONS:
        raise ValueError(f"unsupported PodDisruptionBudget apiVersion {api_version!r}; use one of {PDB_API_VERSIONS}")
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(owner, name, component_labels(owner.name, component)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name, component)}},
    }


def render_pool_pdb(owner: Owner, pool: str, api_version: str) -> dict[str, Any]:
    """The pool's PDB (maxUnavailable 1) in `api_version`: "policy/v1", or "policy/v1beta1" before Kubernetes 1.21."""
    return _pdb(owner, pool_name(owner.name, pool), pool, api_version)


def render_router_pdb(owner: Owner, api_version: str) -> dict[str, Any]:
    """The router's PDB `<pdd>-router` (maxUnavailable 1): a node drain evicts one router at a time, so with two or
    more replicas the fleet keeps a front door; with one it never blocks the drain."""
    return _pdb(owner, router_name(owner.name), ROUTER_COMPONENT, api_version)
