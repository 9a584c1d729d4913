"""The reconcile decision as a pure function: observed cluster state in, writes and status out.

`plan_reconcile` never talks to the API. It returns the objects to server-side apply (only those whose applied hash
differs from what runs, so an unchanged PDDeployment yields zero writes), the stale children to delete (only after a
valid spec and placement, so a bad update never tears anything down), the new status and the events to emit (only on
condition transitions, since events are writes too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pdfleet import POOLS
from pdfleet.api.model import (
    PDDeploymentSpec,
    PoolSpec,
    PoolStatus,
    SpecError,
    applied_unknown_fields,
    parse_spec,
    validate_name,
)
from pdfleet.cluster.events import Event
from pdfleet.cluster.kube import APPLIED_HASH_ANNOTATION, with_applied_hash
from pdfleet.cluster.observed import ChildState, PodState
from pdfleet.render.children import render_fleet
from pdfleet.render.fleet_view import build_fleet_view
from pdfleet.render.meta import Owner, selector_labels
from pdfleet.render.router import render_router_configmap
from pdfleet.render.router_access import AdminClients
from pdfleet.topology.inventory import node_info
from pdfleet.topology.names import router_name
from pdfleet.topology.placement import Placement, PlacementError, plan_placement

DEFAULT_REPLICAS = PoolSpec.model_fields["replicas"].default


@dataclass(frozen=True)
class RouterView:
    """The fleet view of the router ConfigMap, to PUT to each running router's admin port ahead of the kubelet's
    sync."""

    view: dict[str, Any]
    admin_port: int


@dataclass(frozen=True)
class ReconcilePlan:
    applies: tuple[dict, ...] = ()
    deletes: tuple[tuple[str, str], ...] = ()  # (kind, name)
    status: dict[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    router_view: RouterView | None = None  # what every router should run (None while the spec is bad)


def _condition(type_: str, ok: bool, reason: str, message: str) -> dict[str, str]:
    return {"type": type_, "status": "True" if ok else "False", "reason": reason, "message": message}


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[dict[str, str]], now: str
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Carry lastTransitionTime over unchanged conditions; return (conditions, the ones that changed)."""
    previous = {c.get("type"): c for c in old or []}
    merged, changed = [], []
    for cond in new:
        before = previous.get(cond["type"])
        same = before is not None and before.get("status") == cond["status"] and before.get("reason") == cond["reason"]
        stamp = before.get("lastTransitionTime", now) if same and before else now
        merged.append({**cond, "lastTransitionTime": stamp})
        if not same:
            changed.append(cond)
    return merged, changed


def pool_status(pool: str, desired: int, pods: Sequence[PodState], pdd_name: str = "") -> dict[str, Any]:
    """status.<pool>: replica counts and the label selector of the pool's pods (what the scale subresource reports)."""
    mine = [p for p in pods if p.pool == pool and not p.terminating]
    selector = ",".join(f"{key}={value}" for key, value in selector_labels(pdd_name, pool).items()) if pdd_name else ""
    return PoolStatus.of(desired, len(mine), sum(p.ready for p in mine), selector).model_dump(by_alias=True)


def asked_replicas(spec: Any, pool: str) -> int:
    """spec.<pool>.replicas of a spec that did not validate: the count it asks for, its default when unset, else 0."""
    pool_spec = spec.get(pool) if isinstance(spec, Mapping) else None
    value = pool_spec.get("replicas", DEFAULT_REPLICAS) if isinstance(pool_spec, Mapping) else DEFAULT_REPLICAS
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def cell_status(placement: Placement, pods: Sequence[PodState]) -> list[dict[str, Any]]:
    return [
        {
            "name": c.name,
            "pool": c.pool,
            "rack": c.rack,
            "zone": c.zone,
            "desired": c.replicas,
            "ready": sum(p.ready and not p.terminating for p in pods if p.cell == c.name),
        }
        for c in placement.cells
    ]


UNKNOWN_FIELDS_SHOWN = 20  # field paths named in the UnknownFields condition; the rest are counted


