"""Node inventory: the facts placement needs about each Kubernetes Node, read from the Node object as a plain dict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pdfleet.api.model import GPU_RESOURCE, Toleration, TopologySpec

# Taint effects that keep new pods off a node (PreferNoSchedule only discourages).
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


@dataclass(frozen=True)
class Taint:
    """A node taint (key, value, effect)."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def tolerated_by(self, tolerations: list[Toleration]) -> bool:
        """Whether any toleration matches this taint (Kubernetes toleration semantics)."""
        return any(_tolerates(toleration, self) for toleration in tolerations)


def _tolerates(toleration: Toleration, taint: Taint) -> bool:
    if toleration.effect is not None and toleration.effect != taint.effect:
        return False
    if toleration.operator == "Exists":
        return toleration.key in (None, "", taint.key)
    return toleration.key == taint.key and (toleration.value or "") == taint.value


@dataclass(frozen=True)
class NodeInfo:
    """What placement needs to know about one node."""

    name: str
    rack: str | None
    zone: str | None
    gpu_product: str | None
    gpu_allocatable: int
    ready: bool
    schedulable: bool
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    taints: tuple[Taint, ...] = ()

    def blocking_taints(self) -> tuple[Taint, ...]:
        """Taints that keep pods without a matching toleration off this node."""
        return tuple(taint for taint in self.taints if taint.effect in BLOCKING_TAINT_EFFECTS)


def _count(quantity: Any) -> int:
    """Whole units of an extended-resource quantity ("8", 8); anything else counts as none."""
    try:
        return max(int(str(quantity)), 0)
    except (TypeError, ValueError):
        return 0


def _is_ready(conditions: list[dict[str, Any]]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_info(node: dict[str, Any], topology: TopologySpec) -> NodeInfo:
    """NodeInfo of a Node object given as Kubernetes API JSON (camelCase keys), labels read per `topology`."""
    metadata = node.get("metadata") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    labels = dict(metadata.get("labels") or {})
    taints = tuple(
        Taint(key=t.get("key", ""), value=t.get("value") or "", effect=t.get("effect", "NoSchedule"))
        for t in spec.get("taints") or []
    )
    return NodeInfo(
        name=metadata.get("name", ""),
        rack=labels.get(topology.rack_label) or None,
        zone=labels.get(topology.zone_label) or None,
        gpu_product=labels.get(topology.gpu_product_label) or None,
        gpu_allocatable=_count((status.get("allocatable") or {}).get(GPU_RESOURCE, 0)),
        ready=_is_ready(status.get("conditions") or []),
        schedulable=not spec.get("unschedulable", False),
        labels=labels,
        taints=taints,
    )
