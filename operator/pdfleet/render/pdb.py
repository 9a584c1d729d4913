"""PodDisruptionBudget per pool: voluntary disruptions (drains, upgrades) take at most one engine at a time."""

from __future__ import annotations

from typing import Any

from pdfleet.render.meta import Owner, component_labels, object_meta, selector_labels
from pdfleet.topology.names import pool_name

PDB_API_VERSIONS = ("policy/v1", "policy/v1beta1")


def render_pool_pdb(owner: Owner, pool: str, api_version: str) -> dict[str, Any]:
    """The pool's PDB (maxUnavailable 1) in `api_version`: "policy/v1", or "policy/v1beta1" before Kubernetes 1.21."""
    if api_version not in PDB_API_VERSIONS:
        raise ValueError(f"unsupported PodDisruptionBudget apiVersion {api_version!r}; use one of {PDB_API_VERSIONS}")
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(owner, pool_name(owner.name, pool), component_labels(owner.name, pool)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(owner.name, pool)}},
    }