def unknown_fields_condition(unknown: Sequence[str], previous: Mapping[str, Any] | None) -> dict[str, str] | None:
    """UnknownFields: True naming the fields the API server dropped (they have no effect); False once they are gone
    (only when it was reported before, so a fleet that never had a typo shows no such condition)."""
    if unknown:
        shown = ", ".join(unknown[:UNKNOWN_FIELDS_SHOWN])
        more = f" and {len(unknown) - UNKNOWN_FIELDS_SHOWN} more" if len(unknown) > UNKNOWN_FIELDS_SHOWN else ""
        return _condition(
            "UnknownFields",
            True,
            "UnknownFields",
            f"the API server dropped fields pdfleet does not know, so they have no effect: {shown}{more}"
            " (check the spelling: fields are camelCase; `kubectl apply --validate=strict` rejects them on API"
            " servers with field validation)",
        )
    if previous is not None:
        return _condition("UnknownFields", False, "NoUnknownFields", "every applied spec field is known")
    return None


def _fleet_conditions(
    pools: Mapping[str, Mapping[str, Any]],
    placed: Mapping[str, int],
    children: Sequence[ChildState],
    pods: Sequence[PodState],
    stalled: tuple[str, str],
) -> list[dict[str, str]]:
    """Ready / Progressing from what runs against what the spec asks. `placed`: replicas per pool the operator runs
    cells for; `stalled`: (reason, message) of why the rest of what the spec asks cannot come (by waiting)."""
    unschedulable = sorted({p.unschedulable_message for p in pods if p.unschedulable_message})
    routers = [c for c in children if c.kind == "Deployment"]
    router_ready = any(c.ready_replicas > 0 for c in routers)
    # a prefill pool may be at zero (the router then serves every request whole on a decode); decode may not
    pools_ready = all(pools[p]["readyReplicas"] >= pools[p]["desiredReplicas"] for p in POOLS)
    pools_ready = pools_ready and pools["decode"]["desiredReplicas"] > 0
    rolling = [
        c.name
        for c in children
        if c.kind in ("StatefulSet", "Deployment")
        and (c.observed_generation < c.generation or c.updated_replicas < c.replicas)
    ]
    not_ready = [f"{p} {pools[p]['summary']}" for p in POOLS if pools[p]["readyReplicas"] < pools[p]["desiredReplicas"]]
    coming = [p for p in POOLS if pools[p]["readyReplicas"] < min(placed[p], pools[p]["desiredReplicas"])]
    if pools_ready and router_ready:
        served = "all prefill and decode replicas and the router are ready"
        if pools["prefill"]["desiredReplicas"] == 0:
            served = "the decode replicas and the router are ready; no prefill replicas: decodes serve requests whole"
        ready = _condition("Ready", True, "FleetReady", served)
    elif unschedulable:
        ready = _condition("Ready", False, "Unschedulable", "pods cannot be scheduled: " + "; ".join(unschedulable))
    elif not_ready and not coming:
        ready = _condition("Ready", False, stalled[0], f"{', '.join(not_ready)}: {stalled[1]}")
    else:
        waiting = not_ready + ([] if router_ready else ["router not ready"])
        ready = _condition("Ready", False, "Waiting", "waiting for " + ", ".join(waiting))
    if unschedulable:  # a rollout or scale-up that waits on the scheduler is not progressing
        progressing = _condition(
            "Progressing", False, "Unschedulable", "pods cannot be scheduled: " + "; ".join(unschedulable)
        )
    elif rolling:
        progressing = _condition("Progressing", True, "RollingOut", "rolling out " + ", ".join(rolling))
    elif coming:
        progressing = _condition("Progressing", True, "ScalingPods", "replicas not ready: " + ", ".join(not_ready))
    elif not_ready:
        progressing = _condition("Progressing", False, stalled[0], f"{', '.join(not_ready)}: {stalled[1]}")
    else:
        progressing = _condition("Progressing", False, "Stable", "fleet matches its spec")
    return [ready, progressing]


