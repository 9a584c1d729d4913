"""One autoscaler interval for one PDDeployment, as a pure function: readings in, replica writes and status out.

Scale-up is written at once. Scale-down is drain-safe: the pods the shrink will remove (a StatefulSet drops its highest
ordinals, and `distribute_replicas` shrinks cells newest-first) are first listed in `status.drain`, which the reconcile
turns into `draining: true` in the router's fleet view; the replicas are lowered only once every router reports those
pods drained (no in-flight requests) or the drain timeout passed. One pool drains at a time; if the load comes back
during a drain, the drain is cancelled and nothing was removed.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pdfleet import POOLS
from pdfleet.api.model import PDDeploymentSpec
from pdfleet.autoscale.config import policy_config_from_spec
from pdfleet.autoscale.drain import drain_progress, pods_removed
from pdfleet.autoscale.fleet_decision import FleetDecision, decide_fleet
from pdfleet.autoscale.policy import PoolScalerState, fresh_state
from pdfleet.autoscale.signals import MetricsUnavailable, PoolReading, complete_reading
from pdfleet.cluster.events import Event
from pdfleet.topology.inventory import NodeInfo
from pdfleet.topology.placement import PlacementError, plan_placement


@dataclass(frozen=True)
class AutoscaleStep:
    replicas: dict[str, int]  # spec.<pool>.replicas to write now (only pools that change)
    status: dict[str, Any]  # new values of status.autoscaler and status.drain (drain None clears it)
    events: tuple[Event, ...]
    states: dict[str, PoolScalerState]
    decision: FleetDecision


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def metrics_report(readings: Mapping[str, PoolReading], enabled: Sequence[str]) -> dict[str, Any]:
    """status.autoscaler.metrics: available, or the first reason an enabled pool has no (complete) data, each distinct
    problem with its pool, and per pool the signals that are missing."""
    unavailable = [complete_reading(readings[p]) for p in enabled]
    unavailable = [r for r in unavailable if isinstance(r, MetricsUnavailable)]
    if not unavailable:
        return {"available": True, "reason": "MetricsFresh", "message": "all autoscaled pools have fresh metrics"}
    reason = "".join(word.capitalize() for word in unavailable[0].reason.split("_"))
    problems: dict[str, str] = {}  # message -> the first pool with it (one fetch failure reads alike for all pools)
    for reading in unavailable:
        problems.setdefault(reading.message, reading.pool)
    report: dict[str, Any] = {
        "available": False,
        "reason": f"Metrics{reason}",
        "message": "; ".join(f"{pool}: {message}" for message, pool in problems.items()) + "; holding current replicas",
    }
    missing = {r.pool: list(r.missing) for r in unavailable if r.missing}
    if missing:
        report["missing"] = missing
    return report


def drained_pods(spec: PDDeploymentSpec, nodes: Sequence[NodeInfo], pdd_name: str, pool: str, target: int) -> list[str]:
    """Names of the pods that shrinking `pool` to `target` replicas removes (same placement rule as the reconcile)."""
    try:
        before = plan_placement(spec, list(nodes), pdd_name=pdd_name)
        after = plan_placement(spec, list(nodes), pdd_name=pdd_name, replicas={pool: target})
    except PlacementError:
        return []
    return pods_removed(
        {c.name: c.replicas for c in before.pool_cells(pool)}, {c.name: c.replicas for c in after.pool_cells(pool)}
    )


def _signals_for_status(signals: Mapping[str, float]) -> dict[str, float]:
    # Three significant digits: enough to explain a decision, and the status stops changing on noise.
    return {k: float(f"{v:.3g}") for k, v in sorted(signals.items())}


def plan_autoscale(
    *,
    spec: PDDeploymentSpec,
    pdd_name: str,
    status: Mapping[str, Any],
    nodes: Sequence[NodeInfo],
    readings: Mapping[str, PoolReading],
    states: Mapping[str, PoolScalerState],
    router_views: Sequence[Sequence[Mapping[str, Any]] | None],
    now: float,
) -> AutoscaleStep:
    """Decide one interval: which replicas to write, the drain to start/continue/finish/cancel, what to report."""
    config = policy_config_from_spec(spec)
    current = {pool: spec.pool(pool).replicas for pool in POOLS}
    states = {pool: states.get(pool) or fresh_state(current[pool], now) for pool in POOLS}
    # a pool with missing signals holds: no decision on half a reading
    complete = {pool: complete_reading(reading) for pool, reading in readings.items()}
    decision = decide_fleet(config, current, complete, states, now)
    previous = status.get("autoscaler") or {}
    drain = status.get("drain")
    replicas: dict[str, int] = {}
    events: list[Event] = []
    scaled: set[str] = set()

    if drain:
        pool = drain["pool"]
        progress = drain_progress(
            router_views, drain["endpoints"], epoch(drain["startedAt"]), now, config.drain_timeout_s
        )
        if decision.decisions[pool].desired >= current[pool]:
            events.append(
                Event("Normal", "DrainCancelled", f"{pool} stays at {current[pool]}: {decision.decisions[pool].cause}")
            )
            drain = None
        elif progress.done:
            replicas[pool] = drain["targetReplicas"]
            scaled.add(pool)
            events.append(
                Event(
                    "Normal",
                    "ScaledDown",
                    f"{pool} {current[pool]}\u2192{drain['targetReplicas']}: "
                    f"{drain.get('cause', '')} ({progress.reason})",
                )
            )
            drain = None

    for pool in POOLS:
        chosen = decision.decisions[pool]
        if pool in scaled or chosen.desired == current[pool]:
            continue
        if chosen.desired > current[pool]:
            replicas[pool] = chosen.desired
            scaled.add(pool)
            if drain and drain["pool"] == pool:
                drain = None
            events.append(Event("Normal", "ScaledUp", chosen.reason))
        elif drain is None:
            endpoints = drained_pods(spec, nodes, pdd_name, pool, chosen.desired)
            if endpoints:
                drain = {
                    "pool": pool,
                    "targetReplicas": chosen.desired,
                    "endpoints": endpoints,
                    "startedAt": iso(now),
                    "cause": chosen.cause,
                }
                events.append(
                    Event("Normal", "DrainStarted", f"{chosen.reason}; draining {', '.join(endpoints)} first")
                )
            else:
                replicas[pool] = chosen.desired
                scaled.add(pool)
                events.append(Event("Normal", "ScaledDown", chosen.reason))

    enabled = [pool for pool in POOLS if spec.pool(pool).autoscaling.enabled]
    # a pool at zero replicas reports nothing, and is decided without its own metrics (the prefill pool, from the
    # decodes': `direct_serving_estimate`)
    measured = [pool for pool in enabled if current[pool] > 0]
    report: dict[str, Any] = {"metrics": metrics_report(readings, measured)}
    for pool in enabled:
        chosen = decision.decisions[pool]
        before = previous.get(pool) or {}
        # an unattainable target is reported through its signals: the reconcile's SLAAttainable condition turns them
        # into the Warning Event (one writer of that Event, on the condition's transition)
        report[pool] = {
            "desiredReplicas": chosen.desired,
            "drivingSignal": chosen.driving_signal,
            "signals": _signals_for_status(chosen.signals),
            "lastScaleTime": iso(now) if pool in scaled else before.get("lastScaleTime"),
        }
    return AutoscaleStep(
        replicas=replicas,
        status={"autoscaler": report, "drain": drain},
        events=tuple(events),
        states=dict(decision.states),
        decision=decision,
    )
