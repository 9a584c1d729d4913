"""What runs, kept in memory by Kopf: Nodes, the fleets' pods and their children, indexed per PDDeployment.

Both controllers read these indexes (Kopf passes them to handlers by function name) instead of listing the API.
Keys: `(namespace, PDDeployment name)`; the node index has the single key None.
"""

from __future__ import annotations

import copy
from typing import Any

import kopf

from pdfleet.cluster.observed import child_state, node_summary, pod_state
from pdfleet.render.meta import LABEL_INSTANCE, LABEL_MANAGED_BY, MANAGED_BY

MANAGED = {LABEL_MANAGED_BY: MANAGED_BY}


@kopf.index("nodes")
def node_index(body: kopf.Body, **_: Any) -> dict:
    return {None: node_summary(body)}


@kopf.index("pods", labels=MANAGED)
def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return {(namespace, labels.get(LABEL_INSTANCE, "")): pod_state(body)}


def _index_children(namespace: str, labels: kopf.Labels, body: kopf.Body) -> dict:
    return {(namespace, labels.get(LABEL_INSTANCE, "")): child_state(body)}


@kopf.index("apps", "v1", "statefulsets", labels=MANAGED)
def statefulset_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


@kopf.index("apps", "v1", "deployments", labels=MANAGED)
def deployment_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


@kopf.index("v1", "services", labels=MANAGED)
def service_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


@kopf.index("v1", "configmaps", labels=MANAGED)
def configmap_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


@kopf.index("policy", "poddisruptionbudgets", labels=MANAGED)
def pdb_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=MANAGED)
def networkpolicy_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict:
    return _index_children(namespace, labels, body)


CHILD_INDEXES = (
    "statefulset_index",
    "deployment_index",
    "service_index",
    "configmap_index",
    "pdb_index",
    "networkpolicy_index",
)


def index_snapshot(index: kopf.Index, key: Any) -> list:
    """A plain list of what `index` holds under `key` now."""
    return list(index.get(key, []))


def body_snapshot(body: kopf.Body) -> dict[str, Any]:
    """A plain, private copy of Kopf's live body view: a controller must see one consistent version."""
    return copy.deepcopy(dict(body))