def router_serves_condition(spec: PDDeploymentSpec | None, previous: Mapping[str, Any] | None) -> dict[str, str] | None:
    """RouterServes: False for an engine whose PD handshake the router does not speak (SGLang), True again once the
    engine is one it does (only when it was reported before, so a vLLM fleet shows no such condition)."""
    if spec is not None and spec.engine.kind != "vllm":
        return _condition(
            "RouterServes",
            False,
            "EngineNotServedByRouter",
            f"the router speaks only vLLM's prefill/decode handshake, so it cannot serve disaggregated requests through"
            f" {spec.engine.kind} engines yet; the engines are deployed, reach them through their pool Services",
        )
    if previous is not None and spec is not None:
        return _condition("RouterServes", True, "EngineServedByRouter", f"the router serves {spec.engine.kind}")
    return None


def sla_condition(spec: PDDeploymentSpec | None, autoscaler: Mapping[str, Any]) -> dict[str, str]:
    """SLAMet from the latency signals the autoscaler last read (autoscaled pools only): each pool's percentile
    against its SLA target (TTFT for prefill, TPOT for decode)."""
    metrics = autoscaler.get("metrics") or {}
    measured: list[tuple[str, float, float]] = []
    if spec is not None and metrics.get("available"):
        label = f"p{spec.sla.percentile:g}"
        for pool, signal, target in (
            ("prefill", f"ttft_{label}_ms", spec.sla.ttft_ms),
            ("decode", f"itl_{label}_ms", spec.sla.tpot_ms),
        ):
            value = ((autoscaler.get(pool) or {}).get("signals") or {}).get(signal)
            if spec.pool(pool).autoscaling.enabled and isinstance(value, (int, float)):
                measured.append((f"{pool} {'TTFT' if pool == 'prefill' else 'TPOT'} {label}", value, target))
    if not measured:
        return {
            "type": "SLAMet",
            "status": "Unknown",
            "reason": "NotMeasured",
            "message": "no latency reading: the autoscaler reads it from Prometheus for autoscaled pools with traffic",
        }
    text = ", ".join(
        f"{what} {value:.0f} ms {'>' if value > target else '<='} {target:g} ms" for what, value, target in measured
    )
    violated = any(value > target for _, value, target in measured)
    return _condition("SLAMet", not violated, "Violated" if violated else "Met", text)


