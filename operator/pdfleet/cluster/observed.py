"""What the operator observes of the cluster, reduced to small frozen records (pure functions of API objects).

The Kopf indexes store these records, so a reconcile reads the cluster from memory instead of the API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pdfleet.cluster.kube import APPLIED_HASH_ANNOTATION
from pdfleet.render.meta import LABEL_CELL, LABEL_COMPONENT, LABEL_POOL, LABEL_RACK, LABEL_ZONE


@dataclass(frozen=True)
class ChildState:
    """A child object the operator applied earlier, with the hash of what was applied and its rollout status."""

    kind: str
    name: str
    applied_hash: str | None
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    generation: int = 0
    observed_generation: int = 0


@dataclass(frozen=True)
class PodState:
    """An engine pod as the router and status care about it."""

    name: str
    component: str  # prefill | decode | router
    pool: str
    rack: str
    zone: str
    cell: str
    ip: str | None
    ready: bool
    phase: str
    unschedulable_message: str | None
    terminating: bool


def _condition(conditions: list[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == type_), None)


def child_state(body: Mapping[str, Any]) -> ChildState:
    meta = body.get("metadata", {})
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    return ChildState(
        kind=body["kind"],
        name=meta["name"],
        applied_hash=(meta.get("annotations") or {}).get(APPLIED_HASH_ANNOTATION),
        replicas=int(spec.get("replicas") or 0),
        ready_replicas=int(status.get("readyReplicas") or 0),
        updated_replicas=int(status.get("updatedReplicas") or 0),
        generation=int(meta.get("generation") or 0),
        observed_generation=int(status.get("observedGeneration") or 0),
    )


def pod_state(body: Mapping[str, Any]) -> PodState:
    meta = body.get("metadata", {})
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    ready = _condition(status.get("conditions"), "Ready")
    scheduled = _condition(status.get("conditions"), "PodScheduled")
    unschedulable = (
        scheduled.get("message") or "unschedulable"
        if scheduled and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable"
        else None
    )
    return PodState(
        name=meta["name"],
        component=labels.get(LABEL_COMPONENT, ""),
        pool=labels.get(LABEL_POOL, ""),
        rack=labels.get(LABEL_RACK, ""),
        zone=labels.get(LABEL_ZONE, ""),
        cell=labels.get(LABEL_CELL, ""),
        ip=status.get("podIP"),
        ready=bool(ready and ready.get("status") == "True"),
        phase=status.get("phase", "Unknown"),
        unschedulable_message=unschedulable,
        terminating=bool(meta.get("deletionTimestamp")),
    )


def node_summary(body: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of a Node that placement reads (topology label keys vary per PDDeployment, so keep all labels)."""
    return {
        "metadata": {"name": body["metadata"]["name"], "labels": dict(body["metadata"].get("labels") or {})},
        "spec": {
            "unschedulable": bool((body.get("spec") or {}).get("unschedulable")),
            "taints": list((body.get("spec") or {}).get("taints") or []),
        },
        "status": {
            "allocatable": dict((body.get("status") or {}).get("allocatable") or {}),
            "conditions": [
                {"type": c.get("type"), "status": c.get("status")}
                for c in (body.get("status") or {}).get("conditions") or []
            ],
        },
    }