def _short(value: float) -> str:
    """A number as whole units from 10 up, else two significant digits (1462.3 -> "1462", 7.52 -> "7.5")."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def attainable_condition(spec: PDDeploymentSpec | None, autoscaler: Mapping[str, Any]) -> dict[str, str]:
    """SLAAttainable from the latency floor the autoscaler last reported per autoscaled pool: `latency_floor_ms` (the
    latency no replica count removes), `target_unattainable` (1 when the pool's target is below it) and
    `unattainable_requests_ratio` (the share of the window's requests whose own floor is over the target). False
    when a pool's target is below its floor: adding replicas cannot help. True with reason RequestsOverFloor when the
    target is attainable but some requests are not."""
    unattainable: list[str] = []
    over_floor: list[str] = []
    attainable: list[str] = []
    if spec is not None:
        label = f"p{spec.sla.percentile:g}"
        for pool in POOLS:
            signals = (autoscaler.get(pool) or {}).get("signals") or {}
            floor = signals.get("latency_floor_ms")
            flag = signals.get("target_unattainable")
            ratio = signals.get("unattainable_requests_ratio")
            if not spec.pool(pool).autoscaling.enabled or (not isinstance(floor, (int, float)) and flag != 1):
                continue
            what, own = ("TTFT", "their own prefill") if pool == "prefill" else ("TPOT", "their own decode steps")
            target_ms = spec.target_latency_ms(pool)
            target = f"{what} {label} target {target_ms:g} ms"
            floor_text = f"{_short(floor)} ms" if isinstance(floor, (int, float)) else "unknown"
            share = (
                f"{_short(ratio * 100)} % of {pool} requests need more than the {target_ms:g} ms {what} target on an"
                f" idle replica ({own})"
                if isinstance(ratio, (int, float))
                else ""
            )
            if flag == 1:
                unattainable.append(
                    f"{pool} {target} is below its floor ({floor_text})" + (f"; {share}" if share else "")
                )
            elif share and ratio > 0:
                over_floor.append(f"{share}; the {label} target is still attainable (floor {floor_text})")
            else:
                attainable.append(f"{pool} {target} is above its floor ({floor_text})")
    if unattainable:
        return _condition(
            "SLAAttainable",
            False,
            "TargetUnattainable",
            "; ".join(unattainable) + ". The floor is the latency no replica count removes: raise the target or use"
            " faster hardware; adding replicas cannot help",
        )
    if over_floor:
        return _condition("SLAAttainable", True, "RequestsOverFloor", "; ".join(over_floor))
    if attainable:
        return _condition("SLAAttainable", True, "Attainable", "; ".join(attainable))
    return {
        "type": "SLAAttainable",
        "status": "Unknown",
        "reason": "NotMeasured",
        "message": "no latency floor: the autoscaler computes it for autoscaled pools with traffic whose model and"
        " gpuProduct match a performance-model preset",
    }


def plan_reconcile(
    *,
    pdd: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]],
    children: Sequence[ChildState],
    pods: Sequence[PodState],
    pdb_api_version: str,
    operator_image: str,
    now: str,
    admin_clients: AdminClients = AdminClients(),
    router_view_conflict: str | None = None,
) -> ReconcilePlan:
    """Decide everything one reconcile of `pdd` (a PDDeployment body as a dict) should write. `admin_clients`: who
    the router NetworkPolicy admits to the admin port; `router_view_conflict`: what the last fleet-view sync found
    routers running that the operator did not write (and replaced), or None."""
    meta = pdd["metadata"]
    old_status = dict(pdd.get("status") or {})
    generation = int(meta.get("generation") or 0)
    owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])

    spec: PDDeploymentSpec | None = None
    placement: Placement | None = None
    spec_problem = placement_problem = None
    try:
        validate_name(owner.name)
        spec = parse_spec(pdd.get("spec") or {})
        placement = plan_placement(spec, [node_info(n, spec.topology) for n in nodes], pdd_name=owner.name)
    except SpecError as exc:
        spec_problem = exc.message
    except PlacementError as exc:
        placement_problem = exc

    applies: list[dict] = []
    deletes: list[tuple[str, str]] = []
    router_view: RouterView | None = None
    fleet_record = old_status.get("fleetView")
    if spec is not None and placement is not None:
        draining = set((old_status.get("drain") or {}).get("endpoints") or [])
        fleet_view = build_fleet_view(spec, generation, pods, draining=draining, previous=fleet_record)
        fleet_record = fleet_view.record
        router_view = RouterView(fleet_view.view, spec.router.admin_port)
        desired = render_fleet(
            owner,
            spec,
            placement,
            pdb_api_version=pdb_api_version,
            operator_image=operator_image,
            admin_clients=admin_clients,
        ) + [render_router_configmap(owner, fleet_view.view)]
        running = {(c.kind, c.name): c.applied_hash for c in children}
        for obj in map(with_applied_hash, desired):
            key = (obj["kind"], obj["metadata"]["name"])
            if running.get(key) != obj["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]:
                applies.append(obj)
        wanted = {(o["kind"], o["metadata"]["name"]) for o in desired}
        deletes = sorted((c.kind, c.name) for c in children if (c.kind, c.name) not in wanted)
        cells = cell_status(placement, pods)
    else:
        cells = old_status.get("cells") or []  # what runs under the last good spec and placement
    placed = {pool: sum(int(c.get("desired") or 0) for c in cells if c.get("pool") == pool) for pool in POOLS}
    if spec is not None:
        asked = {pool: spec.pool(pool).replicas for pool in POOLS}
    elif children:  # a rejected update: the operator keeps working toward its last valid spec
        asked = {pool: int((old_status.get(pool) or {}).get("desiredReplicas") or 0) for pool in POOLS}
    else:
        asked = {pool: asked_replicas(pdd.get("spec"), pool) for pool in POOLS}
    pools = {pool: pool_status(pool, asked[pool], pods, owner.name) for pool in POOLS}

    if spec_problem is not None:
        rejected = (
            "the latest spec was rejected; the fleet keeps running its last valid spec"
            if children
            else "the spec was rejected and no earlier spec was valid, so nothing was created"
        )
        stalled = ("InvalidSpec", rejected)
    elif placement_problem is not None:
        stalled = (placement_problem.reason, placement_problem.message)
    elif placement is not None and placement.issues:
        stalled = (placement.issues[0].reason, "; ".join(issue.message for issue in placement.issues))
    else:
        stalled = ("Waiting", "waiting for replicas")
    conditions = _fleet_conditions(pools, placed, children, pods, stalled)
    conditions.append(
        _condition(
            "InvalidSpec",
            spec_problem is not None,
            "SpecError" if spec_problem else "Valid",
            spec_problem or "spec is valid",
        )
    )
    if placement_problem is not None:
        conditions.append(
            _condition(
                "Degraded",
                True,
                placement_problem.reason,
                placement_problem.message + " (running replicas are left as they are)",
            )
        )
    elif spec_problem is not None:
        conditions.append(_condition("Degraded", True, "SpecRejected", stalled[1]))
    elif router_view_conflict is not None:
        conditions.append(_condition("Degraded", True, "RouterViewTampered", router_view_conflict))
    elif placement is not None and placement.issues:
        conditions.append(
            _condition(
                "Degraded", True, placement.issues[0].reason, "; ".join(issue.message for issue in placement.issues)
            )
        )
    else:
        conditions.append(_condition("Degraded", False, "AsPlanned", "placement satisfied"))
    metrics = (old_status.get("autoscaler") or {}).get("metrics")
    if metrics:  # the autoscaler reports what it saw; conditions have one writer, this function
        conditions.append(
            _condition(
                "MetricsAvailable",
                bool(metrics.get("available")),
                metrics.get("reason", ""),
                metrics.get("message", ""),
            )
        )

    previous = {c.get("type"): c for c in old_status.get("conditions") or []}
    conditions.append(sla_condition(spec, old_status.get("autoscaler") or {}))
    conditions.append(attainable_condition(spec, old_status.get("autoscaler") or {}))
    serves = router_serves_condition(spec, previous.get("RouterServes"))
    if serves is not None:
        conditions.append(serves)
        if serves["status"] == "False" and conditions[0]["status"] == "True":  # conditions[0] is Ready
            conditions[0] = _condition("Ready", False, serves["reason"], "pods are ready, but " + serves["message"])
    previous_unknown = previous.get("UnknownFields")
    unknown = unknown_fields_condition(applied_unknown_fields(meta, pdd.get("spec")), previous_unknown)
    if unknown is not None:
        conditions.append(unknown)

    merged, changed = merge_conditions(old_status.get("conditions") or [], conditions, now)
    if (
        unknown is not None
        and unknown["status"] == "True"
        and previous_unknown is not None
        and previous_unknown.get("status") == "True"
        and previous_unknown.get("message") != unknown["message"]
    ):
        changed.append(unknown)  # other fields than before: say so again
    warn_on = {
        ("InvalidSpec", "True"),
        ("Degraded", "True"),
        ("Ready", "False"),
        ("MetricsAvailable", "False"),
        ("UnknownFields", "True"),
        ("SLAMet", "False"),
        ("SLAAttainable", "False"),
        ("RouterServes", "False"),
    }
    events = tuple(
        Event(
            "Warning" if (c["type"], c["status"]) in warn_on else "Normal", c["reason"], f"{c['type']}: {c['message']}"
        )
        for c in changed
        if old_status.get("conditions") is not None or (c["type"], c["status"]) in warn_on
    )
    status = {**old_status, "observedGeneration": generation, **pools, "cells": cells, "conditions": merged}
    if spec is not None:
        status["model"] = spec.model.served_name
        status["routerUrl"] = f"http://{router_name(owner.name)}.{owner.namespace}.svc:{spec.router.port}"
    if fleet_record:
        status["fleetView"] = fleet_record
    return ReconcilePlan(
        applies=tuple(applies), deletes=tuple(deletes), status=status, events=events, router_view=router_view
    )


def status_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The top-level status keys that differ (a merge patch); empty when nothing changed."""
    return {k: v for k, v in new.items() if old.get(k) != v}
